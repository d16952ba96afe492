"""A real FUSE mount whose server never answers: statfs() on it blocks, like a hung NFS
server. The test opens /dev/fuse and mounts it itself (mount(2) with fd=N), then never
reads a request, so every call into the mount waits (killably, since no request is ever
sent to a server). Closing the device aborts the connection: the waiters get ENOTCONN.
Needs root and /dev/fuse, which the CI machine has."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FSTYPE = "fuse.tacc-test"
MNT_DETACH = 2


def libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextmanager
def blocking_fuse(point: Path) -> Iterator[dict]:
    """Mount at `point` (an empty directory). Yields a handle; `abort()` on it ends the
    connection early (a dead server: statfs then fails instead of blocking)."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0".encode()
    if libc().mount(b"tacc-test", str(point).encode(), FSTYPE.encode(), 0, options) != 0:
        errno = ctypes.get_errno()
        os.close(fd)
        raise OSError(errno, f"mount fuse at {point}: {os.strerror(errno)}")
    handle = {"fd": fd, "stuck_pids": []}

    def abort() -> None:
        for pid in handle["stuck_pids"]:  # our own forked probes hold a copy of the fd
            try:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
        handle["stuck_pids"] = []
        if handle["fd"] is not None:
            os.close(handle["fd"])
            handle["fd"] = None

    handle["abort"] = abort
    try:
        yield handle
    finally:
        abort()
        libc().umount2(str(point).encode(), MNT_DETACH)
