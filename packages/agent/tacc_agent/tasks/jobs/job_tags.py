"""Is the job Slurm knows by an id this job of the caller's? (issue [10] point 14)

The agent tags each job it submits: `sbatch --comment=tacc:<job dir>:<random>`, a tag
also kept in the job's status/submit.json. A Slurm id is only a number: after the
controller loses its state it counts again, and an id in a user's index may then name
someone else's job, or a later job of their own. So before status, cancel, halt or
resume believe or act on what Slurm says of an id, the Slurm job must be the caller's
(UserId) and carry the tag of that job directory (a job submitted before tags: run in
it, WorkDir). Anyone can write any comment on their own jobs, but only on their own:
a copied tag never makes another user's job pass for the caller's.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from tacc_agent.tasks.jobs import records

PREFIX = "tacc:"
USER_ID = re.compile(r"[^()]*\((\d+)\)")  # scontrol's UserId=alice(1001)


def new_tag(job_dir: Path) -> str:
    return f"{PREFIX}{job_dir.name}:{secrets.token_hex(8)}"


def tag_of(job_dir: Path) -> str:
    """The tag the agent gave the job in job_dir ("" for a job submitted before tags)."""
    return str((records.read_json(job_dir / "status" / "submit.json") or {}).get("tag") or "")


def owned_by_caller(info: dict[str, str]) -> bool:
    match = USER_ID.fullmatch(info.get("UserId", ""))
    return bool(match) and int(match.group(1)) == os.getuid()


def tagged_for(info: dict[str, str], job_dir: Path) -> bool:
    """Slurm's record (scontrol's Comment/WorkDir, or squeue's) names job_dir's job."""
    tag = tag_of(job_dir)
    if tag:
        return info.get("Comment", "") == tag
    return bool(info.get("WorkDir")) and Path(info["WorkDir"]) == job_dir


def is_theirs(info: dict[str, str], job_dir: Path) -> bool:
    """scontrol's record of a job is the caller's job in job_dir (a sweep's own
    directory for its trials)."""
    return owned_by_caller(info) and tagged_for(info, job_dir)


def owner(info: dict[str, str]) -> str:
    return info.get("UserId", "").partition("(")[0] or "someone else"
