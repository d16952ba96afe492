"""Where a user's things live on shared storage (every node sees the same paths):

<workspace>/<user>/            0700, the user's own (TACC_USERDIR)
    store/<sha256>-<mode>      content store of uploaded files (read-only blobs)
    jobs/<digest12>-<n>/       one directory per submission (TACC_WORKDIR)
    index/<slurm job id>       -> ../jobs/<dir>: finds a job by its Slurm id
    envs/<requirements digest> cached Python environments
    files/                     `tcloud upload` target
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import EXIT_CLUSTER, AgentError, Rejected

JOB_ID = re.compile(r"\d+")
# A sweep's trial: <array job id>_<index> (tacc_agent/sweeps.py).
TRIAL_ID = re.compile(r"(\d+)_(\d+)")


def current_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def userdir(config: AgentConfig, override: str | None = None) -> Path:
    """The caller's directory, created private on first use."""
    path = (
        Path(os.path.expanduser(override)) if override else Path(config.workspace) / current_user()
    )
    if not path.is_dir():
        try:
            path.mkdir(mode=0o700)
        except FileNotFoundError:
            raise AgentError(
                f"{path.parent} does not exist: is the shared workspace mounted here?",
                EXIT_CLUSTER,
            ) from None
        except PermissionError:
            raise AgentError(
                f"cannot create {path}: ask an admin to add you to the cluster's users "
                "(the tacc_agent role creates a directory for each one)",
                EXIT_CLUSTER,
            ) from None
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise AgentError(f"{path} is not yours (or is a symlink); refusing to use it", EXIT_CLUSTER)
    if not override:
        path.chmod(0o700)  # an explicit --userdir keeps the mode its owner chose
    return path


def job_dir(user_dir: Path, job_id: str) -> Path:
    """A job of the caller's, by Slurm id; Rejected when it is not theirs (or unknown)."""
    trial = TRIAL_ID.fullmatch(job_id)
    if not JOB_ID.fullmatch(job_id) and not trial:
        raise Rejected(
            f"not a job id: {job_id!r} (expected a number such as 1234, or 1234_5 for "
            "trial 5 of a sweep)"
        )
    link = user_dir / "index" / (trial.group(1) if trial else job_id)
    if not link.is_symlink() and not link.exists():
        raise Rejected(f"no job {job_id} of yours on this cluster")
    if not trial:
        return link.resolve()
    found = link.resolve() / "trials" / trial.group(2)
    if not found.is_dir():
        raise Rejected(f"job {trial.group(1)} has no trial {trial.group(2)}")
    return found


def register(user_dir: Path, job_id: str, directory: Path) -> None:
    index = user_dir / "index"
    index.mkdir(mode=0o700, exist_ok=True)
    link = index / job_id
    if link.is_symlink():
        link.unlink()
    link.symlink_to(os.path.relpath(directory, index))


def job_ids(user_dir: Path) -> list[str]:
    index = user_dir / "index"
    names = [p.name for p in index.iterdir()] if index.is_dir() else []
    return sorted((n for n in names if JOB_ID.fullmatch(n)), key=int)
