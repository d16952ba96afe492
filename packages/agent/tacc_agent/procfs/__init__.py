"""This node's /proc, read in one place: the TCP socket tables (sockets), the processes
(processes), this process's mount table (mounts) and the node-wide files (system). The
rest of the agent asks these modules and never opens a /proc path itself.

Every reader takes the /proc root (PROC, or a fake tree a test builds), and none raises
for a process that ended between two reads: it is simply not there."""

from __future__ import annotations

PROC = "/proc"


def read_bytes(path: str, most: int = -1) -> bytes | None:
    """A /proc file's bytes, at most `most` (-1: all); None when it cannot be read (the
    process ended meanwhile, or a file the kernel hides from this user)."""
    try:
        with open(path, "rb") as found:
            return found.read(most)
    except OSError:
        return None
