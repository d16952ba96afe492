"""What a task uploads: the files of its code and local datasets, as a manifest of
relative path -> (sha256, size, mode). Paths are POSIX and relative, modes are reduced
to 0644/0755, so the manifest is the same on any machine for the same contents.

What is refused (every problem is reported, nothing is read or sent): a symlink that
points outside the uploaded directory or nowhere, a symlink to a directory, a name that
is not UTF-8, a file larger than $TCLOUD_MAX_FILE_SIZE (2G), a file that cannot be read. A
symlink to a file inside the directory is uploaded as that file; sockets, FIFOs and
devices are skipped. Excluded paths are never looked at.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import stat
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

from tacc_contract.schema import TaskSpec, size_bytes
from tcloud.compile import local_paths
from tcloud.errors import Problem, TaskFileError, UsageError

IGNORE_FILE = ".tcloudignore"
ALWAYS_EXCLUDED = [".git/", ".tcloud/", "__pycache__/", IGNORE_FILE]
MAX_SHOWN = 20  # problems listed; the rest are counted
# The largest file a task uploads (code and local datasets): a stray checkpoint or data
# dump in the code directory is refused before it is hashed or sent.
MAX_FILE_SIZE_ENV = "TCLOUD_MAX_FILE_SIZE"
MAX_FILE_SIZE = "2G"
UNLIMITED = 1 << 62


@dataclass(frozen=True)
class Entry:
    sha256: str
    size: int
    mode: int  # 0o644 or 0o755
    # Where the bytes are on this machine: for the upload only, never part of the digest.
    source: Path | None = field(default=None, compare=False, repr=False)


Hasher = Callable[[Path, os.stat_result], str]
# Files hashed at once: hashlib and file reads release the GIL, so a first upload's
# hashing (every file read) takes about 1/n of the time on n cores (2 on the bench
# machine: 0.75 s -> 0.4 s for 1 GiB). A hasher with a known(path, info) method (the
# hash cache) answers what it remembers at once, without the pool.
HASH_THREADS = min(4, os.cpu_count() or 1)
# A smaller file is hashed at once: handing it to a thread costs more than reading it.
POOL_MIN_SIZE = 1 << 16


def sha256_file(path: Path, _: os.stat_result | None = None) -> str:
    # file_digest reads into one reused buffer: no new 1 MiB object per read (that cost
    # more than the hashing itself: 324 MiB/s for a cold 1 GiB task, hashlib alone ~1.5 GiB/s).
    with path.open("rb", buffering=0) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def shown(path: os.PathLike | str) -> str:
    """A local path for messages: bytes that are not UTF-8 appear as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def is_utf8(name: str) -> bool:
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes come back from the OS as surrogates
        return False
    return True


def human(size: int) -> str:
    if size < 1024:
        return f"{size} bytes"
    value, unit = size / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"


def max_file_size() -> tuple[int, str]:
    """($TCLOUD_MAX_FILE_SIZE or 2G) in bytes, and as written; "unlimited" lifts it."""
    text = os.environ.get(MAX_FILE_SIZE_ENV, "").strip() or MAX_FILE_SIZE
    if text.lower() == "unlimited":
        return UNLIMITED, text
    if size_bytes(text) <= 0:
        raise UsageError(
            f"{MAX_FILE_SIZE_ENV}={text!r}: expected a size like 512M or 20G, or unlimited"
        )
    return size_bytes(text), text


def read_ignore_file(root: Path) -> list[str]:
    path = root / IGNORE_FILE
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise TaskFileError([Problem(shown(path), 0, 0, "", f"cannot read: {reason}")]) from None
    lines = (line.strip() for line in text.splitlines())
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


def dir_excluded(relpath: str, patterns: list[str]) -> bool:
    """True when `matches` would exclude every path below the directory relpath."""
    parts = relpath.split("/")
    for pattern in patterns:
        if pattern.endswith("/") or "/" not in pattern:
            name = pattern.rstrip("/")
            if any(fnmatch.fnmatchcase(part, name) for part in parts):
                return True
        elif pattern.endswith("*") and fnmatch.fnmatchcase(relpath + "/", pattern.lstrip("/")):
            return True  # the final * takes whatever follows
    return False


def file_excluded(relpath: str, include: list[str], exclude: list[str]) -> bool:
    """Whether the upload leaves out this file of a tree it walks (its directories are
    pruned with dir_excluded on the way down)."""
    return matches(relpath, exclude) or not matches(relpath, include)


def code_excludes(task: TaskSpec, workdir: Path) -> list[str]:
    """What the upload leaves out of the code directory: the fixed list, code.exclude and
    the directory's .tcloudignore."""
    return ALWAYS_EXCLUDED + list(task.code["exclude"]) + read_ignore_file(workdir)


@dataclass
class Collector:
    """Walks one uploaded directory; `problems` holds what it refused."""

    hasher: Hasher
    limit: int
    limit_text: str
    pool: Executor | None = None  # hashes in the background; then `finish`
    # Entries still being hashed: (entry, its digest, path, where, problems before it).
    waiting: list[tuple[Entry, Future[str], Path, str, int]] = field(default_factory=list)
    # How to get rid of a path that is refused.
    remedy: str = "exclude it (code.exclude or .tcloudignore)"
    problems: list[Problem] = field(default_factory=list)

    def problem(self, path: Path, where: str, message: str) -> Problem:
        return Problem(shown(path), 0, 0, where, message)

    def refuse(self, path: Path, where: str, message: str) -> None:
        self.problems.append(self.problem(path, where, message))

    def symlink(self, path: Path, root: Path, where: str) -> Path | None:
        """The file a symlink stands for, when it is a file inside root; else refused."""
        target = os.readlink(path)
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):  # dangling, or a loop
            self.refuse(
                path,
                where,
                f"symlink to {shown(target)}, which does not exist; remove it or {self.remedy}",
            )
            return None
        if real != root and root not in real.parents:
            self.refuse(
                path,
                where,
                f"symlink to {shown(target)}, outside {shown(root)}: tcloud uploads "
                f"nothing from outside the directory; {self.remedy}, or copy what it "
                "points to into the directory",
            )
            return None
        if real.is_dir():
            self.refuse(
                path,
                where,
                f"symlink to the directory {shown(target)}: directory symlinks are not "
                f"followed; {self.remedy}, or replace it with the directory",
            )
            return None
        return real

    def entry(self, path: Path, root: Path, where: str, mode: int | None = None) -> Entry | None:
        """The manifest entry of one file, or None (refused, or not a regular file)."""
        try:
            info = path.lstat()
            source = path
            if stat.S_ISLNK(info.st_mode):
                source = self.symlink(path, root, where)
                if source is None:
                    return None
                info = source.stat()
            if not stat.S_ISREG(info.st_mode):
                return None  # sockets, FIFOs, devices: nothing to upload
            if info.st_size > self.limit:
                self.refuse(
                    path,
                    where,
                    f"{human(info.st_size)} is over the limit of {self.limit_text} "
                    f"(${MAX_FILE_SIZE_ENV}); exclude it, raise the limit, or `tcloud "
                    "upload` it once and use it as a cluster dataset",
                )
                return None
            digest = self.digest_now(source, info)
        except OSError as exc:
            self.refuse(path, where, f"cannot read: {exc.strerror or exc}")
            return None
        if mode is None:
            mode = 0o755 if info.st_mode & stat.S_IXUSR else 0o644
        entry = Entry(digest or "", info.st_size, mode, source)
        if digest is None:
            future = self.pool.submit(self.hasher, source, info)
            self.waiting.append((entry, future, path, where, len(self.problems)))
        return entry

    def digest_now(self, source: Path, info: os.stat_result) -> str | None:
        """The digest when it is taken here (no pool, a small file, or the hasher
        remembers it); None when the pool is to hash the file."""
        if self.pool is None or info.st_size < POOL_MIN_SIZE:
            return self.hasher(source, info)
        known = getattr(self.hasher, "known", None)
        return known(source, info) if known is not None else None

    def finish(self, manifest: dict[str, Entry]) -> dict[str, Entry]:
        """manifest with the pool's digests; a file that could not be read is refused,
        its problem in the place it would have had without the pool."""
        hashed: dict[int, Entry | None] = {}
        late: list[tuple[int, Problem]] = []
        for entry, future, path, where, before in self.waiting:
            try:
                hashed[id(entry)] = replace(entry, sha256=future.result())
            except OSError as exc:
                hashed[id(entry)] = None
                message = f"cannot read: {exc.strerror or exc}"
                late.append((before, self.problem(path, where, message)))
        if late:
            problems, self.problems = self.problems, []
            for index, problem in enumerate([*problems, None]):
                self.problems += [p for before, p in late if before == index]
                if problem is not None:
                    self.problems.append(problem)
        self.waiting.clear()
        finished = {key: hashed.get(id(entry), entry) for key, entry in manifest.items()}
        return {key: entry for key, entry in finished.items() if entry is not None}

    def collect(
        self, root: Path, prefix: str, include: list[str], exclude: list[str], where: str
    ) -> dict[str, Entry]:
        entries: dict[str, Entry] = {}

        def unreadable(exc: OSError) -> None:
            self.refuse(Path(exc.filename), where, f"cannot read: {exc.strerror or exc}")

        for dirpath, dirnames, filenames in os.walk(root, onerror=unreadable, followlinks=False):
            base = Path(dirpath)
            below = base.relative_to(root).as_posix()
            keep = []
            for name in sorted(dirnames):
                relpath = name if below == "." else f"{below}/{name}"
                path = base / name
                if dir_excluded(relpath, exclude):
                    continue
                if path.is_symlink():
                    self.symlink(path, root, where)  # refused one way or another
                elif not is_utf8(name):
                    message = f"directory name is not UTF-8; rename it or {self.remedy}"
                    self.refuse(path, where, message)
                else:
                    keep.append(name)
            dirnames[:] = keep
            for name in sorted(filenames):
                relpath = name if below == "." else f"{below}/{name}"
                if file_excluded(relpath, include, exclude):
                    continue
                path = base / name
                if not is_utf8(name):
                    message = f"file name is not UTF-8; rename it or {self.remedy}"
                    self.refuse(path, where, message)
                    continue
                entry = self.entry(path, root, where)
                if entry is not None:
                    entries[prefix + relpath] = entry
        return entries


def refused(problems: list[Problem]) -> TaskFileError:
    shown_problems = problems[:MAX_SHOWN]
    if len(problems) > MAX_SHOWN:
        rest = len(problems) - MAX_SHOWN
        shown_problems.append(Problem("...", 0, 0, "", f"and {rest} more problem(s) like these"))
    return TaskFileError(shown_problems)


def build_manifest(task: TaskSpec, hasher: Hasher = sha256_file) -> dict[str, Entry]:
    """code/<path> for the code directory, datasets/<name>/<path> for local datasets."""
    workdir = local_paths.resolve(task.base_dir, task.code["workdir"])
    if not workdir.is_dir():
        raise TaskFileError(
            [Problem(str(task.base_dir), 0, 0, "code.workdir", f"{workdir} is not a directory")]
        )
    pool = ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="hash")
    try:
        collector = Collector(hasher, *max_file_size(), pool=pool)
        manifest = collector.finish(collect_all(task, workdir, collector))
    finally:  # refused, or Ctrl-C: what has not started hashing never does
        pool.shutdown(cancel_futures=True)
    if collector.problems:
        raise refused(collector.problems)
    return dict(sorted(manifest.items()))


def collect_all(task: TaskSpec, workdir: Path, collector: Collector) -> dict[str, Entry]:
    """The code directory's entries and the local datasets', some maybe still hashing."""
    exclude = code_excludes(task, workdir)
    manifest = collector.collect(workdir, "code/", list(task.code["include"]), exclude, "code")
    for dataset in task.datasets:
        if dataset.local is None:
            continue
        source = local_paths.resolve(task.base_dir, dataset.local)
        prefix = f"datasets/{dataset.name}/"
        where = f"datasets.{dataset.name}"
        if source.is_file():
            if not is_utf8(source.name):
                collector.refuse(source, where, "file name is not UTF-8; rename it")
                continue
            entry = collector.entry(source, source.parent, where, mode=0o644)
            if entry is not None:
                manifest[prefix + source.name] = entry
        elif source.is_dir():
            manifest.update(collector.collect(source, prefix, ["**"], ALWAYS_EXCLUDED, where))
        else:
            collector.refuse(source, where, "local path does not exist")
    return manifest
