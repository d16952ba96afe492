"""Local hash cache: (path, size, mtime, inode) -> sha256, so unchanged files are not
read again. SQLite in ~/.cache/tcloud/ ($TCLOUD_CACHE_DIR overrides)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from tcloud.manifest import sha256_file


def cache_dir() -> Path:
    return Path(os.environ.get("TCLOUD_CACHE_DIR", Path.home() / ".cache" / "tcloud"))


class HashCache:
    """A `manifest.Hasher` that remembers. Use as a context manager (commits on exit)."""

    def __init__(self, path: Path | None = None) -> None:
        path = path or cache_dir() / "hashes.sqlite"
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db = sqlite3.connect(path)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS hashes (path TEXT PRIMARY KEY, size INTEGER,"
            " mtime_ns INTEGER, inode INTEGER, sha256 TEXT)"
        )
        self.hits = 0
        self.misses = 0

    def __call__(self, path: Path, info: os.stat_result) -> str:
        key = str(path.resolve())
        row = self.db.execute(
            "SELECT sha256 FROM hashes WHERE path=? AND size=? AND mtime_ns=? AND inode=?",
            (key, info.st_size, info.st_mtime_ns, info.st_ino),
        ).fetchone()
        if row:
            self.hits += 1
            return row[0]
        self.misses += 1
        digest = sha256_file(path)
        self.db.execute(
            "INSERT OR REPLACE INTO hashes VALUES (?, ?, ?, ?, ?)",
            (key, info.st_size, info.st_mtime_ns, info.st_ino, digest),
        )
        return digest

    def __enter__(self) -> HashCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.db.commit()
        self.db.close()
