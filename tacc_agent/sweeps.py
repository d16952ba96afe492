"""The cluster side of sweeps (tacc_plugins/sweep.py): one job directory holds the
sweep, each trial a directory of its own under it, so every trial has the record, logs
and rank files of an ordinary job:

<workdir>/trials/<index>/   instruction.json -> ../../instruction.json, code -> ../../code,
                            status/, logs/ (as for any job)

Job ids: the array's Slurm id (12) is the sweep, 12_3 its trial 3.
"""

from __future__ import annotations

import os
from pathlib import Path

from tacc_agent import records
from tacc_agent.instruction import FILE

ACTIVE = ("PROVISIONING", "RUNNING")


def trials_dir(job_dir: Path) -> Path:
    return job_dir / "trials"


def is_sweep(job_dir: Path) -> bool:
    return trials_dir(job_dir).is_dir()


def is_whole_sweep(job_id: str, job_dir: Path) -> bool:
    """JOB (not JOB_I) names a sweep: the verb applies to all its trials."""
    return "_" not in job_id and is_sweep(job_dir)


def make_trials(job_dir: Path, count: int) -> None:
    """Each trial's directory, with links to what the trials share."""
    for index in range(count):
        trial = trials_dir(job_dir) / str(index)
        for sub in ("status", "logs"):
            (trial / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        for shared in (FILE, "code"):
            link = trial / shared
            if not link.is_symlink() and (job_dir / shared).exists():
                link.symlink_to(os.path.join("..", "..", shared))
        records.add_event(trial, "QUEUED")


def trial_dir(job_dir: Path, index: str) -> Path:
    return trials_dir(job_dir) / index


def trial_indexes(job_dir: Path) -> list[str]:
    found = [p.name for p in trials_dir(job_dir).iterdir() if p.name.isdigit()]
    return sorted(found, key=int)


def batch_dir(job_dir: Path) -> Path:
    """The directory a batch step works in: its trial's, in a sweep."""
    index = os.environ.get("SLURM_ARRAY_TASK_ID", "")
    if index.isdigit() and is_sweep(job_dir):
        return trial_dir(job_dir, index)
    return job_dir


def summary_state(states: list[str]) -> str:
    """The sweep's state from its trials' states."""
    if any(s in ACTIVE for s in states):
        return "RUNNING"
    if any(s in ("QUEUED", "HALTED") for s in states):
        return "QUEUED"
    if "FAILED" in states:
        return "FAILED"
    if "CANCELLED" in states:
        return "CANCELLED"
    return "COMPLETED"


def counts(states: list[str]) -> str:
    seen: dict[str, int] = {}
    for state in states:
        seen[state] = seen.get(state, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(seen.items()))
