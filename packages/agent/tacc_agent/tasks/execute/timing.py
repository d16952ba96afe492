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
import time
from pathlib import Path

from tacc_agent.procfs.processes import started_at
from tacc_contract.jsonfiles import write_json


def timing_path(job_dir: Path, who: str) -> Path:
    return job_dir / "status" / "timing" / f"{who}.json"


class Marks:
    """One writer's marks ("batch", "rank-0", ...): `mark(name)` notes the time, `save()`
    writes them all (atomic replace). A mark never fails the job: a write that fails is
    dropped."""

    def __init__(self, job_dir: Path, who: str) -> None:
        self.path = timing_path(job_dir, who)
        self.marks: dict[str, float] = {}
        started = started_at()
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
