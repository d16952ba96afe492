"""The lab's container base image (`tacc-lab up --container-image`), built on this host.

No outside registry is reachable, so the lab makes its own image: mmdebstrap (minbase
bookworm + Python, NumPy, mpi4py and Open MPI, from this host's apt sources under
bookworm's suite names, so a Debian 13 host builds it too: releases.node_sources) writes a
tar of the root filesystem; device nodes are filtered out (a rootless `umoci unpack`
cannot create them, and `ch-run` binds the host's /dev anyway); umoci turns that tar
into one layer of an OCI image with a config whose Env sets PATH; skopeo writes the
image as an OCI archive. The image_registry role pushes that archive into the lab's
registry as tacc/base:bookworm (roles/image_registry, `image_registry_seed`).

The archive is cached under OCI_CACHE, named by a digest of everything that decides its
contents (suite, package list, the build's commands and settings), so it is built once
per machine and package list and shared by every lab; a build is written next to its
final name and renamed into place, so an interrupted one leaves nothing that looks
finished (its scratch directory is removed by the next build, under the build lock, once
a day old). After a build the archive before it is kept (a lab may still be copying it
into its registry); older ones are removed. A lab whose kept archive is not the current
build's builds again (lab.py).
"""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tacc_lab.config import OCI_CACHE
from tacc_lab.errors import LabError
from tacc_lab.prereqs import CONTAINER_IMAGE_COMMANDS, missing_commands
from tacc_lab.releases import BOOKWORM, write_node_sources
from tacc_lab.runner import run
from tacc_lab.state import locked

SUITE = BOOKWORM.codename
# What tasks in the lab's image need: Python, NumPy, MPI for Python and Open MPI (whose
# libopenmpi3 brings PMIx for `srun --mpi=pmix`).
PACKAGES = ("python3", "python3-numpy", "python3-mpi4py", "openmpi-bin", "libpmix2")
# Kept small: no documentation, manual pages or translations (the copyright files stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
# ch-run binds the host's /etc/hosts and /etc/resolv.conf onto these; minbase has no
# /etc/hosts of its own.
BIND_TARGETS = ("/etc/hosts", "/etc/resolv.conf")
IMAGE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Where the lab's registry serves it (roles/image_registry pushes it under this name).
SEED_NAME = f"tacc/base:{SUITE}"
TAG = SUITE
# The node is Debian 12 too, so its /etc/os-release cannot tell a container from the node:
# this file, only in the image, can (tests print it from inside the container).
MARKER_FILE = "/etc/tacc-image"
# Bumped when the build changes in a way the inputs above do not show.
BUILD_FORMAT = 2


@dataclass(frozen=True)
class OciImage:
    """A built archive, and how long the build took (None: it was already cached)."""

    archive: Path
    seed_name: str
    build_seconds: float | None


def build_key(
    suite: str = SUITE,
    packages: tuple[str, ...] = PACKAGES,
    dpkg_options: tuple[str, ...] = DPKG_OPTIONS,
) -> str:
    """Digest of what decides the image's contents (not the time it was built)."""
    inputs = {
        "format": BUILD_FORMAT,
        "suite": suite,
        "packages": sorted(packages),
        "dpkg_options": list(dpkg_options),
        "bind_targets": list(BIND_TARGETS),
        "path": IMAGE_PATH,
        "marker": [MARKER_FILE, SEED_NAME],
        "filter": FILTER_ARGV,
        # The commands' words (paths are placeholders: where a build runs is not content).
        "umoci": umoci_argvs(Path("LAYOUT"), Path("LAYER")),
        "archive": skopeo_archive_argv(Path("LAYOUT"), Path("ARCHIVE")),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def archive_path(cache: Path = OCI_CACHE, key: str | None = None) -> Path:
    return cache / f"base-{SUITE}-{(key or build_key())[:16]}.oci.tar"


def mmdebstrap_argv(sources: list[Path]) -> list[str]:
    """mmdebstrap writing the root filesystem as a tar on its standard output."""
    touch = " && ".join(f'touch "$1{target}"' for target in BIND_TARGETS)
    marker = f'echo {shlex.quote(SEED_NAME)} > "$1{MARKER_FILE}"'

    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=minbase",
        "--format=tar",
        "--quiet",
        f"--include={','.join(PACKAGES)}",
        "--dpkgopt=force-unsafe-io",
        *[f"--dpkgopt={option}" for option in DPKG_OPTIONS],
        f"--customize-hook={touch} && {marker}",
        SUITE,
        "-",
        *[str(source) for source in sources],
    ]


FILTER_ARGV = ["mmtarfilter", "--path-exclude=/dev/*"]


def umoci_argvs(layout: Path, layer: Path) -> list[list[str]]:
    """umoci: an OCI layout with one image `TAG` of one layer and its runtime config."""
    image = f"{layout}:{TAG}"
    return [
        ["umoci", "init", "--layout", str(layout)],
        ["umoci", "new", "--image", image],
        [
            "umoci",
            "raw",
            "add-layer",
            "--image",
            image,
            "--history.created_by",
            "tacc-lab oci_image (mmdebstrap)",
            str(layer),
        ],
        [
            "umoci",
            "config",
            "--image",
            image,
            "--config.env",
            f"PATH={IMAGE_PATH}",
            "--config.cmd",
            "/bin/bash",
            "--config.workingdir",
            "/",
            "--author",
            "tacc-lab",
        ],
        ["umoci", "gc", "--layout", str(layout)],
    ]


def skopeo_archive_argv(layout: Path, archive: Path) -> list[str]:
    return ["skopeo", "copy", "--quiet", f"oci:{layout}:{TAG}", f"oci-archive:{archive}:{TAG}"]


BUILD_LOCK = ".build.lock"
# A build's scratch directory older than this is a killed build's (a build takes minutes).
SCRATCH_MAX_AGE = 24 * 3600


def _remove_leftovers(cache: Path, archive: Path, now: float | None = None) -> None:
    """Under the build lock: killed builds' scratch directories (a day old), and archives
    of earlier builds but the newest of them (a lab may be copying that one)."""
    now = time.time() if now is None else now
    for scratch in cache.glob(".build-*"):
        if scratch.is_dir() and now - scratch.stat().st_mtime > SCRATCH_MAX_AGE:
            shutil.rmtree(scratch, ignore_errors=True)
    earlier = [stale for stale in cache.glob(f"base-{SUITE}-*.oci.tar") if stale != archive]
    earlier.sort(key=lambda stale: stale.stat().st_mtime, reverse=True)
    for stale in earlier[1:]:
        stale.unlink(missing_ok=True)


def _write_layer(sources: list[Path], layer: Path) -> None:
    """mmdebstrap | mmtarfilter > layer (no shell: two processes joined by a pipe)."""
    with open(layer, "wb") as out:
        build = subprocess.Popen(mmdebstrap_argv(sources), stdout=subprocess.PIPE)
        filtered = subprocess.run(FILTER_ARGV, stdin=build.stdout, stdout=out, check=False)
        if build.stdout is not None:
            build.stdout.close()  # mmtarfilter holds the pipe now
        built = build.wait()
    if built != 0 or filtered.returncode != 0:
        raise LabError(
            f"building the lab's container image failed (mmdebstrap exit {built}, "
            f"mmtarfilter exit {filtered.returncode}); see the messages above"
        )


def ensure_oci_image(cache: Path = OCI_CACHE, log=print) -> OciImage:
    """The cached OCI archive of the lab's base image, built first if missing."""
    archive = archive_path(cache)
    if archive.is_file():
        return OciImage(archive, SEED_NAME, None)
    missing = missing_commands(commands=CONTAINER_IMAGE_COMMANDS)
    if missing:
        raise LabError(
            f"--container-image needs {', '.join(sorted(missing))}; install them with: "
            f"apt-get install {' '.join(sorted(set(missing.values())))}"
        )
    # One build at a time per machine (two labs coming up at once share one build).
    with locked(cache, BUILD_LOCK):
        if archive.is_file():  # built by a lab that held the lock before us
            return OciImage(archive, SEED_NAME, None)
        _remove_leftovers(cache, archive)
        log(f"building the lab's container image {SEED_NAME} (once per machine) ...")
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=cache, prefix=".build-") as scratch:
            work = Path(scratch)
            layer = work / "rootfs.tar"
            _write_layer(write_node_sources(BOOKWORM, work / "sources"), layer)
            layout = work / "layout"
            for argv in umoci_argvs(layout, layer):
                run(argv)
            layer.unlink()
            partial = work / archive.name
            run(skopeo_archive_argv(layout, partial))
            partial.chmod(0o644)
            partial.rename(archive)
        _remove_leftovers(cache, archive)
        return OciImage(archive, SEED_NAME, time.monotonic() - start)
