"""Container images, pulled once per user and digest and reused (like envcache's venvs).

A task's image arrives pinned to its digest (tcloud resolved it at submit). The batch
step makes sure `<userdir>/images/<sha256 hex>/` holds it unpacked as a directory image
(`rootfs/`, the runtime spec `config.json` with the image's environment, and the marker
`tacc-image.json`), pulling it if no job has yet: `skopeo copy docker://REF@DIGEST
oci:TMP:img` (skopeo checks the bytes against the digest), then `umoci unpack --rootless`
(the files belong to the user: no root inside the container that is root outside). The
pull works in a private temporary directory beside the cache (same filesystem) and is
renamed into place only when complete, with the marker already in it, under a POSIX
lock (locks.POSIX, which NFS carries): concurrent jobs wait instead of pulling twice, and
a failed or interrupted pull leaves nothing a later job would mistake for ready. Each job
records the image it ran in status/image.json (`job status` answers it as "image").
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.errors import AGENT_FAILED, AgentError
from tacc_agent.tasks.execute.envcache import locked
from tacc_agent.tasks.images.registry import copy_to_layout, parsed
from tacc_agent.tasks.jobs import records
from tacc_contract.images import ImageRef

IMAGES = "images"
MARKER = "tacc-image.json"
ROOTFS = "rootfs"
SPEC = "config.json"  # the OCI runtime spec umoci writes: the image's env, cwd, user
JOB_RECORD = "image.json"  # in the job's status/
PULL_PREFIX = ".pull-"
LAYOUT_TAG = "img"
# What the marker keeps besides IMAGE's keys, for the runtimes.
MARKER_EXTRAS = ("env", "pulled_on", "built_on")

Log = Callable[[str], None]
# (pinned reference, empty private work directory, log) -> the unpacked bundle's path
# (a directory in the work directory holding rootfs/ and config.json)
Puller = Callable[[ImageRef, Path, Log], Path]


def digest_hex(ref: ImageRef) -> str:
    if not ref.digest:
        raise AgentError(f"{ref}: the image is not pinned to a digest", AGENT_FAILED)
    return ref.digest.split(":", 1)[1]


def images_dir(user_dir: Path) -> Path:
    return user_dir / IMAGES


def rootfs_at(user_dir: Path, hex_digest: str) -> Path:
    """The rootfs of the cache entry `hex_digest` (a pulled image's digest, or a built
    image's key: imagebuild keeps its results in the same place)."""
    return images_dir(user_dir) / hex_digest / ROOTFS


def ready(directory: Path) -> dict | None:
    marker = records.read_json(directory / MARKER)
    return marker if marker and (directory / ROOTFS).is_dir() else None


def remove_tree(path: Path) -> None:
    """rmtree that also removes what an unpacked image made read-only to its owner."""

    def writable_then_retry(function, name, _exc) -> None:
        with contextlib.suppress(OSError):
            parent = os.path.dirname(name)
            os.chmod(parent, os.stat(parent).st_mode | stat.S_IRWXU)
            if os.path.isdir(name) and not os.path.islink(name):
                os.chmod(name, os.stat(name).st_mode | stat.S_IRWXU)
            function(name)

    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, onerror=writable_then_retry)
        shutil.rmtree(path, ignore_errors=True)


def tree_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_size
    return total


@dataclass(frozen=True)
class SkopeoUmoci:
    """The real pull: skopeo copies the pinned image into an OCI layout, umoci unpacks it
    rootless (owned by the caller). Bounded by `timeout` seconds per tool."""

    timeout: float = 1800.0
    skopeo: str = "skopeo"
    umoci: str = "umoci"

    def __call__(self, ref: ImageRef, work: Path, log: Log) -> Path:
        layout, bundle = work / "oci", work / "bundle"
        copy_to_layout(ref, layout, LAYOUT_TAG, self.timeout, self.skopeo)
        argv = [
            self.umoci,
            "unpack",
            "--rootless",
            "--image",
            f"{layout}:{LAYOUT_TAG}",
            str(bundle),
        ]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                check=False,
                timeout=self.timeout,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            missing = f"{self.umoci} is not installed on this node (container_runtime role)"
            raise AgentError(missing, AGENT_FAILED) from None
        except subprocess.TimeoutExpired:
            raise AgentError(
                f"{ref}: unpacking took longer than {self.timeout:g} s", AGENT_FAILED
            ) from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1][-300:]
            raise AgentError(f"{ref}: umoci unpack exited {proc.returncode}: {last}", AGENT_FAILED)
        remove_tree(layout)  # the bits now live unpacked; the layout would double the space
        return bundle


def image_env(bundle: Path) -> dict[str, str]:
    """The image's own environment (its config's Env, e.g. PATH), from the runtime spec."""
    spec = records.read_json(bundle / SPEC) or {}
    pairs = (spec.get("process") or {}).get("env") or []
    return dict(item.split("=", 1) for item in pairs if isinstance(item, str) and "=" in item)


def clear_stale_pulls(images: Path, hex_digest: str) -> None:
    """What an interrupted pull of this digest left (its lock is held: none is running)."""
    for left in images.glob(f"{PULL_PREFIX}{hex_digest}-*"):
        remove_tree(left)


def pull(
    ref: ImageRef, target: Path, puller: Puller, job_id: str, log: Log, runtime: str = ""
) -> dict:
    """Pull into a private temporary directory and rename it into place, marker inside."""
    work = target.parent / f"{PULL_PREFIX}{target.name}-{os.getpid()}"
    remove_tree(work)
    work.mkdir(mode=0o700)
    start = time.monotonic()
    try:
        bundle = puller(ref, work, log)
        if not (bundle / ROOTFS).is_dir():
            raise AgentError(f"{ref}: the pull left no {ROOTFS}/", AGENT_FAILED)
        for extra in ("umoci.json",):  # umoci's repack record: not needed to run
            (bundle / extra).unlink(missing_ok=True)
        for mtree in bundle.glob("*.mtree"):
            mtree.unlink()
        marker = {
            "digest": ref.digest,
            "reference": str(ref),
            "path": str(target / ROOTFS),
            "pulled_by_job": job_id,
            "pulled_on": socket.gethostname(),
            "seconds": round(time.monotonic() - start, 2),
            "bytes": tree_bytes(bundle / ROOTFS),
            "time": time.time(),
            "env": image_env(bundle),
            **({"runtime": runtime} if runtime else {}),
        }
        records.write_json(bundle / MARKER, marker)
        bundle.chmod(0o700)
        bundle.rename(target)
    finally:
        remove_tree(work)
    return marker


def ensure(
    user_dir: Path,
    pinned: str,
    job_id: str,
    log: Log,
    lock_timeout: float,
    puller: Puller | None = None,
    runtime: str = "",
) -> dict:
    """The ready image's record (digest, reference, path of its rootfs, ...), pulling it
    if no job has yet. `pinned`: the instruction's task.image (name@sha256:...);
    `runtime`: the runtime the directory image is unpacked for (recorded)."""
    ref = parsed(pinned)
    hex_digest = digest_hex(ref)
    images = images_dir(user_dir)
    images.mkdir(mode=0o700, exist_ok=True)
    target = images / hex_digest
    short = hex_digest[:12]
    with locked(images / f"{hex_digest}.lock", lock_timeout):
        marker = ready(target)
        if marker:
            log(
                f"image {ref.repository} {short}: reused (pulled by job "
                f"{marker.get('pulled_by_job')})"
            )
            return {**marker, "path": str(target / ROOTFS)}
        clear_stale_pulls(images, hex_digest)
        if target.exists():  # a directory without its marker was never finished
            remove_tree(target)
        log(f"image {ref.repository} {short}: pulling {ref} ...")
        marker = pull(ref, target, puller or SkopeoUmoci(), job_id, log, runtime)
        mib = marker["bytes"] / 2**20
        log(
            f"image {ref.repository} {short}: pulled and unpacked in {marker['seconds']} s "
            f"({mib:.0f} MiB)"
        )
    return marker


def make_mount_points_at(
    user_dir: Path, hex_digest: str, ref: str, targets: Iterable[str], lock_timeout: float
) -> None:
    """Empty directories in the image (the cache entry `hex_digest`, named `ref` in
    errors) for bind targets it lacks (a read-only directory image cannot get them at
    run time: ch-run refuses to bind onto a missing path). Under the image's lock;
    adding empty directories does not change what a running job sees in the image."""
    rootfs = rootfs_at(user_dir, hex_digest)
    images = images_dir(user_dir)
    with locked(images / f"{hex_digest}.lock", lock_timeout):
        for target in targets:
            inside = rootfs / target.lstrip("/")
            if inside.is_symlink():
                raise AgentError(
                    f"{ref}: {target} is a symbolic link in the image; cannot bind onto it",
                    AGENT_FAILED,
                )
            try:
                inside.mkdir(mode=0o755, parents=True, exist_ok=True)
            except OSError as exc:
                raise AgentError(
                    f"{ref}: cannot make the mount point {target} in the image: {exc.strerror}",
                    AGENT_FAILED,
                ) from None


def public(marker: dict, directory: Path) -> dict:
    """IMAGE's shape: the record without the runtimes' extras."""
    record = {k: v for k, v in marker.items() if k not in MARKER_EXTRAS}
    return {**record, "path": str(directory / ROOTFS)}


def listing(user_dir: Path) -> list[dict]:
    """`image ls`: the caller's ready images, newest pull last."""
    images = images_dir(user_dir)
    if not images.is_dir():
        return []
    found = []
    for directory in sorted(images.iterdir()):
        if directory.name.startswith(".") or not directory.is_dir():
            continue
        marker = ready(directory)
        if marker:
            found.append(public(marker, directory))
    return sorted(found, key=lambda m: m.get("time") or 0)


def record_for_job(job_dir: Path, image: dict) -> None:
    records.write_json(job_dir / "status" / JOB_RECORD, image)


def job_image(job_dir: Path) -> dict | None:
    """What the job ran in (status/image.json), as `job status` answers it."""
    recorded = records.read_json(job_dir / "status" / JOB_RECORD)
    return {k: v for k, v in recorded.items() if k not in MARKER_EXTRAS} if recorded else None


def marker_at(user_dir: Path, hex_digest: str, ref: str) -> dict:
    """The ready image's marker (the cache entry `hex_digest`: a digest, or a build's
    key), for the wrappers; the batch step pulled or built it before srun."""
    directory = images_dir(user_dir) / hex_digest
    marker = ready(directory)
    if not marker:
        raise AgentError(
            f"{ref}: the image is not in the cache on this node "
            f"({directory}); the batch step pulls or builds it first",
            AGENT_FAILED,
        )
    return marker
