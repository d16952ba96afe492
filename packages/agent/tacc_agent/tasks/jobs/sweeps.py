"""The cluster side of sweeps (tacc_plugins/sweep.py): one job directory holds the
sweep, each trial a directory of its own under it, so every trial has the record, logs,
outputs and rank files of an ordinary job, and a code tree of its own:

<workdir>/trials/<index>/   instruction.json -> ../../instruction.json,
                            datasets -> ../../datasets (when the task uploads datasets),
                            status/, logs/, outputs/ (as for any job),
                            code/: built when the trial starts (own_code_tree), the job's
                            code/ again with directories of its own and the same read-only
                            files hard-linked, so what one trial writes where it runs is
                            not seen, or overwritten, by another

Job ids: the array's Slurm id (12) is the sweep, 12_3 its trial 3.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tacc_agent.errors import AgentError
from tacc_agent.tasks.jobs import records
from tacc_contract.instruction import FILE

ACTIVE = ("PROVISIONING", "RUNNING")


def trials_dir(job_dir: Path) -> Path:
    return job_dir / "trials"


def is_sweep(job_dir: Path) -> bool:
    return trials_dir(job_dir).is_dir()


def is_trial(directory: Path) -> bool:
    return directory.parent.name == "trials" and is_sweep(directory.parent.parent)


def is_whole_sweep(job_id: str, job_dir: Path) -> bool:
    """JOB (not JOB_I) names a sweep: the verb applies to all its trials."""
    return "_" not in job_id and is_sweep(job_dir)


def make_trials(job_dir: Path, count: int) -> None:
    """Each trial's directory, with links to what the trials share."""
    for index in range(count):
        trial = trials_dir(job_dir) / str(index)
        for sub in ("status", "logs", "outputs"):
            (trial / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        for shared in (FILE, "datasets"):
            link = trial / shared
            if not link.is_symlink() and (job_dir / shared).exists():
                link.symlink_to(os.path.join("..", "..", shared))
        records.add_event(trial, "QUEUED")


def own_code_tree(trial: Path) -> None:
    """trial/code: the sweep's code/ with directories of the trial's own and its files
    hard-linked (they are the read-only blobs of the user's store, as in any job), built
    aside and renamed into place; kept when a requeued trial runs again. Trials of
    sweeps submitted before trials had their own tree have a link here: left alone."""
    code = trial / "code"
    if code.exists() or code.is_symlink():
        return
    shared = trial.parent.parent / "code"
    building = Path(tempfile.mkdtemp(prefix=".code-", dir=trial))
    try:
        for root, dirs, files in os.walk(shared):
            here = building / os.path.relpath(root, shared)
            for name in [*dirs, *files]:
                source, target = Path(root, name), here / name
                if source.is_symlink():
                    target.symlink_to(os.readlink(source))
                elif source.is_dir():
                    target.mkdir(mode=0o700)
                else:
                    os.link(source, target)
        building.rename(code)
    except OSError as exc:
        shutil.rmtree(building, ignore_errors=True)
        raise AgentError(f"could not build the trial's code tree in {trial}: {exc}") from None
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise


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
