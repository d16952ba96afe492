"""The pre-baked node image `make demo` boots (opt-in: TACC_LAB_IMAGE_FLAVOR=prebaked).

It holds the Debian packages `playbooks/site.yml` installs on the lab's nodes, so the
demo's converge finds them present instead of downloading and unpacking them on four
nodes at once. The roles still install and verify them (a package missing from this
list is installed by its role, as on a bare node), and they still configure, enable and
start every daemon: the daemons only some node groups run are disabled in the image, as
they are absent on a bare node. Most of the test suite's labs boot it too
(tests/integration/labs.py); its `hw` lab and bench/converge.py boot the bare image
(image.py), which keeps proving the installs from nothing.

It is built with mmdebstrap (apt resolves and downloads in parallel, one dpkg run,
no fsync per file): debootstrap alone took 129 s for the bare image here.
This module needs only the standard library (make demo runs it with the system Python).
"""

from __future__ import annotations

import shlex
from pathlib import Path

# What the roles install on lab nodes (roles/*/vars/Debian.yml for the lab's groups and
# settings: ganesha, no chrony); tests/unit/lab/test_image_prebake.py keeps the two in step.
ROLE_PACKAGES = (
    "tzdata",  # common
    "munge",  # munge
    "netbase",  # nfs_server, nfs_client
    "nfs-common",  # nfs_client
    "rdma-core",  # rdma
    "ibverbs-utils",
    "infiniband-diags",
    "perftest",
    "ibverbs-providers",
    "pciutils",  # nvidia_gpu, smartnic_firmware
    "python3-debian",
    "mstflint",
    "slurmctld",  # slurm
    "slurmd",
    "slurm-client",
    "libpam-slurm-adopt",  # slurm_pam_adopt
    "openmpi-bin",  # mpi
    "python3-mpi4py",
    "libpmix2",
    "python3-venv",  # package_cache, tacc_agent
    "python3-packaging",
    "util-linux",
    "python3-yaml",
    "python3-setuptools",
    "python3-wheel",
    "python3-prometheus-client",
    "python3-aiohttp",  # tacc_agent: the dashboard's per-user server
    "prometheus-node-exporter",  # node_exporter (every node runs it)
    "dbus",
)
# Left to their roles: the daemons of one node (cluster_dns's dnsmasq, monitoring's
# Prometheus and Alertmanager, Slurm accounting's slurmdbd and MariaDB), which would
# otherwise run on every node of the image, and NFS-Ganesha, on the one node that runs it (4 s of
# converge there). Installed there, its package starts it before the role's restart, as
# on a bare node. Prebaked, the role started and restarted it within a second and, in
# one run, the new daemon found the old one's ports held (nspawn nodes' systemd cannot
# kill through their read-only cgroups) twice, and the server never came up. The same
# race, once, also costs bare-image converges a minute (roles/nfs_server's rescue).
LEFT_TO_ROLES = (
    "slurmdbd",
    "mariadb-server",
    "nfs-ganesha",
    "nfs-ganesha-vfs",
    "dnsmasq",
    "prometheus",
    "prometheus-alertmanager",
)

# Recommends of ROLE_PACKAGES that their roles leave out (install_recommends: false), so
# the image must too: node_exporter's prometheus-node-exporter-collectors, whose timers run
# apt, SMART, NVMe, IPMI and HCA scripts on every node (none on a bare-image node).
SKIPPED_RECOMMENDS = ("prometheus-node-exporter-collectors",)

# The common role's service accounts (roles/common/defaults: common_service_accounts),
# created before the packages that would otherwise pick other IDs (the role cannot move
# their files afterwards): (name, uid = gid, comment).
SERVICE_ACCOUNTS = (
    ("munge", 64031, "MUNGE authentication"),
    ("slurm", 64030, "Slurm workload manager"),
)

# As the role's ansible.builtin.user makes them.
ACCOUNT_OPTIONS = ("--home-dir", "/nonexistent", "--no-create-home", "--shell", "/usr/sbin/nologin")

# Daemons that package installation enables but only some nodes run (their roles enable
# and start them there), and munge, whose key the image must not carry: each is disabled
# in the image, as it would be absent (or keyless) on a bare node.
GROUP_DAEMONS = ("munge", "slurmctld", "slurmd")
SHARED_SECRETS = ("etc/munge/munge.key",)
# mmdebstrap writes its --aptopt/--dpkgopt settings into the image; the nodes do not keep them.
BUILD_ONLY_FILES = ("etc/apt/apt.conf.d/99mmdebstrap", "etc/dpkg/dpkg.cfg.d/99mmdebstrap")


def in_root(argv: list[str]) -> str:
    """A mmdebstrap hook's shell line running `argv` (each word quoted) in the image."""
    return 'chroot "$1" ' + shlex.join(argv)


def mmdebstrap_argv(
    suite: str, base_packages: tuple[str, ...], target: Path, sources: list[Path]
) -> list[str]:
    """mmdebstrap's command line: the minbase system plus `base_packages` as debootstrap
    would install them (no Recommends), then the roles' packages as Ansible's apt module
    installs them (with Recommends, but SKIPPED_RECOMMENDS), all from `sources` (the
    host's apt sources for the image's release: releases.write_node_sources)."""
    accounts = " && ".join(
        in_root(["groupadd", "--system", "--gid", str(uid), name])
        + " && "
        + in_root(
            [
                "useradd",
                "--system",
                "--uid",
                str(uid),
                "--gid",
                name,
                *ACCOUNT_OPTIONS,
                "--comment",
                comment,
                name,
            ]
        )
        for name, uid, comment in SERVICE_ACCOUNTS
    )
    # `package-` on apt-get's command line: not installed, though recommended.
    skipped = [f"{package}-" for package in SKIPPED_RECOMMENDS]
    install_roles = in_root(
        [
            "apt-get",
            "install",
            "-y",
            "-q",
            "-o",
            "APT::Install-Recommends=true",
            *ROLE_PACKAGES,
            *skipped,
        ]
    )
    disable = in_root(["systemctl", "disable", "--quiet", *GROUP_DAEMONS])
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(base_packages)}",
        "--dpkgopt=force-unsafe-io",
        "--skip=cleanup/apt/lists",
        f"--customize-hook={accounts}",
        f"--customize-hook={install_roles}",
        f"--customize-hook={disable}",
        suite,
        str(target),
        *[str(file) for file in sources],
    ]


def finish(root: Path) -> None:
    """Remove what the image must not ship: shared secrets and build-only settings, and
    the copies of the host's apt sources mmdebstrap pasted in (image.py's bake installs
    them under their own names; both would list every repository twice)."""
    for relative in SHARED_SECRETS + BUILD_ONLY_FILES:
        (root / relative).unlink(missing_ok=True)
    sources_dir = root / "etc/apt/sources.list.d"
    if sources_dir.is_dir():
        for pasted in sources_dir.iterdir():
            pasted.unlink()
