"""Build (once) and cache the Debian node images, one per release (releases.py).

The image is keyed by a digest of everything that goes into it (package list, recipe
version, the host's apt sources and locally added CA certificates), so a change in any
of them builds a new image and an unchanged host reuses the cached one.

Two flavors: `bare` (the default: what `tacc-lab up`, the bench and the test suite's
install-from-nothing lab boot, so converges prove the roles' installs from nothing) and
`prebaked` (TACC_LAB_IMAGE_FLAVOR: the bare image plus the packages the roles install,
prebake.py; `make demo`, molecule's scenarios and the test suite's other labs boot it).
The nodes `up` adds to a running lab boot its image, or, when TACC_LAB_IMAGE_FLAVOR is
set, that flavor's (lab.py: the running nodes keep theirs).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import time
from pathlib import Path

from tacc_lab.apt_sources import debian_mirror
from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.prebake import ROLE_PACKAGES, finish, mmdebstrap_argv
from tacc_lab.releases import DEFAULT, Release, node_sources, requested_release, write_node_sources
from tacc_lab.runner import run
from tacc_lab.state import locked

RECIPE_VERSION = "2"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",  # ansible.builtin.apt needs it on the target
    "iproute2",
    "sudo",
    "ca-certificates",
    "procps",  # ps/pgrep for health checks and testinfra
)
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
COMPLETE_MARK = ".tacc-lab-image-complete"
FLAVOR_ENV = "TACC_LAB_IMAGE_FLAVOR"
BARE = "bare"
PREBAKED = "prebaked"
FLAVORS = (BARE, PREBAKED)
PREBAKE_RECIPE_VERSION = "5"  # 5: without SKIPPED_RECOMMENDS


def image_flavor(environ: dict[str, str] | None = None) -> str:
    """The flavor TACC_LAB_IMAGE_FLAVOR asks for; bare when unset."""
    value = (os.environ if environ is None else environ).get(FLAVOR_ENV) or BARE
    if value not in FLAVORS:
        raise LabError(f"{FLAVOR_ENV}={value!r} is not one of: {', '.join(FLAVORS)}")
    return value


def _ca_files() -> list[Path]:
    return sorted(LOCAL_CA_DIR.glob("*.crt")) if LOCAL_CA_DIR.is_dir() else []


def image_digest(flavor: str = BARE, release: Release = DEFAULT) -> str:
    suite = release.codename
    digest = hashlib.sha256(f"{suite}|{RECIPE_VERSION}|{','.join(PACKAGES)}".encode())
    if flavor == PREBAKED:
        digest.update(f"|{PREBAKED}|{PREBAKE_RECIPE_VERSION}|{','.join(ROLE_PACKAGES)}".encode())
    for name, text in node_sources(release):
        digest.update(name.encode() + b"\0" + text.encode())
    for file in _ca_files():
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def _name_prefix(flavor: str, release: Release) -> str:
    suite = release.codename
    return f"{suite}-" if flavor == BARE else f"{suite}-{flavor}-"


def image_path(cfg: LabConfig, flavor: str = BARE, release: Release = DEFAULT) -> Path:
    return cfg.image_cache / f"{_name_prefix(flavor, release)}{image_digest(flavor, release)}"


def ensure_image(
    cfg: LabConfig, log=print, flavor: str | None = None, release: Release | None = None
) -> tuple[Path, float | None]:
    """Return (image dir, build seconds or None when it came from the cache). Labs that
    come up side by side (parallel test workers) wait for one build instead of racing.
    `flavor` None: the one TACC_LAB_IMAGE_FLAVOR names (bare when unset); `release`
    None: the one TACC_LAB_OS names (releases.DEFAULT when unset)."""
    flavor = flavor or image_flavor()
    release = release or requested_release() or DEFAULT
    target = image_path(cfg, flavor, release)
    if (target / COMPLETE_MARK).exists():
        return target, None
    with locked(cfg.image_cache, ".build.lock"):
        if (target / COMPLETE_MARK).exists():  # another lab built it meanwhile
            return target, None
        return target, _build(cfg, target, flavor, release, log)


def _build(cfg: LabConfig, target: Path, flavor: str, release: Release, log) -> float:
    staging = target.with_name(target.name + ".building")
    if staging.exists():
        shutil.rmtree(staging)
    log(f"building node image {target.name} (once; cached in {cfg.image_cache}) ...")
    start = time.monotonic()
    sources_dir = target.with_name(target.name + ".sources")  # mmdebstrap's mirrors
    sources = write_node_sources(release, sources_dir)
    if flavor == PREBAKED:
        run(mmdebstrap_argv(release.codename, PACKAGES, staging, sources))
        finish(staging)
    else:
        run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                release.codename,
                str(staging),
                debian_mirror(),
            ]
        )
    _bake(staging, release, keep_package_lists=flavor == PREBAKED)
    shutil.rmtree(sources_dir, ignore_errors=True)
    (staging / COMPLETE_MARK).write_text(f"{time.time()}\n")
    staging.rename(target)
    _prune_old_images(cfg, keep=target, flavor=flavor, release=release)
    return time.monotonic() - start


def _bake(root: Path, release: Release, *, keep_package_lists: bool = False) -> None:
    """Configure the image for any node: the host's sources (for `release`) and CAs, no
    shared secrets."""
    apt_dir = root / "etc/apt"
    (apt_dir / "sources.list").write_text("")
    for name, text in node_sources(release):
        in_dir = name != "sources.list"
        (apt_dir / "sources.list.d" / name if in_dir else apt_dir / name).write_text(text)
    ca_dir = root / "usr/local/share/ca-certificates"
    ca_dir.mkdir(parents=True, exist_ok=True)
    for cert in _ca_files():
        shutil.copy2(cert, ca_dir / cert.name)
    run(["chroot", str(root), "update-ca-certificates"])
    # Every node gets its own SSH host key and machine-id at boot time (see nodes.py);
    # the ones debootstrap generated would otherwise be shared by all nodes.
    for key in (root / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/10-tacc-lab.conf").write_text(
        "HostKey /etc/ssh/ssh_host_ed25519_key\nUseDNS no\n"
    )
    (root / "etc/machine-id").write_text("")
    run(["chroot", str(root), "systemctl", "enable", "systemd-networkd.service"])
    run(["chroot", str(root), "apt-get", "clean"])
    if keep_package_lists:
        # The prebaked image's lists are as fresh as its packages: the roles' apt tasks
        # (cache_valid_time) use them for an hour, then refresh them.
        return
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    lists = root / "var/lib/apt/lists"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    # The image ships no package lists: date the empty directory to the epoch so that
    # `apt update_cache` with `cache_valid_time` refreshes them on a node's first run.
    for path in (lists / "partial", lists):
        os.utime(path, (0, 0))


def _prune_old_images(
    cfg: LabConfig, keep: Path, flavor: str = BARE, release: Release = DEFAULT
) -> None:
    """Remove superseded images of `flavor` and `release` that no running node uses as
    its overlay lower layer (the other flavors' and releases' images are kept: demo and
    tests use several)."""
    mounts = Path("/proc/self/mounts").read_text()
    same_flavor = re.compile(rf"{re.escape(_name_prefix(flavor, release))}[0-9a-f]{{16}}")
    for old in cfg.image_cache.iterdir():
        if old != keep and same_flavor.fullmatch(old.name) and str(old) not in mounts:
            print(f"removing stale node image {old.name}", file=sys.stderr)
            shutil.rmtree(old, ignore_errors=True)


def main() -> int:
    """`python -m tacc_lab.image`: build the node image now (or find it cached). This module
    needs only the standard library, so `make demo` runs it with the system Python while
    the venv installs, and `tacc-lab up` then finds the image built."""
    cfg = LabConfig.create("image", "10.77.0.0/24")  # only cfg.image_cache is read
    try:
        path, seconds = ensure_image(cfg, flavor=image_flavor(), release=requested_release())
    except (LabError, OSError) as exc:
        print(f"tacc-lab image: {exc}", file=sys.stderr)
        return 1
    built = f"built in {seconds:.0f} s" if seconds is not None else "cached"
    print(f"node image {path.name}: {built}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
