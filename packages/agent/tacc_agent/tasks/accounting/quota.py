"""`tacc-agent quota`: the caller's limits and usage as Slurm's accounting keeps them
(associations, QoS, fair share) plus what they hold in the queue right now. The limits
are set by ops from inventory (the slurm role's slurm_accounts and slurm_qos)."""

from __future__ import annotations

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.slurm import accounting
from tacc_agent.tasks.schedule.queue_ticks import read_queue
from tacc_agent.tasks.store import workspace

ASSOC = ("Account", "Fairshare", "QOS", "DefaultQOS", "MaxTRES", "MaxJobs", "MaxWall")
QOS = (
    "Name",
    "Priority",
    "MaxWall",
    "MaxTRESPU",
    "MaxJobsPU",
    "Preempt",
    "PreemptMode",
    "UsageFactor",
)
SHARE = ("Account", "User", "RawShares", "NormShares", "RawUsage", "EffectvUsage", "FairShare")


def in_queue(user: str, config: AgentConfig) -> dict:
    jobs = read_queue(config, user)
    running = [job for job in jobs if job.state == "RUNNING"]
    return {
        "running_jobs": len(running),
        "pending_jobs": sum(job.state == "PENDING" for job in jobs),
        "gpus_in_use": sum(job.gpus for job in running),
    }


def quota(config: AgentConfig) -> dict:
    user = workspace.current_user()
    timeout = config.slurm_timeout_seconds
    result: dict = {"user": user, **in_queue(user, config)}
    try:
        assoc = accounting.sacctmgr_show(["assoc", "where", f"user={user}"], ASSOC, timeout)
        qos = accounting.sacctmgr_show(["qos"], QOS, timeout)
        share = accounting.shares(user, SHARE, timeout)
    except AgentError as exc:
        result.update(accounting=False, message=f"no accounting on this cluster ({exc})")
        return result
    associations = accounting.named(assoc, ASSOC)
    names = {q for a in associations for q in a["QOS"].split(",") if q}
    result.update(
        accounting=True,
        associations=associations,
        qos=[q for q in accounting.named(qos, QOS) if q["Name"] in names],
        fairshare=[s for s in accounting.named(share, SHARE) if s["User"].strip() == user],
    )
    return result
