"""Tiresias (Gu et al., NSDI'19): discretized two-dimensional least-attained-service,
per job, with promotion of starved jobs and preemption.

- Attained service is per job: its GPUs x the seconds it has run (node-seconds for a
  job without GPUs, so CPU partitions take part too), counted from Slurm's queue at
  every tick and kept across requeues in the agent's state directory.
- `thresholds` cut it into queues: a job starts in queue 0 and drops a queue as its
  service passes each threshold (Tiresias' discretized 2D-LAS; it never rises by
  itself). Within a queue, Slurm's own order (first come, first served) holds.
- Starvation: a job that ran, went back to the queue and has waited there
  `promote_knob` x the time it has run since it last entered queue 0 is promoted to
  queue 0 and both figures start again from 0 (Tiresias' PROMOTEKNOB; 0 turns it off).
- Queues reach Slurm as nice values on pending jobs (queue 0 the most priority, each
  queue below it `nice_step` less), added to the job's own nice as the las plug-in does.
- Preemption (`preempt`, on by default): when a job waits for resources and running jobs
  of a lower queue in its partition hold enough nodes and GPUs for it, the lowest of
  them are checkpointed and requeued (`Queue.requeue`, as `tcloud halt` then `resume`)
  so the job can start. Only jobs whose task says `resources.preemptible: true` (the
  program saves at its checkpoint signal and resumes) are ever preempted, each only
  after running `min_run_seconds` since it last started, and at most
  `max_preempt_per_tick` a tick. Jobs that did not opt in keep running; their queue
  still orders them while they wait.

A policy: ops turn it on with the agent's `plugins: [tiresias]` and a
`queue_tick_seconds` on the controller; settings under `plugin_settings.tiresias`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from tacc_contract.errors import AgentError
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugin_settings import bad_setting as settings_error
from tacc_contract.plugin_settings import is_number, known_settings
from tacc_contract.plugins import WAITS_FOR_NODES, Plugin, Queue, QueuedJob, Submission, arrival
from tacc_plugins.las import NICE_LIMIT, level, own_nice

STATE_FILE = "tiresias.json"
PREEMPTIBLE = "preemptible"
# The most waiting one tick may count (the daemon down longer is not the job waiting).
MAX_GAP_SECONDS = 300.0
RETRY_FAILED_REQUEUE_SECONDS = 120.0


@dataclass(frozen=True)
class Settings:
    """plugin_settings.tiresias, each key checked (a bad one stops the tick)."""

    thresholds: tuple[float, ...] = (3600.0,)  # GPU-seconds; two queues, as the paper's
    promote_knob: float = 8.0
    nice_step: int = 10000
    preempt: bool = True
    min_run_seconds: float = 60.0
    max_preempt_per_tick: int = 1

    KEYS: ClassVar[tuple[str, ...]] = (
        "thresholds",
        "promote_knob",
        "nice_step",
        "preempt",
        "min_run_seconds",
        "max_preempt_per_tick",
    )


def bad_setting(key: str, expected: str, value: object) -> AgentError:
    return settings_error("tiresias", key, expected, value)


def settings_from(config: object) -> Settings:
    given = known_settings(config, "tiresias", Settings.KEYS)
    found = Settings()
    thresholds = given.get("thresholds", list(found.thresholds))
    if (
        not isinstance(thresholds, list | tuple)
        or not thresholds
        or not all(is_number(t) and t > 0 for t in thresholds)
    ):
        raise bad_setting("thresholds", "a list of GPU-seconds above 0", thresholds)
    knob = given.get("promote_knob", found.promote_knob)
    if not is_number(knob) or knob < 0:
        raise bad_setting("promote_knob", "a number >= 0 (0: no promotion)", knob)
    step = given.get("nice_step", found.nice_step)
    if not isinstance(step, int) or isinstance(step, bool) or not 1 <= step <= 1000000:
        raise bad_setting("nice_step", "an integer from 1 to 1000000", step)
    preempt = given.get("preempt", found.preempt)
    if not isinstance(preempt, bool):
        raise bad_setting("preempt", "true or false", preempt)
    min_run = given.get("min_run_seconds", found.min_run_seconds)
    if not is_number(min_run) or min_run < 0:
        raise bad_setting("min_run_seconds", "a number of seconds >= 0", min_run)
    most = given.get("max_preempt_per_tick", found.max_preempt_per_tick)
    if not isinstance(most, int) or isinstance(most, bool) or most < 0:
        raise bad_setting("max_preempt_per_tick", "an integer >= 0", most)
    return Settings(
        tuple(sorted(float(t) for t in thresholds)),
        float(knob),
        step,
        preempt,
        float(min_run),
        most,
    )


# --- the state of each job ---------------------------------------------------------------


def load_state(path: Path) -> dict:
    data = read_json(path) or {}
    jobs = data.get("jobs") if isinstance(data.get("jobs"), dict) else {}
    return {
        "jobs": {str(k): v for k, v in jobs.items() if isinstance(v, dict)},
        "ticked_at": data.get("ticked_at"),
    }


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)  # atomic: a tick killed mid-write leaves the old state


def fresh() -> dict:
    return {
        "executed": 0.0,
        "attained": 0.0,
        "total": 0.0,
        "counted": 0,
        "waited": 0.0,
        "queue": 0,
        "niced": None,
    }


def weight(job: QueuedJob) -> float:
    return job.gpus if job.gpus > 0 else float(job.nodes)


def run_since_last_tick(record: dict, job: QueuedJob) -> float:
    """Seconds the job ran since the last count (its elapsed time grows; one requeued
    since then starts again from 0)."""
    before = int(record.get("counted", 0))
    return float(
        job.elapsed_seconds - before if job.elapsed_seconds >= before else job.elapsed_seconds
    )


def account(record: dict, job: QueuedJob, since_tick: float, found: Settings) -> str | None:
    """One tick of Tiresias for one job; what happened to its queue, in words, if anything."""
    if job.state == "RUNNING":
        ran = run_since_last_tick(record, job)
        record["counted"] = job.elapsed_seconds
        record["executed"] += ran
        record["total"] += ran
        record["attained"] += ran * weight(job)
        record["waited"] = 0.0
        queue = max(record["queue"], level(record["attained"], list(found.thresholds)))
        if queue != record["queue"]:
            record["queue"] = queue
            return f"demoted to queue {queue} ({record['attained']:.0f} GPU-s)"
        return None
    record["counted"] = 0  # a pending job's next run starts from elapsed 0
    if record["total"] <= 0:
        return None  # it never ran: it waits in queue 0 from the start
    record["waited"] += since_tick
    knob = found.promote_knob
    if knob > 0 and record["queue"] > 0 and record["waited"] >= knob * record["executed"]:
        waited, ran = record["waited"], record["executed"]
        record.update(queue=0, executed=0.0, attained=0.0, waited=0.0)
        return f"promoted to queue 0 (waited {waited:.0f} s >= {knob:g} x {ran:.0f} s run)"
    return None


def nice_of(queue: int, queues: int, step: int) -> int:
    """Queue 0 the most priority, the last queue none."""
    return -(queues - 1 - queue) * step


# --- preemption --------------------------------------------------------------------------


def victims_for(
    waiting: QueuedJob,
    running: list[QueuedJob],
    queues: dict[str, int],
    found: Settings,
    free: tuple[int, float] = (0, 0.0),
) -> list[QueuedJob]:
    """The running jobs to preempt for `waiting`: preemptible, of a lower queue, in its
    partition, started at least min_run_seconds ago; the lowest queue and the latest
    arrival first, as few as hold, with the `free` (idle nodes, their GPUs) of its
    partitions, its nodes and GPUs ([] when they cannot, or when none is needed)."""
    mine = queues[waiting.job_id]
    candidates = sorted(
        (
            job
            for job in running
            if PREEMPTIBLE in job.opted_in
            and queues[job.job_id] > mine
            and job.partition in waiting.partition.split(",")
            and job.elapsed_seconds >= found.min_run_seconds
        ),
        key=lambda job: (-queues[job.job_id], tuple(-n for n in arrival(job))),
    )
    chosen, (nodes, gpus) = [], free
    for job in candidates:
        if nodes >= waiting.nodes and gpus >= waiting.gpus:
            break
        chosen.append(job)
        nodes, gpus = nodes + job.nodes, gpus + job.gpus
    return chosen if nodes >= waiting.nodes and gpus >= waiting.gpus else []


class Tiresias(Plugin):
    name = "tiresias"
    order = 62
    layers = ("schedule",)
    summary = (
        "Tiresias per job: attained GPU x time picks a queue (nice), starved jobs "
        "are promoted, preemptible jobs of lower queues are requeued"
    )
    default_on = False
    policy = True

    def schedule(self, submission: Submission) -> None:
        """Record the task's opt-in where the controller's tick reads it (the job's own
        record, status/submit.json plugin_data)."""
        if submission.task.resources.get("preemptible"):
            submission.data[self.name] = {"opt_in": [PREEMPTIBLE]}
            submission.note(
                self.name, "preemptible: checkpointed and requeued for a job of a higher queue"
            )

    def tick(self, queue: Queue) -> None:
        found = settings_from(queue.config)
        path = Path(queue.state_dir or ".") / STATE_FILE
        state = load_state(path)
        last = state.get("ticked_at")
        since_tick = max(0.0, queue.now - last) if isinstance(last, int | float) else 0.0
        # After the daemon was down, the gap is not waiting it saw: at most MAX_GAP.
        since_tick = min(since_tick, MAX_GAP_SECONDS)
        state["ticked_at"] = queue.now
        queues_count = len(found.thresholds) + 1
        records, state["jobs"] = state["jobs"], {}
        queues: dict[str, int] = {}
        for job in queue.jobs:
            record = {**fresh(), **records.get(job.job_id, {})}
            said = account(record, job, since_tick, found)
            if said:
                queue.notes.append(f"tiresias: job {job.job_id} of {job.user} {said}")
            state["jobs"][job.job_id] = record  # jobs no longer queued drop out
            queues[job.job_id] = record["queue"]
        self.set_nices(queue, state["jobs"], queues_count, found)
        if found.preempt:
            self.preempt(queue, queues, state["jobs"], found)
        save_state(path, state)

    def set_nices(self, queue: Queue, records: dict, queues_count: int, found: Settings) -> None:
        for job in queue.jobs:
            if job.state != "PENDING":
                continue
            record = records[job.job_id]
            niced = {job.job_id: record["niced"]} if record["niced"] else {}
            own = own_nice(job, niced)
            nice = own + nice_of(record["queue"], queues_count, found.nice_step)
            nice = max(-NICE_LIMIT, min(NICE_LIMIT, nice))
            record["niced"] = {"set": nice, "own": own, "from": job.nice}
            if nice == job.nice:
                continue
            try:
                queue.set_nice(job.job_id, nice)
            except AgentError as exc:  # it ended or was cancelled since squeue: go on
                queue.notes.append(f"tiresias: job {job.job_id}: nice not set ({exc})")
                continue
            queue.notes.append(
                f"tiresias: job {job.job_id} of {job.user} in queue "
                f"{record['queue']}: nice {job.nice} -> {nice}"
            )

    def preempt(self, queue: Queue, queues: dict[str, int], records: dict, found: Settings) -> None:
        # A job whose requeue failed (its halt found it ending, Slurm did not answer) is
        # not chosen again for a while: not the same failure at every tick.
        # Only a job that opted in can be a victim: with none running, no waiting job
        # needs looking at (nor the nodes read).
        running = [
            job
            for job in queue.jobs
            if job.state == "RUNNING"
            and PREEMPTIBLE in job.opted_in
            and queue.now - records[job.job_id].get("requeue_failed_at", -1e18)
            >= RETRY_FAILED_REQUEUE_SECONDS
        ]
        waiting = sorted(
            (job for job in queue.jobs if job.state == "PENDING" and job.reason in WAITS_FOR_NODES),
            key=lambda job: (queues[job.job_id], arrival(job)),
        )
        if not running or not waiting:
            return
        budget = found.max_preempt_per_tick
        idle = [node for node in queue.cluster_nodes() if node.idle()]
        free_in: dict[str, tuple[int, float]] = {}  # per partition list, read once a tick
        for job in waiting:
            if job.partition not in free_in:
                wanted = set(job.partition.split(","))
                mine = [node for node in idle if wanted.intersection(node.partitions)]
                free_in[job.partition] = (len(mine), float(sum(node.gpus for node in mine)))
            victims = victims_for(job, running, queues, found, free_in[job.partition])
            if not victims or len(victims) > budget:
                continue
            for victim in victims:
                why = (
                    f"preempted by tiresias: queue {queues[victim.job_id]}, for job "
                    f"{job.job_id} of queue {queues[job.job_id]}"
                )
                done = queue.requeue(victim.job_id, why)
                if not done:
                    records[victim.job_id]["requeue_failed_at"] = queue.now
                queue.notes.append(
                    f"tiresias: job {victim.job_id} of {victim.user} "
                    f"{'requeued' if done else 'not requeued'}: {why}"
                )
                running.remove(victim)
                budget -= 1
            if budget <= 0:
                return
