"""The agent's one lock helper (tacc_agent/locks.py): taken at once or "busy", waited
for, polled for a while (the limit asked only when busy, the wait said once); a failure
that is no holder's is an error, never "busy"; both kinds against a holder in another
process, flock against another open file of this one."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tacc_agent import locks

HOLD = """
import fcntl, sys, time
kind, path = sys.argv[1], sys.argv[2]
handle = open(path, "a")
(fcntl.lockf if kind == "lockf" else fcntl.flock)(handle, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


@contextmanager
def held_elsewhere(path: Path, kind: locks.Kind) -> Iterator[None]:
    """The lock held by another process until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, kind.value, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("")


@pytest.mark.parametrize("kind", [locks.POSIX, locks.FLOCK])
def test_a_lock_held_by_another_process_is_busy_then_free(tmp_path, kind):
    lock = tmp_path / "x.lock"
    with held_elsewhere(lock, kind), locks.lock_file(lock, kind) as taken:
        assert taken is False
    with locks.lock_file(lock, kind) as taken:
        assert taken is True
    with locks.lock_file(lock, kind, wait=True) as taken:
        assert taken is True


def test_a_flock_is_the_open_files_so_this_process_sees_its_own_busy(tmp_path):
    lock = tmp_path / "x.lock"
    with locks.lock_file(lock, locks.FLOCK) as first, locks.lock_file(lock, locks.FLOCK) as second:
        assert (first, second) == (True, False)


def test_a_wait_with_a_limit_asks_the_limit_only_when_busy_and_says_it_once(tmp_path, monkeypatch):
    monkeypatch.setattr(locks, "POLL_SECONDS", 0.01)
    lock = tmp_path / "x.lock"
    asked, said = [], []

    def limit() -> float:
        asked.append(1)
        return 0.05

    with locks.lock_file(lock, locks.POSIX, within=limit, waiting=said.append) as taken:
        assert taken is True and asked == [] and said == []
    busy = locks.lock_file(lock, locks.POSIX, within=limit, waiting=said.append)
    with held_elsewhere(lock, locks.POSIX), busy as taken:
        assert taken is False
    assert asked == [1] and said == [0.05]


@pytest.mark.fault
def test_a_lock_that_cannot_be_taken_at_all_is_an_error_not_busy(tmp_path, monkeypatch):
    """An NFS mount without a lock service answers ENOLCK: no one holds the lock, so the
    caller is told, not made to wait for it."""

    def no_locks(_fd: int, _operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "lockf", no_locks)
    with pytest.raises(OSError) as raised, locks.lock_file(tmp_path / "x.lock", locks.POSIX):
        pass
    assert raised.value.errno == errno.ENOLCK


def test_the_lock_file_is_opened_as_asked_and_closed_after(tmp_path):
    lock = tmp_path / "x.lock"
    before = len(os.listdir("/proc/self/fd"))
    with locks.lock_file(lock, locks.FLOCK, mode=0o640) as taken:
        assert taken and len(os.listdir("/proc/self/fd")) == before + 1
    assert len(os.listdir("/proc/self/fd")) == before
    assert lock.stat().st_mode & 0o777 == 0o640 & ~current_umask()
    absent = locks.lock_file(tmp_path / "absent", locks.FLOCK, flags=os.O_RDONLY)
    with pytest.raises(FileNotFoundError), absent:
        pass


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
