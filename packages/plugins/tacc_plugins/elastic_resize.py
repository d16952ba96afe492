"""Resizing running jobs, the `elastic` plug-in's tick (Elastic-KubeFlow's policy: grow
when nodes idle, shrink when jobs wait), where ops turn it on
(`plugin_settings.elastic.resize: true`) and the task allows it (`resources.resize:
true`: its program saves at the checkpoint signal and resumes at whatever size).

Slurm cannot grow a running allocation, so a job is resized by checkpoint and requeue at
the new size (`Queue.resize`). Per partition (a job counts in the first it names):

- grow: nodes have been idle for `grow_after_seconds` while no job waits for nodes: the
  smallest resizable job below its maximum grows by the idle count (up to it);
- shrink: the job Slurm would start next (reason Resources; else the first waiting for
  Priority) has waited `shrink_after_seconds` and the idle nodes are too few for it: the
  resizable job furthest above its minimum gives up what it lacks (down to its
  minimum), when the jobs above their minimums together could make it fit;
- a job is resized only after running `min_run_seconds` since it last started, at most
  once per `cooldown_seconds`, one job per tick;
- a resize is in flight until the job runs again: its nodes are spoken for (nothing else
  grows in that partition, and the stretches start again). A job still waiting for
  nodes `revert_after_seconds` after its resize (someone took them) is set back to its
  old size.

Only jobs pending for Resources or Priority wait for nodes: a job held, on a dependency,
at its start time (a requeued job's credential delay), or over a QOS or account limit
does not, and shrinks nobody.

A job's `node_range` is what its owner's record says (plugin_data.elastic.range), a file
she can rewrite: this tick only proposes. The agent's `Queue.resize` decides
(tacc_agent/tasks/schedule/preempt.py): it keeps to the range it recorded for the job (its
maximum no higher than Slurm's) and grows a job only within Slurm's QOS, association and
partition limits; a resize it refuses is a note, and the job is not resized.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugin_settings import bad_setting, is_number, known_settings
from tacc_contract.plugins import WAITS_FOR_NODES, Node, Queue, QueuedJob, arrival

STATE_FILE = "elastic.json"
RESIZE = "resize"
MAX_GAP_SECONDS = 300.0  # the longest a tick may count as one stretch of idle or waiting
FORGET_SECONDS = 600.0
PREFIX = "resized by elastic: "


@dataclass(frozen=True)
class Settings:
    """plugin_settings.elastic, each key checked (a bad one stops the tick)."""

    resize: bool = False
    grow_after_seconds: float = 30.0
    shrink_after_seconds: float = 30.0
    min_run_seconds: float = 60.0
    cooldown_seconds: float = 120.0
    revert_after_seconds: float = 180.0

    KEYS: ClassVar[tuple[str, ...]] = (
        "resize",
        "grow_after_seconds",
        "shrink_after_seconds",
        "min_run_seconds",
        "cooldown_seconds",
        "revert_after_seconds",
    )


def settings_from(config: object) -> Settings:
    given = known_settings(config, "elastic", Settings.KEYS)
    if not isinstance(given.get("resize", False), bool):
        raise bad_setting("elastic", "resize", "true or false", given["resize"])
    values = {}
    for key in Settings.KEYS[1:]:
        value = given.get(key, getattr(Settings, key))
        if not is_number(value) or value < 0:
            raise bad_setting("elastic", key, "a number of seconds >= 0", value)
        values[key] = float(value)
    return Settings(given.get("resize", False), **values)


def home(job: QueuedJob) -> str:
    """The partition a job counts in: the first it names."""
    return job.partition.split(",")[0]


# --- the state file ----------------------------------------------------------------------


def valid_flight(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("partition"), str)
        and all(is_number(entry.get(k)) for k in ("size", "old", "at"))
    )


def load_state(path: Path, present: set[str], now: float) -> dict:
    """elastic.json, every entry checked (a damaged one dropped, never the tick). A job
    out of the queue is forgotten FORGET_SECONDS on (a requeued job is out of squeue's
    view for a moment)."""
    data = read_json(path)
    data = data if isinstance(data, dict) else {}

    def numbers(part: str) -> dict:
        found = data.get(part)
        return {
            str(k): v for k, v in (found if isinstance(found, dict) else {}).items() if is_number(v)
        }

    flights = data.get("in_flight")
    return {
        "since": numbers("since"),
        "resized": {
            k: v for k, v in numbers("resized").items() if k in present or now - v < FORGET_SECONDS
        },
        "in_flight": {
            str(k): v
            for k, v in (flights if isinstance(flights, dict) else {}).items()
            if valid_flight(v) and (k in present or now - v["at"] < FORGET_SECONDS)
        },
        "ticked_at": data.get("ticked_at") if is_number(data.get("ticked_at")) else None,
    }


def stretch(state: dict, key: str, on: bool, now: float) -> float:
    """How long `on` has held at successive ticks (0 when it does not now)."""
    since = state["since"]
    last = state["ticked_at"]
    if not on or (last is not None and now - last > MAX_GAP_SECONDS):
        since.pop(key, None)
        if not on:
            return 0.0
    return now - since.setdefault(key, now)


# --- the decision --------------------------------------------------------------------------


@dataclass(frozen=True)
class Resize:
    job: QueuedJob
    size: int
    why: str


def idle_nodes(nodes: list[Node], partition: str) -> int:
    return sum(1 for node in nodes if partition in node.partitions and node.idle())


def waiting_jobs(jobs: list[QueuedJob], partition: str) -> list[QueuedJob]:
    """Jobs of the partition pending for nodes, the one Slurm starts next first."""
    found = [
        job
        for job in jobs
        if job.state == "PENDING" and home(job) == partition and job.reason in WAITS_FOR_NODES
    ]
    return sorted(found, key=lambda job: (job.reason != "Resources", arrival(job)))


def resizable(job: QueuedJob, state: dict, found: Settings, now: float) -> bool:
    last = state["resized"].get(job.job_id)
    return (
        job.state == "RUNNING"
        and RESIZE in job.opted_in
        and job.node_range is not None
        and job.elapsed_seconds >= found.min_run_seconds
        and (last is None or now - last >= found.cooldown_seconds)
    )


def shrink(mine: list[QueuedJob], first: QueuedJob, idle: int, waited: float) -> Resize | None:
    need = first.nodes - idle
    if need <= 0:
        return None  # the idle nodes would do: it waits for something else
    shrinkable = [job for job in mine if job.nodes > job.node_range[0]]
    if sum(job.nodes - job.node_range[0] for job in shrinkable) < need:
        return None  # shrinking everything could not make it fit
    job = max(shrinkable, key=lambda j: (j.nodes - j.node_range[0], tuple(-n for n in arrival(j))))
    size = max(job.node_range[0], job.nodes - need)
    return Resize(
        job,
        size,
        f"{PREFIX}shrink {job.nodes} -> {size} nodes (job {first.job_id} waits {waited:.0f} s)",
    )


def grow(mine: list[QueuedJob], idle: int, idled: float) -> Resize | None:
    growable = [job for job in mine if job.nodes < job.node_range[1]]
    if not growable:
        return None
    job = min(growable, key=lambda j: (j.nodes, arrival(j)))
    size = min(job.node_range[1], job.nodes + idle)
    return Resize(
        job, size, f"{PREFIX}grow {job.nodes} -> {size} nodes ({idle} idle for {idled:.0f} s)"
    )


def decide(queue: Queue, nodes: list[Node], state: dict, found: Settings) -> Resize | None:
    """The one resize of this tick, or None; every partition's stretches are kept up."""
    now = queue.now
    flying = {entry["partition"] for entry in state["in_flight"].values()}
    partitions = sorted({home(job) for job in queue.jobs if RESIZE in job.opted_in})
    choices = []
    for partition in partitions:
        idle = idle_nodes(nodes, partition)
        waiting = waiting_jobs(queue.jobs, partition)
        calm = partition not in flying
        idled = stretch(state, f"idle:{partition}", calm and idle > 0 and not waiting, now)
        waited = stretch(state, f"waiting:{partition}", calm and bool(waiting), now)
        if not calm:
            continue  # a resize in flight: its nodes are spoken for
        mine = [
            job
            for job in queue.jobs
            if home(job) == partition and resizable(job, state, found, now)
        ]
        if waiting and waited >= found.shrink_after_seconds:
            choices.append(shrink(mine, waiting[0], idle, waited))
        elif idle and not waiting and idled >= found.grow_after_seconds:
            choices.append(grow(mine, idle, idled))
    return next((choice for choice in choices if choice), None)


# --- a resize in flight ----------------------------------------------------------------------


def land(queue: Queue, state: dict, found: Settings) -> None:
    """Resizes in flight: done once the job runs (or is gone); one still waiting for nodes
    `revert_after_seconds` on is set back to its old size (someone took the nodes)."""
    jobs = {job.job_id: job for job in queue.jobs}
    for job_id, entry in list(state["in_flight"].items()):
        job = jobs.get(job_id)
        if job is None:
            continue  # out of squeue's view for a moment, or gone (load_state forgets it)
        if job.state != "PENDING":
            del state["in_flight"][job_id]  # it runs again: landed
            continue
        waited = queue.now - entry["at"]
        if job.reason in WAITS_FOR_NODES and waited >= found.revert_after_seconds:
            del state["in_flight"][job_id]
            old = int(entry["old"])
            why = f"{PREFIX}back to {old} nodes ({int(entry['size'])} not free in {waited:.0f} s)"
            if queue.resize(job_id, old, why):
                queue.notes.append(f"elastic: job {job_id} {why.removeprefix(PREFIX)}")


def tick(queue: Queue) -> None:
    found = settings_from(queue.config)
    if not found.resize or queue.state_dir is None:
        return
    path = Path(queue.state_dir) / STATE_FILE
    state = load_state(path, {job.job_id for job in queue.jobs}, queue.now)
    land(queue, state, found)
    choice = None
    if any(RESIZE in job.opted_in for job in queue.jobs):
        choice = decide(queue, queue.cluster_nodes(), state, found)
    else:
        state["since"] = {}
    state["ticked_at"] = queue.now
    if choice:
        job = choice.job
        partition = home(job)
        state["resized"][job.job_id] = queue.now
        state["in_flight"][job.job_id] = {
            "partition": partition,
            "size": choice.size,
            "old": job.nodes,
            "at": queue.now,
        }
        for key in (f"idle:{partition}", f"waiting:{partition}"):
            state["since"].pop(key, None)
        save(path, state)  # before the requeue: a tick killed in it keeps the cooldown
        if queue.resize(job.job_id, choice.size, choice.why):
            queue.notes.append(f"elastic: job {job.job_id} {choice.why.removeprefix(PREFIX)}")
        else:
            state["in_flight"].pop(job.job_id, None)
    save(path, state)


def save(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)  # atomic: a tick killed mid-write leaves the old state
