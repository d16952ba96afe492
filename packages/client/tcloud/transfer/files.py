"""Files in the user's cluster directory, over SFTP: upload, download (a job's outputs
and logs), ls and cat. Paths given by the user are relative to that directory and may
not climb out of it; they are checked before anything connects (`check_path`,
`plan_upload`). An upload lands under a temporary name and is renamed into place, so a
failed one leaves no partial file; a download never writes outside its directory nor
through a symlink there."""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
from dataclasses import dataclass
from pathlib import Path

import paramiko

from tcloud.errors import TcloudError, UsageError
from tcloud.transfer.manifest import UNLIMITED, Collector, is_utf8, shown

FILES = "files"
PARTIAL = ".tcloud-partial"


def check_path(relative: str, what: str = "path") -> str:
    """A path in the user's cluster directory as typed: relative, no '..', UTF-8. Refused
    with exit 4, as tcloud always refused paths outside that directory."""
    if "\0" in relative or not is_utf8(relative):
        raise TcloudError(f"{what} {shown(relative)!r} is not UTF-8 text")
    if relative.startswith(("/", "~")) or ".." in relative.split("/"):
        raise TcloudError(
            f"{what} {relative!r} is outside your cluster directory: give a path relative "
            "to it, without '..'"
        )
    return relative


@dataclass(frozen=True)
class UploadPlan:
    name: str  # under files/
    files: list[tuple[Path, str]]  # (local source, path below name; "" for one file)


def plan_upload(local: Path, remote: str | None) -> UploadPlan:
    """What `tcloud upload LOCAL [NAME]` sends; UsageError (before any connection) for a
    missing path, a bad NAME, a symlink out of the directory, a name that is not UTF-8."""
    if not local.exists():
        raise UsageError(f"{shown(local)} does not exist")
    name = check_path(remote or local.name, "NAME")  # "" (for "."): straight into files/
    if local.is_file():
        return UploadPlan(name, [(local, "")])
    if not local.is_dir():
        raise UsageError(f"{shown(local)} is not a regular file or directory")
    collector = Collector(lambda *_: "", UNLIMITED, "none", remedy="move it out of the directory")
    entries = collector.collect(local.resolve(), "", ["**"], [], "upload")
    if collector.problems:
        raise UsageError("\n".join(str(p) for p in collector.problems[:20]))
    return UploadPlan(name, [(entry.source, path) for path, entry in entries.items()])


def userdir_path(sftp: paramiko.SFTPClient, userdir: str) -> str:
    if userdir.startswith("~/"):
        return posixpath.join(sftp.normalize("."), userdir[2:])
    return userdir


def inside(base: str, relative: str) -> str:
    """base/relative, refusing absolute paths and '..' that would leave base."""
    joined = posixpath.normpath(posixpath.join(base, relative or "."))
    if joined != base and not joined.startswith(base.rstrip("/") + "/"):
        raise TcloudError(f"{relative!r} is outside your cluster directory")
    return joined


def ensure_dir(sftp: paramiko.SFTPClient, path: str) -> None:
    parts = []
    while True:
        try:
            sftp.stat(path)
            break
        except FileNotFoundError:
            parts.append(path)
            path = posixpath.dirname(path)
    for missing in reversed(parts):
        sftp.mkdir(missing, mode=0o700)


def put(sftp: paramiko.SFTPClient, source: Path, destination: str) -> None:
    """source to destination through a temporary name: all of it or nothing."""
    partial = posixpath.join(
        posixpath.dirname(destination), f".{posixpath.basename(destination)}{PARTIAL}"
    )
    try:
        sftp.put(str(source), partial)
        sftp.chmod(partial, 0o600)
        try:
            sftp.posix_rename(partial, destination)
        except OSError:  # a server without posix-rename: replace by hand
            with contextlib.suppress(OSError):
                sftp.remove(destination)
            sftp.rename(partial, destination)
    except BaseException:
        with contextlib.suppress(Exception):
            sftp.remove(partial)
        raise


def upload(sftp: paramiko.SFTPClient, userdir: str, local: Path, remote: str | None) -> int:
    """Copy a local file or tree to <userdir>/files/<remote or its name>; return files sent."""
    plan = plan_upload(local, remote)
    target = inside(userdir_path(sftp, userdir), posixpath.join(FILES, plan.name))
    for source, relative in plan.files:
        destination = posixpath.join(target, relative) if relative else target
        ensure_dir(sftp, posixpath.dirname(destination))
        try:
            put(sftp, source, destination)
        except (OSError, paramiko.SSHException) as exc:
            raise TcloudError(f"upload of {shown(source)} failed: {exc}") from None
    return len(plan.files)


def is_plain_name(name: object) -> bool:
    """One path component: text, not empty, not . or .., no slash and no NUL."""
    return isinstance(name, str) and name not in ("", ".", "..") and not {"/", "\0"} & set(name)


def local_target(local: Path, name: str, remote: str) -> Path:
    """local/name for a name the cluster listed: one plain component, and no symlink
    there to write through."""
    if not is_plain_name(name):
        raise TcloudError(f"refusing the file name {name!r} listed in {remote} (not a plain name)")
    target = local / name
    if target.is_symlink():
        raise TcloudError(
            f"{shown(target)} is a symlink; refusing to write through it (download into an "
            "empty directory)"
        )
    return target


def download_tree(sftp: paramiko.SFTPClient, remote: str, local: Path) -> int:
    count = 0
    try:
        entries = sftp.listdir_attr(remote)
    except UnicodeDecodeError:
        raise TcloudError(
            f"{remote} holds a file name that is not UTF-8; rename it on the cluster"
        ) from None
    local.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        source = posixpath.join(remote, entry.filename)
        target = local_target(local, entry.filename, remote)
        if stat.S_ISDIR(entry.st_mode):
            count += download_tree(sftp, source, target)
        elif stat.S_ISREG(entry.st_mode):  # symlinks are not followed
            partial = target.with_name(f".{target.name}{PARTIAL}")
            try:
                sftp.get(source, str(partial))
                os.replace(partial, target)
            except (OSError, paramiko.SSHException) as exc:
                raise TcloudError(f"download of {source} failed: {exc}") from None
            finally:
                with contextlib.suppress(OSError):  # gone, or not ours to remove
                    partial.unlink()
            count += 1
    return count


def download(sftp: paramiko.SFTPClient, workdir: str, dest: Path) -> int:
    """A job's outputs/ and logs/ into dest/; return files fetched."""
    total = 0
    for part in ("outputs", "logs"):
        try:
            target = local_target(dest, part, "the download")  # not through a symlink
            total += download_tree(sftp, posixpath.join(workdir, part), target)
        except FileNotFoundError:
            continue
    return total


def download_job(sftp: paramiko.SFTPClient, info: dict, dest: Path) -> int:
    """What `tcloud download` fetches for the job `status` describes: its outputs/ and
    logs/, or for a whole sweep each trial's, into dest/trials/<i>/."""
    if not info.get("sweep"):
        return download(sftp, info["workdir"], dest)
    total = 0
    trials = info.get("trials")
    if not isinstance(trials, list):
        raise TcloudError("refusing the cluster's answer: a sweep without its list of trials")
    names = [trial_name(trial) for trial in trials]  # all checked before anything is written
    for name in names:
        total += download(
            sftp, posixpath.join(info["workdir"], "trials", name), trial_target(dest, name)
        )
    return total


def best_trial(info: dict) -> dict:
    """The entry of the sweep's best trial (`status` names it), or a UsageError saying
    why there is none."""
    if not info.get("sweep"):
        raise UsageError(f"--best: job {info.get('job_id')} is not a sweep")
    best = info.get("best")
    found = [t for t in info.get("trials") or [] if isinstance(t, dict) and t.get("job_id") == best]
    if not best or not found:
        raise UsageError(
            f"--best: no trial of sweep {info.get('job_id')} has reported its metric at a rung "
            "yet (sweep.adaptive, tacc_fluid.report); download the sweep, or a trial by its id"
        )
    return found[0]


def download_best(sftp: paramiko.SFTPClient, info: dict, dest: Path) -> tuple[int, dict]:
    """The best trial's outputs/ and logs/ into dest/ (files fetched, its entry)."""
    trial = best_trial(info)
    name = trial_name(trial)
    return download(sftp, posixpath.join(info["workdir"], "trials", name), dest), trial


def trial_name(trial: object) -> str:
    """A trial's name as the cluster sent it: one plain path component, else refused."""
    index = trial.get("trial") if isinstance(trial, dict) else None
    name = str(index) if isinstance(index, int) else index
    if not is_plain_name(name):
        raise TcloudError(
            f"refusing the trial name {name!r} the cluster sent (not a plain name: one path "
            "component, no NUL, not . or ..)"
        )
    return name


def trial_target(dest: Path, index: str) -> Path:
    """dest/trials/<index>, with nothing on the way a symlink and the result under dest."""
    target = local_target(local_target(dest, "trials", "the download"), index, "the trials")
    if not target.resolve().is_relative_to(dest.resolve()):
        raise TcloudError(f"refusing to write {shown(target)}: it is outside {shown(dest)}")
    return target


def ls(sftp: paramiko.SFTPClient, userdir: str, relative: str) -> list[dict]:
    path = inside(userdir_path(sftp, userdir), check_path(relative))
    try:
        entries = sftp.listdir_attr(path)
    except FileNotFoundError:
        raise TcloudError(f"{relative or '.'}: no such file or directory") from None
    except UnicodeDecodeError:
        raise TcloudError(f"{relative or '.'}: holds a file name that is not UTF-8") from None
    return [
        {
            "name": e.filename + ("/" if stat.S_ISDIR(e.st_mode) else ""),
            "size": e.st_size,
            "mode": oct(stat.S_IMODE(e.st_mode)),
        }
        for e in sorted(entries, key=lambda e: e.filename)
    ]


def cat(sftp: paramiko.SFTPClient, userdir: str, relative: str) -> bytes:
    path = inside(userdir_path(sftp, userdir), check_path(relative))
    try:
        with sftp.open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise TcloudError(f"{relative}: no such file") from None
