"""What a task uploads: the files of its code and local datasets, as a manifest of
relative path -> (sha256, size, mode). Paths are POSIX and relative, modes are reduced
to 0644/0755, so the manifest is the same on any machine for the same contents."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tcloud.errors import Problem, TaskFileError
from tcloud.schema import TaskSpec

IGNORE_FILE = ".tcloudignore"
ALWAYS_EXCLUDED = [".git/", ".tcloud/", "__pycache__/", IGNORE_FILE]


@dataclass(frozen=True)
class Entry:
    sha256: str
    size: int
    mode: int  # 0o644 or 0o755
    # Where the bytes are on this machine: for the upload only, never part of the digest.
    source: Path | None = field(default=None, compare=False, repr=False)


Hasher = Callable[[Path, os.stat_result], str]


def sha256_file(path: Path, _: os.stat_result | None = None) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_ignore_file(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    lines = (line.strip() for line in path.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def matches(relpath: str, patterns: list[str]) -> bool:
    """gitignore-like: "dir/" matches a directory anywhere on the path, a pattern with no
    slash matches any path component, otherwise the whole relative path (** allowed)."""
    parts = relpath.split("/")
    for pattern in patterns:
        if pattern.endswith("/"):
            if any(fnmatch.fnmatchcase(part, pattern[:-1]) for part in parts[:-1]):
                return True
        elif "/" not in pattern:
            if any(fnmatch.fnmatchcase(part, pattern) for part in parts):
                return True
        elif fnmatch.fnmatchcase(relpath, pattern.lstrip("/")):
            return True
    return False


def walk(root: Path) -> Iterator[tuple[str, Path]]:
    """(relative POSIX path, path) of every regular file under root, sorted."""
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_file() and not path.is_symlink():
                yield path.relative_to(root).as_posix(), path


def collect(
    root: Path, prefix: str, include: list[str], exclude: list[str], hasher: Hasher
) -> dict[str, Entry]:
    entries: dict[str, Entry] = {}
    for relpath, path in walk(root):
        if matches(relpath, exclude) or not matches(relpath, include):
            continue
        info = path.stat()
        mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        entries[prefix + relpath] = Entry(hasher(path, info), info.st_size, mode, path)
    return entries


def build_manifest(task: TaskSpec, hasher: Hasher = sha256_file) -> dict[str, Entry]:
    """code/<path> for the code directory, datasets/<name>/<path> for local datasets."""
    workdir = (task.base_dir / task.code["workdir"]).resolve()
    if not workdir.is_dir():
        raise TaskFileError(
            [Problem(str(task.base_dir), 0, 0, "code.workdir", f"{workdir} is not a directory")]
        )
    exclude = ALWAYS_EXCLUDED + list(task.code["exclude"]) + read_ignore_file(workdir)
    manifest = collect(workdir, "code/", list(task.code["include"]), exclude, hasher)
    for dataset in task.datasets:
        if dataset.local is None:
            continue
        source = (task.base_dir / dataset.local).resolve()
        prefix = f"datasets/{dataset.name}/"
        if source.is_file():
            info = source.stat()
            entry = Entry(hasher(source, info), info.st_size, 0o644, source)
            manifest[prefix + source.name] = entry
        elif source.is_dir():
            manifest.update(collect(source, prefix, ["**"], ALWAYS_EXCLUDED, hasher))
        else:
            raise TaskFileError(
                [
                    Problem(
                        str(task.base_dir),
                        0,
                        0,
                        f"datasets.{dataset.name}",
                        f"local path {source} does not exist",
                    )
                ]
            )
    return dict(sorted(manifest.items()))
