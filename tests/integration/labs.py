"""The lab fixture factory: every integration module asks for its lab by shape, and each
shape is booted (and provisioned) once per run, then handed to every module that uses
it, with a reset between users instead of a fresh boot.

`MODULES` says which module runs on which shape, once: the `shaped_lab` fixture
(tests/integration/conftest.py) reads it, and so does the xdist scheduler
(tests/conftest.py), which keeps every module of one shape on one worker (pytest-xdist
3.8's xdist_group does not), so no shape is ever booted twice in a run.

Which proof each lab carries:
- every lab runs Debian 13 (trixie, Slurm 24.11: tacc-lab's default) but `bw`, the
  cross-release smoke on Debian 12 (bookworm, Slurm 22.05). TACC_LAB_OS=trixie (or
  bookworm) puts every lab on that one release instead.
- `upg` (test_release_upgrade.py, `make upgrade-test` only) starts on bookworm too and
  ends on trixie: the site move of docs/slurm-releases.md.
- `hw` converges site.yml from the BARE image: the proof that an empty machine gets
  everything from the roles (install from nothing, a killed run finished by the next,
  a second run and --check --diff change nothing).
- every lab's converges (site.yml, agent.yml), the hw lab's killed first run, the run
  that finishes it, its re-run and --check --diff included, use mitogen_linear, make
  demo's, which on this 2-core machine measured 121 CPU seconds for a re-run of the
  slurm shape instead of 324 (issue [20]'s note); their other playbooks (rolling,
  firmware, upgrade) run Ansible's default strategy (linear: ansible.cfg).
- every other lab boots the PREBAKED image `make demo` boots (prebake.py: the roles'
  packages present, still checked, configured and started by the roles), molecule's
  scenarios included (their molecule.yml).

Two kinds of lab keep their own lifecycle, outside the factory, because it is their
subject: test_lab_cluster.py's (`tacc-lab up`, grow, shrink and a `down` that leaves
nothing) and test_molecule.py's (molecule's delegated driver creates and destroys its
nodes). `OWN_LIFECYCLE` gives the scheduler their weight.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tacc_lab.image import BARE, FLAVOR_ENV, PREBAKED
from tacc_lab.releases import BOOKWORM, OS_ENV

MITOGEN = "mitogen_linear"  # plugins/strategy: one Python per node for the whole run
LINEAR = "linear"  # ansible.cfg's default


@dataclass(frozen=True)
class Shape:
    """A lab as the tests that share it need it."""

    name: str  # tacc-lab --name
    subnet: str
    nodes: int
    proof: str  # what this lab proves, printed when it boots
    login_node: bool = True
    container_image: bool = False  # the registry image and container runtime (issue [13])
    directory: bool = False  # slapd on n1, SSSD everywhere (tacc-lab up --directory; [21])
    flavor: str = PREBAKED  # BARE: the install-from-nothing proof
    provision: tuple[str, ...] = ()  # playbooks run once after the boot
    host_vars: dict = field(default_factory=dict, hash=False)
    # Run on every node before the lab passes to another module: what one user leaves
    # (jobs, files) is not seen by the next.
    reset: str = ""
    weight: int = 0  # expected minutes of its modules: the heaviest start first
    os: str = ""  # the nodes' release (tacc-lab up --os); "": tacc-lab's default

    def os_argv(self) -> list[str]:
        """`--os` for tacc-lab up: the shape's release, unless TACC_LAB_OS puts every lab
        on one."""
        return ["--os", self.os] if self.os and not os.environ.get(OS_ENV) else []

    def address(self, node: str) -> str:
        """n1 is .11, login1 .10 (tacc_lab.addressing)."""
        base = self.subnet.rsplit(".", 1)[0]
        return f"{base}.10" if node == "login1" else f"{base}.{10 + int(node[1:])}"


SLURM = Shape(
    "slurm",
    "10.77.6.0/24",
    3,
    container_image=True,
    provision=("playbooks/site.yml",),
    proof="the production shape (login node, registry image) from the prebaked image: "
    "researchers' tasks end to end, faults, adding a node",
    weight=30,
)
HW = Shape(
    "hw",
    "10.77.11.0/24",
    3,
    login_node=False,
    flavor=BARE,
    # n2's GPUs are declared in inventory (slurm.conf never comes from facts); they are
    # also offered as shards (4 per GPU by default), n2's alone. n2 is a FAKE two-socket
    # HGX: 8 GPUs, 16 cores (config_overrides: the lab's nodes share the host's CPUs),
    # GPUs 0-3 near socket 0's cores, 4-7 near socket 1's (nvidia-smi topo -m).
    host_vars={
        "n2": {
            "slurm_node_gres": ["gpu:h100:8"],
            "slurm_node_cpus": 16,
            "slurm_node_sockets": 2,
            "slurm_node_cores_per_socket": 8,
            "slurm_node_gpu_cores": ["0-7"] * 4 + ["8-15"] * 4,
            "slurm_gpu_sharing": "shard",
            "rdma_roce_tos": 106,
            "smartnic_firmware_mlxconfig": {"SRIOV_EN": "True", "NUM_OF_VFS": 8},
        }
    },
    directory=True,
    proof="install from nothing: site.yml from the bare image (site_from_nothing.py), "
    "a real LDAP directory (slapd with TLS on n1) and SSSD on every node among it; "
    "last, n4 joins (from the prebaked image) as a backup controller that takes over "
    "when n1 loses power",
    weight=22,
)
FIRMWARE = Shape(
    "fw",
    "10.77.12.0/24",
    3,
    login_node=False,
    proof="playbooks/firmware.yml against FAKE ConnectX-6 Dx devices",
    weight=3,
)
AGENT_NODE = Shape(
    "tc",
    "10.77.13.0/24",
    1,
    provision=("playbooks/agent.yml",),
    # Each module's tcloud user is root with a userdir /root/tcloud-<module>.
    reset="rm -rf /root/tcloud-*",
    proof="one node with the agent: tcloud's SSH transport against a real sshd",
    weight=8,
)

BOOKWORM_SMOKE = Shape(
    "bw",
    "10.77.14.0/24",
    2,  # its module adds n3, the second compute node its jobs need
    login_node=False,
    os=BOOKWORM.codename,
    proof="Debian 12 with Slurm 22.05 beside the Debian 13 labs: converge, a second run "
    "changing nothing, tcloud jobs on two nodes, torchrun, adding a node",
    weight=15,
)

UPGRADE = Shape(
    "upg",
    "10.77.15.0/24",
    3,
    login_node=False,
    os=BOOKWORM.codename,
    provision=("playbooks/site.yml",),
    proof="a site moved from Debian 12 (Slurm 22.05) to Debian 13 (Slurm 24.11) with "
    "playbooks/upgrade-export.yml, tacc-lab reimage, site.yml and upgrade-import.yml",
    weight=20,
)

SLURM_LAB = SLURM.name  # the cases modules test_slurm_cluster.py collects run there

# module name (tests/integration/<name>.py) -> its lab's shape
MODULES: dict[str, Shape] = {
    "test_slurm_cluster": SLURM,
    "test_hardware_roles": HW,
    "test_smartnic_firmware": FIRMWARE,
    "test_tcloud_mux": AGENT_NODE,
    "test_tcloud_upload": AGENT_NODE,
    "test_release_smoke": BOOKWORM_SMOKE,
    "test_release_upgrade": UPGRADE,
    "test_identity": HW,
    "test_directory_accounts": HW,
    "test_backup_restore": HW,
    "test_day_one": HW,
    "test_slurmctld_takeover": HW,
}
SHAPES: dict[str, Shape] = {shape.name: shape for shape in MODULES.values()}
# modules that boot and remove labs of their own -> expected minutes
OWN_LIFECYCLE = {"test_molecule": 2, "test_lab_cluster": 3}


def scope_of_nodeid(nodeid: str) -> tuple[str, int]:
    """The xdist scope of a test item and its weight (minutes; 0 when unknown): every
    module of one lab shape is one scope, so one worker boots that lab; any other
    module is a scope of its own (as --dist loadfile)."""
    path = nodeid.split("::", 1)[0]
    stem = Path(path).stem if path.startswith("tests/integration/") else ""
    if stem in MODULES:
        return f"lab:{MODULES[stem].name}", MODULES[stem].weight
    return path, OWN_LIFECYCLE.get(stem, 0)


def flavor_env(name: str) -> dict[str, str]:
    """The image flavor a lab boots (and grows) with: its shape's, else tacc-lab's
    default (bare)."""
    shape = SHAPES.get(name)
    return {FLAVOR_ENV: shape.flavor if shape else os.environ.get(FLAVOR_ENV, BARE)}


@dataclass
class Lab:
    shape: Shape
    inventory: Path

    @property
    def name(self) -> str:
        return self.shape.name


def write_vars(shape: Shape, inventory: Path) -> None:
    """host_vars/<node>.yml beside the inventory (they take precedence over the
    variables `tacc-lab up` writes into it)."""
    for node, values in shape.host_vars.items():
        (inventory.parent / "host_vars").mkdir(exist_ok=True)
        (inventory.parent / f"host_vars/{node}.yml").write_text(
            "---\n" + yaml.safe_dump(values, sort_keys=False)
        )
