"""Elastic size (Elastic-KubeFlow's point): a task may give a node range
(`nodes: 2-4`). At submit the scheduling hook picks the size from the partition's
state (`Submission.partition_load`, which the agent reads from Slurm): the whole
range's maximum while there are that many idle nodes and nothing waits for nodes (grow
when the cluster is idle), the minimum when jobs wait for nodes (shrink when the queue
waits), else as many as are idle. Slurm gets `--nodes=SIZE-MAX` (it allocates the
smallest count it can, so the size is the plug-in's choice, and Slurm keeps the range
in the job record); the execution layer tells the program the size it got
(TACC_NUM_NODES, WORLD_SIZE, torchrun --nnodes).

Running jobs change size too, where ops turn it on (`plugin_settings.elastic.resize:
true`, the controller's tick) and the task allows it (`resources.resize: true`: its
program saves at the checkpoint signal and resumes, at whatever size it gets). Slurm
cannot grow a running allocation, so a job is resized by checkpoint and requeue at the
new size (`Queue.resize`), which every launcher and program that resumes can take:

- grow: nodes of its partition have been idle for `grow_after_seconds` while no job
  waits there: a job below its maximum grows by as many (up to it);
- shrink: jobs have waited for nodes there for `shrink_after_seconds`: a job above its
  minimum gives up what the first of them lacks (down to its minimum);
- a job is resized only after running `min_run_seconds` since it last started, at
  most once per `cooldown_seconds`, and one job per tick.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tacc_contract.fields import Field
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugin_settings import bad_setting, is_number, known_settings
from tacc_contract.plugins import (
    NOT_WAITING_FOR_NODES,
    Launch,
    Node,
    Plugin,
    Queue,
    QueuedJob,
    Submission,
)

RANGE = re.compile(r"(\d+)-(\d+)")
EXPECTED = "a node count >= 1, or a range like 2-4"


def node_range(value: object) -> tuple[int, int] | None:
    """(min, max) of a node count (3) or range ("2-4"); None when it is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value) if value >= 1 else None
    match = RANGE.fullmatch(str(value).strip())
    if not match:
        return None
    low, high = int(match.group(1)), int(match.group(2))
    return (low, high) if 1 <= low <= high else None


def check_nodes(value: object) -> str | None:
    return None if node_range(value) else EXPECTED


def min_nodes(resources: dict) -> int:
    found = node_range(resources.get("nodes", 1))
    return found[0] if found else 1


STATE_FILE = "elastic.json"
RESIZE = "resize"
MAX_GAP_SECONDS = 300.0  # the longest a tick may count as one stretch of idle or waiting


@dataclass(frozen=True)
class Settings:
    """plugin_settings.elastic, each key checked (a bad one stops the tick)."""

    resize: bool = False
    grow_after_seconds: float = 30.0
    shrink_after_seconds: float = 30.0
    min_run_seconds: float = 60.0
    cooldown_seconds: float = 120.0

    KEYS: ClassVar[tuple[str, ...]] = ("resize", "grow_after_seconds", "shrink_after_seconds",
                                       "min_run_seconds", "cooldown_seconds")  # fmt: skip


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


def idle_nodes(nodes: list[Node], partition: str) -> int:
    return sum(1 for node in nodes if partition in node.partitions and node.idle())


def waiting_jobs(jobs: list[QueuedJob], partition: str) -> list[QueuedJob]:
    """Pending jobs of the partition waiting for nodes, the first to arrive first."""
    found = [job for job in jobs if job.state == "PENDING"
             and partition in job.partition.split(",")
             and not job.reason.startswith(NOT_WAITING_FOR_NODES)]  # fmt: skip
    return sorted(found, key=lambda job: int(job.job_id) if job.job_id.isdigit() else 1 << 62)


def stretch(state: dict, key: str, on: bool, now: float) -> float:
    """How long `on` has held at successive ticks (0 when it does not now)."""
    since = state.setdefault("since", {})
    last = state.get("ticked_at")
    if not on or (last is not None and now - last > MAX_GAP_SECONDS):
        since.pop(key, None)
        if not on:
            return 0.0
    started = since.setdefault(key, now)
    return now - started


def resizable(job: QueuedJob, state: dict, found: Settings, now: float) -> bool:
    last = state.setdefault("resized", {}).get(job.job_id)
    return (job.state == "RUNNING" and RESIZE in job.opted_in and job.node_range is not None
            and job.elapsed_seconds >= found.min_run_seconds
            and (last is None or now - last >= found.cooldown_seconds))  # fmt: skip


def decide(queue: Queue, nodes: list[Node], state: dict,
           found: Settings) -> tuple[QueuedJob, int, str] | None:  # fmt: skip
    """The one resize of this tick: (job, new size, why), or None."""
    now = queue.now
    partitions = sorted({p for job in queue.jobs if RESIZE in job.opted_in
                         for p in job.partition.split(",")})  # fmt: skip
    for partition in partitions:
        idle = idle_nodes(nodes, partition)
        waiting = waiting_jobs(queue.jobs, partition)
        grown_for = stretch(state, f"idle:{partition}", idle > 0 and not waiting, now)
        waited_for = stretch(state, f"waiting:{partition}", bool(waiting), now)
        mine = [job for job in queue.jobs if partition in job.partition.split(",")
                and resizable(job, state, found, now)]  # fmt: skip
        if waiting and waited_for >= found.shrink_after_seconds:
            lacking = max(waiting[0].nodes - idle, 1)
            shrinkable = [job for job in mine if job.nodes > job.node_range[0]]
            if shrinkable:
                job = max(shrinkable, key=lambda j: (j.nodes - j.node_range[0], j.job_id))
                size = max(job.node_range[0], job.nodes - lacking)
                return (
                    job,
                    size,
                    (
                        f"resized by elastic: shrink {job.nodes} -> {size} nodes "
                        f"(job {waiting[0].job_id} waits {waited_for:.0f} s)"
                    ),
                )
        elif idle and not waiting and grown_for >= found.grow_after_seconds:
            growable = [job for job in mine if job.nodes < job.node_range[1]]
            if growable:
                job = min(growable, key=lambda j: (j.nodes, j.job_id))
                size = min(job.node_range[1], job.nodes + idle)
                return (
                    job,
                    size,
                    (
                        f"resized by elastic: grow {job.nodes} -> {size} nodes "
                        f"({idle} idle for {grown_for:.0f} s)"
                    ),
                )
    return None


class Elastic(Plugin):
    name = "elastic"
    order = 20
    layers = ("schema", "schedule", "execute")
    summary = (
        "nodes: 2-4 -> sbatch --nodes=2-4; the program learns the size it got; "
        "resize: true -> grown and shrunk while running (plugin_settings.elastic)"
    )
    fields: ClassVar[dict[str, Field]] = {
        "resources.nodes": Field("any", default=1, check=check_nodes, expected=EXPECTED),
        "resources.resize": Field("bool", default=False),
    }

    def check(self, task, problem) -> None:
        res = task["resources"]
        low, high = node_range(res["nodes"]) or (1, 1)
        res["nodes"] = low if low == high else f"{low}-{high}"
        if res.get("resize") and low == high:
            problem("resources.resize", "resizing needs a node range: set nodes: MIN-MAX")

    def tick(self, queue: Queue) -> None:
        found = settings_from(queue.config)
        if not found.resize or queue.state_dir is None:
            return
        path = Path(queue.state_dir) / STATE_FILE
        state = read_json(path) or {}
        present = {job.job_id for job in queue.jobs}
        state["resized"] = {k: v for k, v in dict(state.get("resized") or {}).items()
                            if k in present and isinstance(v, int | float)}  # fmt: skip
        if not isinstance(state.get("since"), dict):
            state["since"] = {}
        choice = None
        if any(RESIZE in job.opted_in for job in queue.jobs):
            choice = decide(queue, queue.cluster_nodes(), state, found)
        else:
            state["since"] = {}
        state["ticked_at"] = queue.now
        if choice:
            job, size, why = choice
            state["resized"][job.job_id] = queue.now
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, state)  # before the requeue: a tick killed in it keeps the cooldown
            if queue.resize(job.job_id, size, why):
                queue.notes.append(
                    f"elastic: job {job.job_id} {why.removeprefix('resized by elastic: ')}"
                )
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, state)

    def schedule(self, submission: Submission) -> None:
        nodes = submission.task.resources["nodes"]
        if not isinstance(nodes, str):
            return
        low, high = node_range(nodes) or (1, 1)
        load = submission.partition_load(submission.partition)
        idle, pending = load.idle_nodes, load.waiting_jobs
        size = low if pending else max(low, min(high, idle))
        submission.options["nodes"] = f"{size}-{high}"
        if submission.task.resources.get("resize"):
            submission.data[self.name] = {"opt_in": [RESIZE], "range": [low, high]}
        why = f"{pending} job(s) waiting" if pending else f"{idle} idle node(s)"
        submission.note(self.name, f"{size} of {nodes} nodes ({why})")

    def execute(self, launch: Launch) -> None:
        nodes = launch.task.resources["nodes"]
        if isinstance(nodes, str):
            low, high = node_range(nodes) or (1, 1)
            launch.env.update(TACC_NODES_MIN=str(low), TACC_NODES_MAX=str(high))
            launch.note(self.name, f"{len(launch.nodes)} node(s) of {nodes}")
