"""Files the lab writes that hold secrets: private from their first byte."""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, mode 0600 from its first byte, replaced whole."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(partial, path)


def ensure_secret(path: Path) -> str:
    """A random secret kept in `path`: made once (mode 0600, its folder 0700), then read."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(path, secrets.token_urlsafe(24))
    return path.read_text().strip()
