"""Files in the user's cluster directory, over SFTP: upload, download (a job's outputs
and logs), ls and cat. Paths given by the user are
relative to that directory and may not climb out of it."""

from __future__ import annotations

import posixpath
import stat
from pathlib import Path

import paramiko

from tcloud.errors import TcloudError

FILES = "files"


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


def upload(sftp: paramiko.SFTPClient, userdir: str, local: Path, remote: str | None) -> int:
    """Copy a local file or tree to <userdir>/files/<remote or its name>; return files sent."""
    if not local.exists():
        raise TcloudError(f"{local} does not exist")
    target = inside(userdir_path(sftp, userdir), posixpath.join(FILES, remote or local.name))
    sources = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
    for source in sources:
        relative = "" if local.is_file() else source.relative_to(local).as_posix()
        destination = posixpath.join(target, relative) if relative else target
        ensure_dir(sftp, posixpath.dirname(destination))
        sftp.put(str(source), destination)
        sftp.chmod(destination, 0o600)
    return len(sources)


def download_tree(sftp: paramiko.SFTPClient, remote: str, local: Path) -> int:
    count = 0
    local.mkdir(parents=True, exist_ok=True)
    for entry in sftp.listdir_attr(remote):
        source = posixpath.join(remote, entry.filename)
        if stat.S_ISDIR(entry.st_mode):
            count += download_tree(sftp, source, local / entry.filename)
        elif stat.S_ISREG(entry.st_mode):
            sftp.get(source, str(local / entry.filename))
            count += 1
    return count


def download(sftp: paramiko.SFTPClient, workdir: str, dest: Path) -> int:
    """A job's outputs/ and logs/ into dest/; return files fetched."""
    total = 0
    for part in ("outputs", "logs"):
        try:
            total += download_tree(sftp, posixpath.join(workdir, part), dest / part)
        except FileNotFoundError:
            continue
    return total


def ls(sftp: paramiko.SFTPClient, userdir: str, relative: str) -> list[dict]:
    path = inside(userdir_path(sftp, userdir), relative)
    try:
        entries = sftp.listdir_attr(path)
    except FileNotFoundError:
        raise TcloudError(f"{relative or '.'}: no such file or directory") from None
    return [
        {
            "name": e.filename + ("/" if stat.S_ISDIR(e.st_mode) else ""),
            "size": e.st_size,
            "mode": oct(stat.S_IMODE(e.st_mode)),
        }
        for e in sorted(entries, key=lambda e: e.filename)
    ]


def cat(sftp: paramiko.SFTPClient, userdir: str, relative: str) -> bytes:
    path = inside(userdir_path(sftp, userdir), relative)
    try:
        with sftp.open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        raise TcloudError(f"{relative}: no such file") from None
