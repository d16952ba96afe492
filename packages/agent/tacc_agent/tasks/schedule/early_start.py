"""A scheduling plug-in starting a job before its begin time (`Queue.start_now`): only
a placement delay (a plug-in's, as allox's `submit_delay_seconds`) is cut short, never
a requeued job's wait nor a begin time its owner set further out; the job's record is
read again just before, with times as epoch seconds."""

from __future__ import annotations

from collections.abc import Callable

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_contract.plugins import PLACEMENT_DELAY_LIMIT, QueuedJob, delayed_for_placement


def starter(
    jobs: list[QueuedJob], config: AgentConfig, note: Callable[[str], None]
) -> Callable[[str], bool]:
    """`Queue.start_now` for one tick: only a job `delayed_for_placement` as read this
    tick and still so in its own record, read again just before (`fresh_delay`)."""
    by_id = {job.job_id: job for job in jobs}
    started: set[str] = set()

    def start_now(job_id: str) -> bool:
        job = by_id.get(job_id)
        why = "it waits for no placement delay"
        if job_id in started:
            why = "it was started this tick"
        elif job is not None and delayed_for_placement(job):
            why = fresh_delay(job, config)
        if why:
            note(f"agent: job {job_id}: start now refused: {why}")
            return False
        try:
            slurm.run.output(
                ["scontrol", "update", f"JobId={job_id}", "StartTime=now"],
                config.slurm_timeout_seconds,
            )
        except AgentError as exc:
            note(f"agent: job {job_id}: start now failed: {exc}")
            return False
        started.add(job_id)
        return True

    return start_now


def fresh_delay(job: QueuedJob, config: AgentConfig) -> str:
    """Why the job's record, read now, is no placement delay ("" when it is one): its
    owner's, pending on a begin time (or for no reason yet, just after a change) at most
    PLACEMENT_DELAY_LIMIT s after its submission (EligibleTime, the begin time itself),
    neither held nor waiting on a dependency, never requeued (a requeued job
    waits out Slurm's requeue delay, which lets its old run's credential expire)."""
    timeout = config.slurm_timeout_seconds
    try:
        # One line, no key twice: a name with a line break or `x Restarts=0` is no record.
        found = slurm.jobs.job_alone(job.job_id, timeout, env=slurm.run.EPOCH_TIMES)
    except AgentError as exc:
        return f"its record could not be read ({exc})"
    record = found or {}
    submitted = slurm.times.epoch_seconds(record.get("SubmitTime", ""))
    begins = slurm.times.epoch_seconds(record.get("EligibleTime", ""))
    if record.get("UserId", "").split("(")[0] != job.user:
        return "its record is not its owner's as read"
    if record.get("Restarts") != "0":
        return "it was requeued (it waits out Slurm's requeue delay)"
    # Reason None: Slurm resets a pending job's reason when the job is changed (as the
    # plug-in's own narrowing just did) until its next scheduling pass reads BeginTime.
    if record.get("JobState") != "PENDING" or record.get("Reason") not in ("BeginTime", "None"):
        return "it no longer waits for a begin time"
    if not (submitted > 0 and 0 < begins - submitted <= PLACEMENT_DELAY_LIMIT):
        return "its begin time is its owner's, not a placement delay"
    return ""
