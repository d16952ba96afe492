"""The processes below a process (procfs's process tree), whatever session or group
they moved to: what a run line or an image-build step left running (a `cmd &`, or one
that left its session and was adopted by the batch step or wrapper, child subreapers)
is found here and stopped."""

from __future__ import annotations

import contextlib
import os
import signal

from tacc_agent.procfs.processes import process_tree


def children(pid: int) -> list[int]:
    return process_tree().get(pid, [])


def descendants(pid: int) -> list[int]:
    """Every process below pid, whatever session or group it moved to."""
    tree = process_tree()
    found, todo = [], [pid]
    while todo:
        below = tree.get(todo.pop(), [])
        found += below
        todo += below
    return found


def kill_new_descendants(before: set[int]) -> None:
    """SIGKILL to every process below this one that `before` (a descendants() snapshot)
    did not hold, then collect those that were its own children. Docker's RUN ends the
    same way: the step's container and everything in it is gone."""
    me = os.getpid()
    for _ in range(10):  # a dying parent may fork once more: look again
        left = [pid for pid in descendants(me) if pid not in before]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in left:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, 0)
