"""Where a job's start goes, cluster side: wall-clock marks (time.time()) that the batch
step and each rank write to the job's status/timing/ (private, like the rest of
status/), for `bench/task_workflow.py --steps`:

status/timing/batch.json   process (the batch step's Python process started), batch
                           (its code runs: imports done), environment (ready), srun
                           (the wrappers are being started)
status/timing/rank-<r>.json  process, wrapper (its code runs), rendezvous (the
                           execution plug-ins agreed), program (the first run line
                           started), first_output (the program's first output line)

Each file is written at most twice per run (before the program starts, and at its first
output line), so a job pays a few milliseconds for them.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from tacc_contract.jsonfiles import write_json


def process_started(pid: int | None = None) -> float | None:
    """When this process (or pid) was started, as a clock time (10 ms resolution): its
    age is /proc/uptime less its starttime (both on the kernel's boot clock), so the
    time is right even where /proc/stat's whole-second btime is not. None when /proc
    does not say."""
    try:
        stat = Path(f"/proc/{pid or os.getpid()}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
        now = time.time()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return now - (uptime - ticks / os.sysconf("SC_CLK_TCK"))


def timing_path(job_dir: Path, who: str) -> Path:
    return job_dir / "status" / "timing" / f"{who}.json"


class Marks:
    """One writer's marks ("batch", "rank-0", ...): `mark(name)` notes the time, `save()`
    writes them all (atomic replace). A mark never fails the job: a write that fails is
    dropped."""

    def __init__(self, job_dir: Path, who: str) -> None:
        self.path = timing_path(job_dir, who)
        self.marks: dict[str, float] = {}
        started = process_started()
        if started is not None:
            self.marks["process"] = started

    def mark(self, name: str, when: float | None = None) -> None:
        self.marks[name] = time.time() if when is None else when

    def save(self) -> None:
        try:
            self.path.parent.mkdir(mode=0o700, exist_ok=True)
            write_json(self.path, self.marks)
        except OSError:
            pass


def clear(job_dir: Path) -> None:
    """A requeued run starts with no marks of the previous one."""
    for path in (job_dir / "status" / "timing").glob("*.json"):
        with contextlib.suppress(OSError):  # a mark never fails the job
            path.unlink()
