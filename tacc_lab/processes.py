"""Long-running child processes the lab starts in their own session (nodes, proxy)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def process_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    # A zombie has exited; only its parent's wait() is missing.
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def stop_process(pid: int | None, *, timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL; returns once the process is gone."""
    if pid is None or not process_alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not process_alive(pid):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    while process_alive(pid):
        _reap(pid)
        time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
