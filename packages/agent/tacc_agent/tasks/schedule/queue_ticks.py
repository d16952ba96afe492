"""The scheduling plug-ins' `tick`: read Slurm's queue, let each plug-in react, act
through Slurm (`scontrol update JobId=... Nice=...`). Run by the agent daemon every
`queue_tick_seconds` where that is set (the controller), or once with
`tacc-agent queue-tick`."""

from __future__ import annotations

import fcntl
import os
import re
import secrets
import time
from pathlib import Path
from typing import NamedTuple

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.hostlist import expand_hostlist
from tacc_agent.slurm import elapsed_seconds, epoch_seconds
from tacc_agent.tasks.schedule import preempt
from tacc_agent.tasks.schedule.cluster_shape import read_nodes
from tacc_agent.tasks.schedule.constraints import Narrowing
from tacc_agent.tasks.schedule.early_start import starter
from tacc_contract.plugins import Node, Queue, QueuedJob
from tacc_contract.registry import PluginError, in_layer, select

# squeue --Format fields, each printed whole (size 0) and ended by "|". A job's GPUs are
# spelled in one of four places: tres-alloc (what a running job holds, gres/gpu=N when
# Slurm accounts gres/gpu; what it asks for while pending), tres-per-job (--gpus),
# tres-per-node (--gres=gpu:N, --gpus-per-node) and tres-per-task (--gpus-per-task).
# Reason comes last: it is Slurm's reason word ("Resources") or, when Slurm has one, the
# job's state description, free text that may hold a "|"; the line's rest is its.
FIELDS = (
    "JobArrayID",
    "UserName",
    "State",
    "Nice",
    "NumNodes",
    "NumTasks",
    "tres-alloc",
    "tres-per-job",
    "tres-per-node",
    "tres-per-task",
    "TimeUsed",
    "Partition",
    "Reason",
)
REQUIRED = 11  # fields up to TimeUsed: a line without the later ones still counts
FORMAT = ",".join(f"{name}:0|" for name in FIELDS)
# A second read, for what a constraint ("a100|h100") or a name would cut apart in the
# first: words split by a space (none of the first seven holds one), the name last (free
# text its owner wrote, which may hold line breaks). Each record starts with a word
# chosen afresh for each read, so no name can start a record of its own: a line without
# it continues the name before it. %V: submit time, %S: start time (a pending job's
# begin time while it waits for it), both read as epoch seconds (slurm.EPOCH_TIMES).
DETAILS = "%i %u %l %N %V %S %f %j"
DETAIL_JOB = re.compile(r"\d+(?:_\d+)?")  # one job or one array task (not "12_[3-9]")
DETAIL_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$-]*")
DETAIL_NODES = re.compile(r"[A-Za-z0-9_.,\[\]-]*")
DETAIL_TIME = re.compile(r"[0-9]+|N/A|Unknown|None")
COUNT = re.compile(r"\d+")
LOCK_FILE = "queue-tick.lock"


def gres_name(key: str) -> list[str]:
    """A TRES or gres name without its "gres" part: gres/gpu:a100 -> [gpu, a100]."""
    parts = key.strip().replace("/", ":").split(":")
    return parts[1:] if parts[0] == "gres" else parts


def allocated_gpus(tres: str) -> int | None:
    """GPUs in a TRES list ("cpu=8,node=2,gres/gpu=8,gres/gpu:a100=8"): the untyped total,
    else the typed counts summed; None when it names no GPU."""
    total, typed = None, None
    for item in tres.split(","):
        key, sep, value = item.partition("=")
        name = gres_name(key)
        if not sep or name[0] != "gpu" or not COUNT.fullmatch(value.strip()):
            continue
        if len(name) == 1:
            total = (total or 0) + int(value)
        else:
            typed = (typed or 0) + int(value)
    return total if total is not None else typed


def requested_gpus(spec: str) -> int:
    """GPUs in one tres-per-* request ("gres:gpu:2", "gres/gpu:a100:2", "gpu", "N/A")."""
    count = 0
    for item in spec.split(","):
        name = gres_name(item)
        if name[0] == "gpu":
            count += int(name[-1]) if len(name) > 1 and COUNT.fullmatch(name[-1]) else 1
    return count


def job_gpus(alloc: str, per_job: str, per_node: str, per_task: str, nodes: int, tasks: int) -> int:
    """The job's GPUs on all its nodes, whichever way they were asked for."""
    allocated = allocated_gpus(alloc)
    if allocated is not None:
        return allocated
    return max(
        requested_gpus(per_job), requested_gpus(per_node) * nodes, requested_gpus(per_task) * tasks
    )


def line_fields(line: str) -> list[str]:
    """A line's fields: each ended by "|", the last (Reason) keeps any "|" of its own."""
    line = line.strip()
    line = line[:-1] if line.endswith("|") else line
    return [part.strip() for part in line.split("|", len(FIELDS) - 1)]


def parse_queue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line_fields(line)
        if len(parts) < REQUIRED or not parts[4].isdigit():
            continue
        parts += [""] * (len(FIELDS) - len(parts))
        (
            job_id,
            user,
            state,
            nice,
            nodes,
            tasks,
            alloc,
            per_job,
            per_node,
            per_task,
            elapsed,
            partition,
            reason,
        ) = parts
        count = int(nodes)
        gpus = job_gpus(
            alloc, per_job, per_node, per_task, count, int(tasks) if tasks.isdigit() else count
        )
        jobs.append(
            QueuedJob(
                job_id,
                user,
                state,
                int(nice) if nice.lstrip("-").isdigit() else 0,
                gpus,
                elapsed_seconds(elapsed),
                nodes=count,
                partition=partition,
                reason="" if reason == "None" else reason,
            )
        )
    return jobs


def read_queue(config: AgentConfig, user: str = "") -> list[QueuedJob]:
    """Pending and running jobs (array tasks one by one), everybody's or `user`'s."""
    who = [f"--user={user}"] if user else []
    out = slurm.slurm(
        ["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", *who, f"--Format={FORMAT}"],
        config.slurm_timeout_seconds,
    )
    return parse_queue(out)


class Details(NamedTuple):
    user: str
    name: str
    features: str
    limit: int  # seconds
    nodes: tuple[str, ...]
    submit_time: float  # epoch seconds, 0 when not known
    start_time: float


def parse_details(text: str, start: str) -> dict[str, Details]:
    """job -> its Details from squeue -o "START DETAILS": a line starting with START
    begins a record, any other line goes on the name before it. A record whose fields
    are not what Slurm prints is left out."""
    records: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith(start + " "):
            records.append(line[len(start) + 1 :].split(" ", 7))
        elif records:
            records[-1][-1] += "\n" + line
    found: dict[str, Details] = {}
    for parts in records:
        if len(parts) < 8:
            continue
        job_id, user, limit, nodelist, submitted, starts, features, name = parts
        if not (
            DETAIL_JOB.fullmatch(job_id)
            and DETAIL_USER.fullmatch(user)
            and DETAIL_NODES.fullmatch(nodelist)
            and DETAIL_TIME.fullmatch(submitted)
            and DETAIL_TIME.fullmatch(starts)
        ):
            continue
        found[job_id] = Details(
            user,
            name.rstrip("\n"),
            "" if features == "(null)" else features,
            elapsed_seconds(limit),
            tuple(expand_hostlist(nodelist)),
            epoch_seconds(submitted),
            epoch_seconds(starts),
        )
    return found


def read_details(jobs: list[QueuedJob], config: AgentConfig) -> None:
    """Each job's name, constraint, time limit and nodes, from one more squeue."""
    start = secrets.token_hex(8)
    out = slurm.slurm(
        ["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", "-o", f"{start} {DETAILS}"],
        config.slurm_timeout_seconds,
        env=slurm.EPOCH_TIMES,
    )
    details = parse_details(out, start)
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
# written once, at submit): (job, owner uid, job directory) -> (opt-ins, node range).
Allowed = dict[tuple[str, int, str], tuple[frozenset[str], tuple[int, int] | None]]


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
    state_dir = Path(config.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    lock = os.open(state_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return tick_locked(config, plugins, {} if allowed is None else allowed)
    finally:
        os.close(lock)


def tick_locked(config: AgentConfig, plugins: list, allowed: Allowed) -> list[str]:
    def set_nice(job_id: str, nice: int) -> None:
        slurm.slurm(
            ["scontrol", "update", f"JobId={job_id}", f"Nice={nice}"], config.slurm_timeout_seconds
        )

    queue = Queue(read_queue(config), set_nice, time.time(), Path(config.state_dir), config)
    queue.requeue = lambda job_id, reason: preempt.requeue(
        job_id, reason, config, queue.notes.append
    )
    queue.resize = lambda job_id, nodes, reason: preempt.requeue(
        job_id, reason, config, queue.notes.append, nodes=nodes
    )
    queue.set_features = Narrowing(
        queue.jobs,
        Path(config.state_dir),
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
    return queue.notes


def read_records(queue: Queue, config: AgentConfig, allowed: Allowed) -> None:
    """From one `scontrol show job`: the jobs that ended (Queue.ended), and each running
    job's opt-ins and node range (preempt.allowed_job), its record read once (kept in
    `allowed` while the job runs); a Slurm that does not answer leaves them empty, with
    a note."""
    running = [job for job in queue.jobs if job.state == "RUNNING"]
    try:
        known = preempt.job_records(config)
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
        if key not in allowed:
            found = preempt.allowed_job(record)
            if found[0] or found[1]:  # nothing allowed may be a read that failed: again
                allowed[key] = found
        job.opted_in, job.node_range = allowed.get(key, (frozenset(), None))
    for key in [key for key in allowed if key not in keys]:
        del allowed[key]
