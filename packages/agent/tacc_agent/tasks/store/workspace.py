"""Where a user's things live on shared storage (every node sees the same paths):

<workspace>/<user>/            0700, the user's own (TACC_USERDIR)
    store/<sha256>-<mode>      content store of uploaded files (read-only blobs)
    jobs/<digest12>-<n>/       one directory per submission (TACC_WORKDIR)
    index/<slurm job id>       -> ../jobs/<dir>: finds a job by its Slurm id
    index/<id>.<dir>           -> ../jobs/<dir>: a later job Slurm gave the same id (its
                               controller lost its state and counts again): an entry
                               is never replaced, the newest answers to the id
    index/<dir>.submitting     -> ../jobs/<dir>: sbatch called, its id not known yet
                               (tacc_agent/submitting.py settles it)
    envs/<requirements digest> cached Python environments
    files/                     `tcloud upload` target
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected

JOB_ID = re.compile(r"\d+")
# A sweep's trial: <array job id>_<index> (tacc_agent/sweeps.py).
TRIAL_ID = re.compile(r"(\d+)_(\d+)")
# An index entry: <id>, or <id>.<job dir> for a later job given the same id.
ENTRY = re.compile(r"(\d+)(?:\.[^/]+)?")
SUBMITTING = ".submitting"


@dataclass(frozen=True)
class IndexEntry:
    job_id: str
    job_dir: Path
    registered_ns: int  # when the entry was made: the newest answers to a reused id


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
                AGENT_CLUSTER,
            ) from None
        except PermissionError:
            raise AgentError(
                f"cannot create {path}: ask an admin to add you to the cluster's users "
                "(the tacc_agent role creates a directory for each one)",
                AGENT_CLUSTER,
            ) from None
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise AgentError(
            f"{path} is not yours (or is a symlink); refusing to use it", AGENT_CLUSTER
        )
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
    found = entries_of(user_dir, trial.group(1) if trial else job_id)
    if not found:
        raise Rejected(f"no job {job_id} of yours on this cluster")
    newest = found[-1].job_dir
    if not trial:
        return newest
    found = newest / "trials" / trial.group(2)
    if not found.is_dir():
        raise Rejected(f"job {trial.group(1)} has no trial {trial.group(2)}")
    return found


def register(user_dir: Path, job_id: str, directory: Path) -> None:
    """Index job_id -> directory, and drop its "submitting" entry. An id another of
    the caller's jobs already has gets an entry of its own: nothing is ever replaced."""
    index = user_dir / "index"
    index.mkdir(mode=0o700, exist_ok=True)
    target = os.path.relpath(directory, index)
    for name in (job_id, f"{job_id}.{directory.name}"):
        try:
            (index / name).symlink_to(target)  # create-only: never replaces an entry
            break
        except FileExistsError:
            if os.readlink(index / name) == target:
                break  # registered already
    drop_submitting(user_dir, directory)


def entry(link: Path) -> IndexEntry | None:
    match = ENTRY.fullmatch(link.name)
    if not match or link.name.endswith(SUBMITTING):
        return None
    try:
        made = link.lstat().st_mtime_ns
    except FileNotFoundError:
        return None
    return IndexEntry(match.group(1), link.resolve(), made)


def entries_of(user_dir: Path, job_id: str) -> list[IndexEntry]:
    """The caller's jobs Slurm gave job_id, oldest first."""
    index = user_dir / "index"
    links = [index / job_id, *index.glob(f"{job_id}.*")]
    found = [e for e in (entry(link) for link in links) if e and e.job_id == job_id]
    return sorted(found, key=lambda e: e.registered_ns)


def entries(user_dir: Path) -> list[IndexEntry]:
    """Every job of the caller's with a Slurm id, by id (then oldest first)."""
    index = user_dir / "index"
    links = list(index.iterdir()) if index.is_dir() else []
    found = [e for e in (entry(link) for link in links) if e]
    return sorted(found, key=lambda e: (int(e.job_id), e.registered_ns))


def job_ids(user_dir: Path) -> list[str]:
    return sorted({e.job_id for e in entries(user_dir)}, key=int)


def submitting_link(user_dir: Path, directory: Path) -> Path:
    return user_dir / "index" / f"{directory.name}{SUBMITTING}"


def mark_submitting(user_dir: Path, directory: Path) -> None:
    """Index a job before sbatch is called: a crash after it still finds the job."""
    index = user_dir / "index"
    index.mkdir(mode=0o700, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        submitting_link(user_dir, directory).symlink_to(os.path.relpath(directory, index))


def drop_submitting(user_dir: Path, directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        submitting_link(user_dir, directory).unlink()


def submitting(user_dir: Path) -> list[Path]:
    """The job directories whose sbatch has not been settled (tacc_agent/submitting.py)."""
    index = user_dir / "index"
    links = sorted(index.glob(f"*{SUBMITTING}")) if index.is_dir() else []
    return [link.resolve() for link in links]
