"""Least-attained-service priority (Tiresias' discretized 2D-LAS, per user): the more
GPU time a user has attained, the lower the queue their pending jobs sit in. Attained
service is GPUs x seconds (node-seconds for jobs without GPUs, so CPU-only partitions
take part too), summed over the user's running jobs at every tick and kept in the
agent's state directory. A user's queue is the number of `las_thresholds` their service
has passed. Attained service decays: it halves every `las_half_life_seconds` (one day
by default; 0 keeps it forever), so last month's big run does not hold a user back
today. A job's GPUs are counted whichever way they were asked for (the agent reads them
from all of Slurm's spellings into `QueuedJob.gpus`).

Pending jobs get their queue through Slurm's nice value: the most attained queue gets no
adjustment and each queue above it gets `las_nice_step` more priority (a negative nice,
which the agent may set as root), so the ordering works whether or not the cluster's
multifactor weights give jobs any base priority. The adjustment is added on top of the
job's own nice (sbatch --nice, `scontrol update JobId=.. Nice=..` by its owner or an
admin), never in place of it: the state remembers, per job, the nice LAS set and the own
nice it was added to, and a nice that differs from the one LAS set is a new own nice.
Slurm's own priority/multifactor does the rest: no home-made scheduler. Off by default;
ops turn it on with the agent's `plugins: [las]` and a `queue_tick_seconds` on the
controller.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from tacc_contract.errors import AGENT_CLUSTER, AgentError
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugins import Plugin, Queue, QueuedJob

STATE_FILE = "las.json"
FORGOTTEN = 1.0  # GPU-seconds: a user whose decayed service falls below this is dropped
NICE_LIMIT = 2147483645  # Slurm's nice range is -NICE_LIMIT..NICE_LIMIT


def load_state(path: Path) -> dict:
    data = read_json(path) or {}
    return {
        "attained": dict(data.get("attained", {})),
        "counted": dict(data.get("counted", {})),
        "decayed_at": data.get("decayed_at"),
        "niced": dict(data.get("niced", {})),
    }


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)  # atomic: a tick killed mid-write leaves the old state


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


def decay(state: dict, now: float, half_life: float) -> None:
    """Attained service halves every `half_life` seconds since the last tick (0: never)."""
    last, state["decayed_at"] = state.get("decayed_at"), now
    if half_life <= 0 or last is None or now <= last:
        return
    factor = 0.5 ** ((now - last) / half_life)
    decayed = {user: service * factor for user, service in state["attained"].items()}
    state["attained"] = {user: s for user, s in decayed.items() if s >= FORGOTTEN}


def half_life_of(config: object) -> float:
    value = getattr(config, "las_half_life_seconds", 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise AgentError(
            f"agent config: las_half_life_seconds: expected 0 (no decay) or a "
            f"number of seconds above 0, got {value!r}",
            AGENT_CLUSTER,
        )
    return float(value)


def own_nice(job: QueuedJob, niced: dict) -> int:
    """The job's nice without LAS's adjustment: the one its owner or an admin gave it.
    The nice LAS set last tick, or the one the job had then ("from": the agent sends the
    changes after the tick, and one that did not reach Slurm leaves the old value), both
    mean the recorded own nice: an adjustment that failed is made again, never counted
    as the owner's."""
    ours = niced.get(job.job_id)
    if isinstance(ours, dict) and job.nice in (ours.get("set"), ours.get("from")):
        return int(ours.get("own", 0))
    return job.nice  # never adjusted by LAS, or set anew since


def level(service: float, thresholds: list[float]) -> int:
    """0 for the least attained queue, len(thresholds) for the most."""
    return bisect.bisect_right(sorted(thresholds), service)


def nice_for(service: float, thresholds: list[float], step: int) -> int:
    """Less attained service, more priority: -step per queue above the last one."""
    return -(len(thresholds) - level(service, thresholds)) * step


class LeastAttainedService(Plugin):
    name = "las"
    order = 60
    layers = ("schedule",)
    summary = "Tiresias-style LAS: pending jobs of users with more GPU time get a higher nice"
    default_on = False
    policy = True

    def tick(self, queue: Queue) -> None:
        config = queue.config
        path = Path(queue.state_dir or ".") / STATE_FILE
        half_life = half_life_of(config)
        state = load_state(path)
        decay(state, queue.now, half_life)
        account(state, queue)
        thresholds = [float(t) for t in config.las_thresholds]
        niced, state["niced"] = state["niced"], {}
        for job in queue.jobs:
            if job.state != "PENDING":
                continue
            service = state["attained"].get(job.user, 0.0)
            own = own_nice(job, niced)
            nice = own + nice_for(service, thresholds, int(config.las_nice_step))
            nice = max(-NICE_LIMIT, min(NICE_LIMIT, nice))
            state["niced"][job.job_id] = {"set": nice, "own": own, "from": job.nice}
            if nice != job.nice:
                queue.set_nice(job.job_id, nice)
                kept = f", its own nice {own} kept" if own else ""
                queue.notes.append(
                    f"las: job {job.job_id} of {job.user} ({service:.0f} "
                    f"GPU-s) nice {job.nice} -> {nice}{kept}"
                )
        save_state(path, state)
