"""Reading what a user's program left in its job directory, from a plug-in's hook: a
small JSON object, never through a link (neither the folder nor the file), only a
regular file of a bounded size (a FIFO there cannot block the read)."""

from __future__ import annotations

import json
import os
import stat

FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK


def read_json_object(folder: os.PathLike, name: str, max_bytes: int) -> dict | None:
    """folder/name as a JSON object, or None when it is anything else."""
    try:
        folder_fd = os.open(folder, FLAGS | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        handle = os.open(name, FLAGS, dir_fd=folder_fd)
    except OSError:
        return None
    finally:
        os.close(folder_fd)
    with os.fdopen(handle, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        text = file.read(max_bytes + 1)
    if len(text) > max_bytes:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
