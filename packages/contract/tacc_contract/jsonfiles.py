"""JSON files on shared storage: written by atomic replace (a reader on another node
never sees half a file), read as None when absent or unreadable. The agent keeps its
job records this way, and a plug-in its own state (las.json in `Queue.state_dir`)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    """Atomic replace. `mode` overrides the writer's umask (the agent's is 077) for a
    file other users must read."""
    temporary = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}")
    temporary.write_text(json.dumps(data, sort_keys=True))
    if mode is not None:
        temporary.chmod(mode)
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
