"""Exclusive file locks: the agent's one way to take one. A lock is taken waiting, or at
once with a plain "busy" answer (False), or by polling for a while; "busy" means another
holder has it, and any other failure (ENOLCK: an NFS mount without a lock service) is an
OSError, never taken for busy.

Two kinds, chosen per lock file:

- POSIX (fcntl.lockf, a POSIX record lock over the whole file): what NFS carries between
  nodes (NLM for v3, part of the protocol in v4), so the kind for a lock that jobs on
  several nodes take in a user's directory on shared storage (an environment's, an
  image's). It is the process's: a second lock by the same process on the same file
  succeeds, and closing any descriptor of that file drops the process's lock (so a
  process never tests a lock it may hold itself: tasks/images/build.py's
  clear_stale_builds steers round it).
- FLOCK (fcntl.flock): the open file's, so a second open in the same process sees it
  busy and closing another descriptor drops nothing. For the daemon's local state
  directory, and for files where one process may hold a lock and test it again (a job's
  submission, an upload's partial file). Linux's NFS client hands flock to the server as
  a whole-file POSIX lock, so other nodes see these too.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from enum import Enum

POLL_SECONDS = 0.5
BUSY = (errno.EAGAIN, errno.EACCES)  # lockf answers either when another holder has it


class Kind(Enum):
    POSIX = "lockf"
    FLOCK = "flock"


POSIX, FLOCK = Kind.POSIX, Kind.FLOCK


def take(fd: int, kind: Kind, wait: bool = False) -> bool:
    """An exclusive lock on the open file fd: True when taken; False when another holder
    has it (only without `wait`, which blocks until it is free)."""
    operation = fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB)
    try:
        if kind is POSIX:
            fcntl.lockf(fd, operation)
        else:
            fcntl.flock(fd, operation)
    except OSError as exc:
        if wait or exc.errno not in BUSY:
            raise
        return False
    return True


def release(fd: int, kind: Kind) -> None:
    if kind is POSIX:
        fcntl.lockf(fd, fcntl.LOCK_UN)
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)


def take_within(
    fd: int,
    kind: Kind,
    seconds: float | Callable[[], float],
    waiting: Callable[[float], None] | None = None,
) -> bool:
    """The lock, tried every POLL_SECONDS for `seconds` at most: True when taken, False
    when still busy after. `seconds` may be a function, asked only if the lock is busy
    at the first try; `waiting(seconds)` is told once, when the wait begins."""
    if take(fd, kind):
        return True
    limit = seconds() if callable(seconds) else seconds
    if waiting is not None:
        waiting(limit)
    deadline = time.monotonic() + limit
    while time.monotonic() <= deadline:
        time.sleep(POLL_SECONDS)
        if take(fd, kind):
            return True
    return False


@contextlib.contextmanager
def lock_file(
    path: str | os.PathLike,
    kind: Kind,
    *,
    wait: bool = False,
    within: float | Callable[[], float] | None = None,
    waiting: Callable[[float], None] | None = None,
    flags: int = os.O_RDWR | os.O_CREAT,
    mode: int = 0o600,
) -> Iterator[bool]:
    """The lock file at `path` opened (flags, mode) and locked while the block runs: it
    yields True when the lock is held, False when busy (only without `wait`; with
    `within`, after polling that long, see take_within). Released and closed after."""
    fd = os.open(path, flags, mode)
    try:
        taken = take(fd, kind, wait) if within is None else take_within(fd, kind, within, waiting)
        try:
            yield taken
        finally:
            if taken:
                release(fd, kind)
    finally:
        os.close(fd)
