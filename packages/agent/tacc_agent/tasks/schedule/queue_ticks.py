"""The scheduling plug-ins' `tick`: read Slurm's queue, let each plug-in react, act
through Slurm (`scontrol update JobId=... Nice=...`). Run by the agent daemon every
`queue_tick_seconds` where that is set (the controller), or once with
`tacc-agent queue-tick`."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

from tacc_agent import locks, slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.schedule import preempt
from tacc_agent.tasks.schedule.cluster_shape import read_nodes
from tacc_agent.tasks.schedule.constraints import Narrowing
from tacc_agent.tasks.schedule.early_start import starter
from tacc_contract.plugins import Node, Queue, QueuedJob
from tacc_contract.registry import PluginError, in_layer, select

LOCK_FILE = "queue-tick.lock"


def read_queue(config: AgentConfig, user: str = "") -> list[QueuedJob]:
    """Pending and running jobs (array tasks one by one), everybody's or `user`'s."""
    return slurm.queue.queued_jobs(config.slurm_timeout_seconds, user)


def read_details(jobs: list[QueuedJob], config: AgentConfig) -> None:
    """Each job's name, constraint, time limit and nodes, from one more squeue."""
    details = slurm.queue.queue_details(config.slurm_timeout_seconds)
    for job in jobs:
        info = details.get(job.job_id)
        if info and info.user == job.user:
            job.name, job.features, job.time_limit_seconds = info.name, info.features, info.limit
            job.node_names, job.submit_time, job.start_time = (
                info.nodes,
                info.submit_time,
                info.start_time,
            )
            job.details = True


# What a running job's record allowed, kept across the daemon's ticks (the record is
# written once, at submit): (job, owner uid, job directory) -> (opt-ins, node range, when
# to read it again). A record that allowed nothing may be a read that failed (NFS): it is
# read again EMPTY_REREAD_SECONDS later, not at every tick (where root may not read the
# users' directories, each read is a process as the owner: thousands of running jobs that
# opted in to nothing were thousands of processes a tick).
Allowed = dict[tuple[str, int, str], tuple[frozenset[str], tuple[int, int] | None, float]]
EMPTY_REREAD_SECONDS = 60.0


def tick(config: AgentConfig, allowed: Allowed | None = None) -> list[str]:
    """One round of every `tick` hook that is on; what each changed. `allowed` keeps
    the running jobs' opt-ins from one tick to the next (the daemon's); without it each
    running job's record is read again. One tick at a time (a lock in the state
    directory: the daemon's and a `tacc-agent queue-tick` by hand never interleave); a
    plug-in whose tick fails is a note, and the others still run."""
    try:
        plugins = in_layer(select(config.plugins, policy_from=config.plugins), "schedule")
    except PluginError as exc:
        raise Rejected(str(exc), "plugins") from None
    state_dir = Path(config.queue_state_dir)
    if not config.cluster_state_dir:
        state_dir.mkdir(parents=True, exist_ok=True)
    elif not state_dir.is_dir():  # made by the role on shared storage: never a local stand-in
        raise Rejected(
            f"cluster_state_dir {state_dir} is missing: is the controllers' shared storage "
            "mounted?",
            "cluster_state_dir",
        )
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW  # the daemon's own directory: flock
    with locks.lock_file(state_dir / LOCK_FILE, locks.FLOCK, wait=True, flags=flags):
        return tick_locked(config, plugins, {} if allowed is None else allowed)


class NiceChanges:
    """The nice values a plug-in sets in its tick, sent to Slurm when the tick returns:
    one `scontrol update` per value (and slurm.jobs.NICE_BATCH jobs), not one process
    per job (a first tick of LAS on 10,000 pending jobs was 10,000 of them)."""

    def __init__(self, timeout: float, note: Callable[[str], None]) -> None:
        self.timeout, self.note = timeout, note
        self.wanted: dict[str, int] = {}

    def set(self, job_id: str, nice: int) -> None:
        self.wanted[job_id] = nice

    def send(self) -> None:
        by_value: dict[int, list[str]] = {}
        for job_id, nice in self.wanted.items():
            by_value.setdefault(nice, []).append(job_id)
        self.wanted = {}
        for nice, job_ids in sorted(by_value.items()):
            for problem in slurm.jobs.set_nice(job_ids, nice, self.timeout):
                self.note(f"agent: nice {nice} not set on every job: {problem}")


def tick_locked(config: AgentConfig, plugins: list, allowed: Allowed) -> list[str]:
    notes: list[str] = []
    nices = NiceChanges(config.slurm_timeout_seconds, notes.append)
    queue = Queue(
        read_queue(config), nices.set, time.time(), Path(config.queue_state_dir), config, notes
    )
    queue.requeue = lambda job_id, reason: preempt.requeue(
        job_id, reason, config, queue.notes.append
    )
    queue.resize = lambda job_id, nodes, reason: preempt.requeue(
        job_id, reason, config, queue.notes.append, nodes=nodes
    )
    queue.set_features = Narrowing(
        queue.jobs,
        Path(config.queue_state_dir),
        config.slurm_timeout_seconds,
        queue.notes.append,
        queue.now,
    ).set_features
    nodes: list[list[Node]] = []  # read once a tick, at the first plug-in that asks

    def cluster_nodes() -> list[Node]:
        if not nodes:
            nodes.append(read_nodes(config.slurm_timeout_seconds))
        return nodes[0]

    queue.cluster_nodes = cluster_nodes
    queue.start_now = starter(queue.jobs, config, queue.notes.append)
    if plugins:
        read_records(queue, config, allowed)
        try:
            read_details(queue.jobs, config)
        except AgentError as exc:
            queue.notes.append(f"agent: no job names, constraints or nodes this tick: {exc}")
    for plugin in plugins:
        try:
            plugin.tick(queue)
        except Exception as exc:  # one plug-in's failure is not every plug-in's
            queue.notes.append(f"{plugin.name}: tick failed: {type(exc).__name__}: {exc}")
        finally:
            nices.send()  # what it set, failed or not, before the next plug-in runs
    return queue.notes


def read_records(queue: Queue, config: AgentConfig, allowed: Allowed) -> None:
    """From one `scontrol show job`: the jobs that ended (Queue.ended), and each running
    job's opt-ins and node range (preempt.allowed_job), its record read once (kept in
    `allowed` while the job runs); a Slurm that does not answer leaves them empty, with
    a note."""
    running = [job for job in queue.jobs if job.state == "RUNNING"]
    # A job squeue showed pending is neither running nor ended: its record (most of the
    # queue's, on a busy cluster) is not parsed. Array tasks keep their records (squeue's
    # 12_3 is another id than scontrol's).
    pending = {job.job_id for job in queue.jobs if job.state == "PENDING"}
    try:
        known = preempt.job_records(config, pending)
    except AgentError as exc:
        queue.notes.append(f"agent: no job opt-ins this tick: {exc}")
        return
    queued = {job.job_id for job in queue.jobs}
    queue.ended = {
        job_id: (record.state, record.run_seconds)
        for job_id, record in known.items()
        if job_id not in queued and record.state not in ("PENDING", "RUNNING")
    }
    keys: set[tuple[str, int, str]] = set()
    for job in running:
        record = known.get(job.job_id)
        if record is None or record.user != job.user:  # squeue's owner, read apart
            continue
        key = (job.job_id, record.uid, str(record.job_dir))
        keys.add(key)
        if key not in allowed or allowed[key][2] <= queue.now:
            opted_in, node_range = preempt.allowed_job(record)
            again = math.inf if opted_in or node_range else queue.now + EMPTY_REREAD_SECONDS
            allowed[key] = (opted_in, node_range, again)
        job.opted_in, job.node_range, _ = allowed[key]
    for key in [key for key in allowed if key not in keys]:
        del allowed[key]
