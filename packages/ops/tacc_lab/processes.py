"""Long-running child processes the lab starts in their own session (nodes, proxy)."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def process_alive(pid: int | None, marker: str) -> bool:
    """True if `pid` runs and its command line contains `marker`.

    The marker guards against a recorded pid that was reused by an unrelated process
    after a crash or reboot: such a process is neither "our node" nor ours to signal.
    """
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError):
        return False
    # A zombie has exited; only its parent's wait() is missing.
    return stat.rsplit(")", 1)[-1].split()[0] != "Z" and marker in cmdline


def stop_process(pid: int | None, marker: str, *, timeout: float = 10.0) -> None:
    """SIGTERM, wait, then SIGKILL; returns once the process is gone."""
    if pid is None or not process_alive(pid, marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _reap(pid)
        if not process_alive(pid, marker):
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    while process_alive(pid, marker):
        _reap(pid)
        time.sleep(0.05)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
