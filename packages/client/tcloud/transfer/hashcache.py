"""Local hash cache: (path, size, mtime, inode) -> sha256, so unchanged files are not
read again. SQLite in ~/.cache/tcloud/ ($TCLOUD_CACHE_DIR overrides). It is only a
cache: one that cannot be read (corrupt, not a database) is started afresh."""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
from pathlib import Path

from tcloud.errors import TcloudError


def cache_dir() -> Path:
    return Path(os.environ.get("TCLOUD_CACHE_DIR", Path.home() / ".cache" / "tcloud"))


def cache_key(path: Path) -> str | bytes:
    """The resolved path: text, or its bytes when the name is not UTF-8 (SQLite text
    must be UTF-8; a BLOB key never equals a TEXT one, so the two cannot collide)."""
    resolved = str(path.resolve())
    try:
        resolved.encode("utf-8")
    except UnicodeEncodeError:
        return os.fsencode(resolved)
    return resolved


def open_db(path: Path) -> sqlite3.Connection:
    # Shared by the threads that hash (manifest.build_manifest), one at a time (a lock).
    db = sqlite3.connect(path, check_same_thread=False)
    try:
        db.execute(
            "CREATE TABLE IF NOT EXISTS hashes (path TEXT PRIMARY KEY, size INTEGER,"
            " mtime_ns INTEGER, inode INTEGER, sha256 TEXT)"
        )
        db.execute("SELECT count(*) FROM hashes").fetchone()
    except sqlite3.DatabaseError:
        db.close()
        raise
    return db


def identity(info: os.stat_result) -> tuple[int, int, int]:
    """What says a file is the one that was hashed: size, mtime, inode."""
    return info.st_size, info.st_mtime_ns, info.st_ino


def digest_and_stat(path: Path) -> tuple[str, os.stat_result]:
    """sha256 of the file and its fstat once read: a file changed (or replaced) since
    the walk's stat shows in the second."""
    with path.open("rb", buffering=0) as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        return digest, os.fstat(handle.fileno())


class HashCache:
    """A `manifest.Hasher` that remembers. Use as a context manager (commits on exit).
    Thread-safe: the database is used under a lock, the files are hashed outside it."""

    def __init__(self, path: Path | None = None) -> None:
        path = path or cache_dir() / "hashes.sqlite"
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                self.db = open_db(path)
            except sqlite3.OperationalError:
                raise  # locked by another tcloud, or cannot be opened: not ours to delete
            except sqlite3.DatabaseError:  # not a database (any more): start afresh
                path.unlink()
                self.db = open_db(path)
        except (OSError, sqlite3.Error) as exc:
            raise TcloudError(
                f"hash cache {path}: {getattr(exc, 'strerror', None) or exc}; "
                "set TCLOUD_CACHE_DIR to a writable directory"
            ) from None
        self.hits = 0
        self.misses = 0
        self.changed = 0  # read while it changed: hashed, not remembered
        self.lock = threading.Lock()

    def known(self, path: Path, info: os.stat_result) -> str | None:
        """The remembered digest of this very file (path, size, mtime, inode), or None."""
        key = cache_key(path)
        with self.lock:
            row = self.db.execute(
                "SELECT sha256 FROM hashes WHERE path=? AND size=? AND mtime_ns=? AND inode=?",
                (key, info.st_size, info.st_mtime_ns, info.st_ino),
            ).fetchone()
            if row:
                self.hits += 1
        return row[0] if row else None

    def __call__(self, path: Path, info: os.stat_result) -> str:
        digest = self.known(path, info)
        if digest is not None:
            return digest
        digest, after = digest_and_stat(path)
        with self.lock:
            self.misses += 1
            if identity(after) != identity(info):  # changed between its stat and its read
                self.changed += 1
                return digest  # not remembered: the next run reads it again
            self.db.execute(
                "INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?)",
                (cache_key(path), info.st_size, info.st_mtime_ns, info.st_ino, digest),
            )
        return digest

    def __enter__(self) -> HashCache:
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(sqlite3.Error):  # only a cache: the next run hashes again
            self.db.commit()
        self.db.close()
