"""Least-attained-service priority (Tiresias' discretized 2D-LAS, per user): the more
GPU time a user has attained, the lower the queue their pending jobs sit in. Attained
service is GPUs x seconds (node-seconds for jobs without GPUs, so CPU-only partitions
take part too), summed over the user's running jobs at every tick and kept in the
agent's state directory. A user's queue is the number of `las_thresholds` their service
has passed. Pending jobs get their queue through Slurm's nice value: the most attained
queue keeps nice 0 and each queue above it gets `las_nice_step` more priority (a
negative nice, which the agent may set as root), so the ordering works whether or not
the cluster's multifactor weights give jobs any base priority. Slurm's own
priority/multifactor does the rest: no home-made scheduler. Off by default; ops turn it
on with the agent's `plugins: [las]` and a `queue_tick_seconds` on the controller.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from tacc_agent import records
from tacc_plugins.api import Plugin, Queue

STATE_FILE = "las.json"


def load_state(path: Path) -> dict:
    data = records.read_json(path) or {}
    return {"attained": dict(data.get("attained", {})), "counted": dict(data.get("counted", {}))}


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    records.write_json(path, state)  # atomic: a tick killed mid-write leaves the old state


def account(state: dict, queue: Queue) -> None:
    """Add what each running job attained since the last tick (its elapsed time grows;
    a requeued job restarts at 0 and counts again from there)."""
    counted = state["counted"]
    running = {}
    for job in queue.jobs:
        if job.state != "RUNNING":
            continue
        before = counted.get(job.job_id, 0)
        delta = (
            job.elapsed_seconds - before if job.elapsed_seconds >= before else job.elapsed_seconds
        )
        weight = job.gpus if job.gpus > 0 else job.nodes
        state["attained"][job.user] = state["attained"].get(job.user, 0.0) + delta * weight
        running[job.job_id] = job.elapsed_seconds
    state["counted"] = running  # finished jobs drop out


def level(service: float, thresholds: list[float]) -> int:
    """0 for the least attained queue, len(thresholds) for the most."""
    return bisect.bisect_right(sorted(thresholds), service)


def nice_for(service: float, thresholds: list[float], step: int) -> int:
    """Less attained service, more priority: -step per queue above the last one."""
    return -(len(thresholds) - level(service, thresholds)) * step


class LeastAttainedService(Plugin):
    name = "las"
    layers = ("schedule",)
    summary = "Tiresias-style LAS: pending jobs of users with more GPU time get a higher nice"
    default_on = False
    policy = True

    def tick(self, queue: Queue) -> None:
        config = queue.config
        path = Path(queue.state_dir or ".") / STATE_FILE
        state = load_state(path)
        account(state, queue)
        thresholds = [float(t) for t in config.las_thresholds]
        for job in queue.jobs:
            if job.state != "PENDING":
                continue
            service = state["attained"].get(job.user, 0.0)
            nice = nice_for(service, thresholds, int(config.las_nice_step))
            if nice != job.nice:
                queue.set_nice(job.job_id, nice)
                queue.notes.append(f"las: job {job.job_id} of {job.user} ({service:.0f} "
                                   f"GPU-s) nice {job.nice} -> {nice}")  # fmt: skip
        save_state(path, state)
