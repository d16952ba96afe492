"""A submission cut off after sbatch is found again (issue [10] point 10).

The job is recorded before sbatch is called: status/submit.json with its tag and no
Slurm id yet, and an index entry "<dir>.submitting". The submitting agent holds a lock
on the job (status/submitting.lock) until sbatch has answered and the id is indexed.
If the agent dies or sbatch times out in between, the job may be in Slurm with nobody
knowing its id. The next `ps`, `status` or `cancel` settles every such entry whose lock
is free (its submitter is gone): Slurm is asked for the caller's job with the tag
(squeue, then sacct by the job's directory), and the job gets its id in the index, or
is recorded FAILED as never submitted. While Slurm does not answer, it stays as it is.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from pathlib import Path

from tacc_agent import locks, slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.store import workspace

NOT_SUBMITTED = "its submission was cut off before sbatch answered, and Slurm has no such job"
SACCT_SLACK_SECONDS = 300  # clocks of the login node and the controller may differ


def not_found_grace(config: AgentConfig) -> float:
    """How long after its sbatch a job Slurm does not show is still waited for: a busy
    controller may take a submission whose sbatch timed out a while later."""
    return 4 * config.slurm_timeout_seconds


def record_path(job_dir: Path) -> Path:
    return job_dir / "status" / "submit.json"


def locked(job_dir: Path, wait: bool) -> AbstractContextManager[bool]:
    """An exclusive lock on the job's submission while the block runs; it yields False
    when someone holds it already (never with wait). A flock, the open file's: another
    open of it finds it busy, in this process too."""
    return locks.lock_file(job_dir / "status" / "submitting.lock", locks.FLOCK, wait=wait)


def begin(user_dir: Path, job_dir: Path, record: dict) -> None:
    """Before sbatch, under the job's lock (held until `finish`, or until the submitter
    dies): the job's record with its tag and no id yet, and its "submitting" entry."""
    records.write_json(record_path(job_dir), {**record, "job_id": None, "since": time.time()})
    workspace.mark_submitting(user_dir, job_dir)


def finish(user_dir: Path, job_dir: Path, job_id: str) -> None:
    """sbatch answered (or Slurm was found to have the job): the id, in the record and
    the index."""
    record = records.read_json(record_path(job_dir)) or {}
    records.write_json(record_path(job_dir), {**record, "job_id": job_id})
    workspace.register(user_dir, job_id, job_dir)


def queued_tags(config: AgentConfig) -> dict[str, str]:
    """{tag: job id} of the caller's jobs Slurm still has in its queue (%F: the array's
    id for a sweep's trials)."""
    return slurm.queue.own_tags(config.slurm_timeout_seconds)


def accounted_job(job_dir: Path, tag: str, since: float, config: AgentConfig) -> str | None:
    """The caller's job that ran in job_dir (or has the tag) since the submission,
    from Slurm's accounting; None when there is none or no accounting."""
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - SACCT_SLACK_SECONDS))
    try:
        places = slurm.accounting.own_jobs_since(start, config.slurm_timeout_seconds)
    except AgentError:
        return None
    for job_id, workdir, comment in places:
        if comment == tag or workdir == str(job_dir):
            return job_id.split("_")[0]
    return None


def started_as(job_dir: Path) -> str | None:
    """The Slurm id the job's batch step recorded when it started (it ran, and may have
    left the queue already), for a cluster without accounting."""
    ids = [str(e["slurm_job_id"]) for e in records.history(job_dir) if e.get("slurm_job_id")]
    return ids[0] if ids else None


def settle(user_dir: Path, job_dir: Path, queue: dict[str, str], config: AgentConfig) -> bool:
    """Give the job its id, or record it as never submitted; False: not yet known."""
    record = records.read_json(record_path(job_dir)) or {}
    tag = str(record.get("tag", ""))
    job_id = record.get("job_id") or (queue.get(tag) if tag else None)
    if not job_id and tag:
        job_id = accounted_job(job_dir, tag, float(record.get("since", 0)), config)
    if not job_id:
        job_id = started_as(job_dir)
    if job_id:
        finish(user_dir, job_dir, str(job_id))
        return True
    if time.time() - float(record.get("since", 0)) < not_found_grace(config):
        return False
    records.add_event(job_dir, "FAILED", reason=NOT_SUBMITTED)
    records.write_json(record_path(job_dir), {**record, "not_submitted": True})
    workspace.drop_submitting(user_dir, job_dir)
    return True


def resolve(user_dir: Path, config: AgentConfig) -> list[Path]:
    """Settle every submission whose submitter is gone; the job directories still being
    submitted (their sbatch has not answered yet)."""
    waiting: list[Path] = []
    queue: dict[str, str] | None = None
    for job_dir in workspace.submitting(user_dir):
        if not (job_dir / "status").is_dir():  # the job directory is gone
            workspace.drop_submitting(user_dir, job_dir)
            continue
        with locked(job_dir, wait=False) as free:
            if not free:
                waiting.append(job_dir)
                continue
            try:
                if queue is None:
                    queue = queued_tags(config)
                if not settle(user_dir, job_dir, queue, config):
                    waiting.append(job_dir)
            except AgentError:  # Slurm does not answer: settle it another time
                waiting.append(job_dir)
    return waiting
