"""AlloX (Le et al., EuroSys'20): jobs that accept several kinds of device, which run them
at different speeds, are placed by a min-cost matching that cuts their mean completion
time, with a fairness knob.

- Candidates: pending one-node jobs asking for one GPU (not held, not waiting for a
  dependency or a start time) whose constraint is an either-or of GPU types
  (`gpu_types: [a100, h100, l40s]` writes `a100|h100|l40s`). AlloX's model is one job
  per device; jobs asking for more keep Slurm's own placement.
- Devices: each GPU of a node in service, by its type in the node's Gres
  (gpu:h100:4). A free GPU is free now; a held one when its job's estimate (or, for a
  job allox knows nothing of, its time limit) says. Per type, only as many devices as
  there are jobs to place, the earliest free.
- Estimates, per job owner and job name, per type: the median of its last `samples`
  runs on that type that Slurm says COMPLETED, with Slurm's run time (AlloX runs a short
  profile on each device instead; allox_memory.py). A type not yet run on is estimated
  from another through the ops' prior speeds (`speed: {h100: 3.0, a100: 1.0}`, 1 for a
  type not listed); a job never seen from its time limit (else `default_seconds`), as
  on the slowest type it accepts.
- Matching (AlloX's): a job in the k-th place from the end of a device's queue adds k
  times its time there to the sum of completion times, plus the wait until the device
  is free; the assignment of jobs to (device, place) of least total cost is the
  schedule. Each matched job's constraint is narrowed to its device's type
  (`Queue.set_features`), so Slurm starts it only there; the matching is made again at
  every tick, so a job moves when the queue does. Order within a type stays Slurm's
  (or tiresias', when on).
- Fairness (AlloX's alpha): users are ranked by the share of the GPUs their running jobs
  hold (a job on a slower type than its best counts that much less); only the jobs of
  the ceil(alpha x users) lowest are matched in a tick; the others keep the constraint
  they have. alpha 1 (the default) is pure completion time.
- At most `window` candidates are matched per tick (the oldest first); the others keep
  the constraint they have.
- Placement at submit (`submit_delay_seconds`, 0: off): Slurm starts a job at once when
  a GPU of any type it accepts is free, before a tick has seen it (a job that is 5x
  slower there holds that GPU). With a delay, such a job is submitted to begin that
  many seconds later (sbatch --begin=now+N, at most MAX_SUBMIT_DELAY; set it just
  above the controller's queue_tick_seconds); the next tick matches it with the others
  and starts it at once on its type (`Queue.start_now`). A tick that does not come
  costs the delay, nothing more: the job then begins as Slurm places it. A job whose
  owner set a begin time, a hold, a dependency or a deadline is left as it is.

A policy: ops turn it on with the agent's `plugins: [allox]` and a `queue_tick_seconds` on
the controller; settings under `plugin_settings.allox`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tacc_contract.errors import AGENT_CLUSTER, AgentError
from tacc_contract.plugin_settings import bad_setting as settings_error
from tacc_contract.plugin_settings import is_number, is_whole, known_settings
from tacc_contract.plugins import (
    FEATURE,
    NOT_WAITING_FOR_NODES,
    PLACEMENT_DELAY_LIMIT,
    Node,
    Plugin,
    Queue,
    QueuedJob,
    Submission,
    arrival,
    delayed_for_placement,
    either_or,
)
from tacc_plugins.allox_memory import (
    STATE_FILE,
    Settings,
    estimate,
    key_of,
    learn,
    load_state,
    modeled,
    remaining_of,
    remember_asked,
    runs_of,
    save_state,
)
from tacc_plugins.matching import min_cost_assignment

MAX_WINDOW = 100  # jobs x devices x places: 100 jobs on 100 devices is a second a tick
# Below the agent's PLACEMENT_DELAY_LIMIT: the login node's clock (sbatch's now+N) and
# the controller's (the submit time) may differ by a little.
MAX_SUBMIT_DELAY = PLACEMENT_DELAY_LIMIT // 2
# The owner's own timing (sbatch reads any unambiguous prefix of a long option): a task
# whose extra sbatch options may name one of these is never delayed.
OWN_TIMING = ("begin", "hold", "dependency", "deadline", "immediate")


def bad_setting(key: str, expected: str, value: object) -> AgentError:
    return settings_error("allox", key, expected, value)


def settings_from(config: object) -> Settings:
    given = known_settings(config, "allox", Settings.KEYS)
    found = Settings()
    alpha = given.get("alpha", found.alpha)
    if not is_number(alpha) or not 0 < alpha <= 1:
        raise bad_setting("alpha", "a number above 0 and at most 1 (1: no fairness)", alpha)
    window = given.get("window", found.window)
    if not is_whole(window) or not 1 <= window <= MAX_WINDOW:
        raise bad_setting("window", f"an integer from 1 to {MAX_WINDOW}", window)
    speed = given.get("speed", {})
    if not isinstance(speed, dict) or not all(
        isinstance(k, str) and FEATURE.fullmatch(k) and is_number(v) and v > 0
        for k, v in speed.items()
    ):
        raise bad_setting(
            "speed", "a mapping of GPU type to a number above 0 ({h100: 3.0, a100: 1.0})", speed
        )
    default = given.get("default_seconds", found.default_seconds)
    if not is_number(default) or default <= 0:
        raise bad_setting("default_seconds", "a number of seconds above 0", default)
    samples = given.get("samples", found.samples)
    if not is_whole(samples) or not 1 <= samples <= 100:
        raise bad_setting("samples", "an integer from 1 to 100", samples)
    delay = given.get("submit_delay_seconds", found.submit_delay_seconds)
    if not is_whole(delay) or not 0 <= delay <= MAX_SUBMIT_DELAY:
        expected = (
            f"an integer from 0 (off) to {MAX_SUBMIT_DELAY} (seconds; set it above "
            "the controller's queue_tick_seconds)"
        )
        raise bad_setting("submit_delay_seconds", expected, delay)
    return Settings(
        float(alpha),
        window,
        {k: float(v) for k, v in speed.items()},
        float(default),
        samples,
        delay,
    )


@dataclass(frozen=True)
class Device:
    node: str
    kind: str
    free_in: float  # seconds from now


def node_gpus(node: Node, types: list[str]) -> list[tuple[str, int]]:
    """(type, count) of the node's GPUs of `types`: its typed Gres, else (untyped GPUs)
    the one of `types` its features name."""
    if node.gpu_kinds:
        return [(kind, count) for kind, count in node.gpu_kinds if kind in types]
    named = [t for t in types if t in node.features]
    return [(named[0], node.gpus)] if len(named) == 1 and node.gpus else []


def devices(
    nodes: list[Node],
    running: list[QueuedJob],
    types: list[str],
    remaining: dict[str, float],
    kinds: dict[str, str],
    wanted: int,
) -> list[Device]:
    """Each GPU of `types` on a node in service and when it is free; per type the
    `wanted` earliest free. A running job's GPUs are counted on its type where allox
    knows it (`kinds`), else on the node's first types."""
    busy: dict[str, list[tuple[str | None, float]]] = {}
    for job in running:
        if not job.node_names or job.gpus <= 0:
            continue
        per_node = math.ceil(job.gpus / len(job.node_names))
        for name in job.node_names:
            busy.setdefault(name, []).extend(
                [(kinds.get(job.job_id), remaining[job.job_id])] * per_node
            )
    by_kind: dict[str, list[Device]] = {}
    for node in nodes:
        if not node.in_service():
            continue
        held = sorted(busy.get(node.name, []), key=lambda b: b[0] is None)  # known kinds first
        for kind, count in node_gpus(node, types):
            mine = [b for b in held if b[0] == kind][:count]
            for taken in mine:
                held.remove(taken)
            rest = [b for b in held if b[0] is None][: count - len(mine)]
            for taken in rest:
                held.remove(taken)
            frees = sorted(free_in for _, free_in in mine + rest)
            frees += [0.0] * (count - len(frees))
            by_kind.setdefault(kind, []).extend(Device(node.name, kind, f) for f in frees)
    return [
        device
        for kind in sorted(by_kind)
        for device in sorted(by_kind[kind], key=lambda d: d.free_in)[:wanted]
    ]


def chosen_users(
    candidates: list[QueuedJob],
    running: list[QueuedJob],
    state: dict,
    total_gpus: int,
    found: Settings,
) -> set[str]:
    """The ceil(alpha x users) candidate owners holding the least (AlloX's fairness)."""
    users = sorted({job.user for job in candidates})
    if found.alpha >= 1:
        return set(users)
    share = dict.fromkeys(users, 0.0)
    for job in running:
        if job.user not in share or job.gpus <= 0:
            continue
        weight = job.gpus / max(total_gpus, 1)
        seen = state["seen"].get(job.job_id)
        if seen:  # on a slower type than its best, it counts that much less
            key, kind = seen
            types = state["asked"].get(job.job_id, {}).get("types", [kind])
            runs = runs_of(state, key)
            times = {t: estimate(runs, t, types, job.time_limit_seconds, found) for t in types}
            if times.get(kind, 0) > 0:
                weight *= min(times.values()) / times[kind]
        share[job.user] += weight
    ranked = sorted(users, key=lambda user: (share[user], user))
    return set(ranked[: math.ceil(found.alpha * len(ranked))])


def plan(
    jobs: list[QueuedJob], times: dict[str, dict[str, float]], found_devices: list[Device]
) -> dict[str, Device]:
    """Each job's device by AlloX's matching (jobs x (device, k-th from last)); a job
    no device of its types can take is left out."""
    places = len(jobs)
    columns = [(device, k) for device in found_devices for k in range(1, places + 1)]
    if not jobs or len(columns) < len(jobs):
        return {}
    real = [
        device.free_in + k * times[job.job_id][device.kind]
        for job in jobs
        for device, k in columns
        if device.kind in times[job.job_id]
    ]
    # Larger than any assignment of real costs can sum to: never chosen over one.
    never = (max(real, default=0.0) + 1.0) * (len(jobs) + 1)
    cost = [
        [
            device.free_in + k * times[job.job_id][device.kind]
            if device.kind in times[job.job_id]
            else never
            for device, k in columns
        ]
        for job in jobs
    ]
    given = min_cost_assignment(cost)
    pairs = enumerate(zip(jobs, given, strict=True))
    return {
        job.job_id: columns[column][0] for row, (job, column) in pairs if cost[row][column] < never
    }


class Allox(Plugin):
    name = "allox"
    order = 64
    layers = ("schedule",)
    summary = "allox: place jobs that accept several GPU types by AlloX's min-cost matching"
    default_on = False
    policy = True

    def schedule(self, submission: Submission) -> None:
        """A one-GPU job that accepts several types begins `submit_delay_seconds` later,
        for a tick to place it first."""
        delay = settings_from(submission.config).submit_delay_seconds
        res = submission.task.resources
        options = submission.options
        types = either_or(options.get("constraint") or "")
        one_gpu = res.get("nodes") == 1 and res.get("gpus_per_node") == 1
        own = [*options, *(res.get("sbatch") or {})]
        timed = any(word.startswith(key) for key in own for word in OWN_TIMING)
        if delay <= 0 or not one_gpu or len(types) < 2 or timed:
            return
        options["begin"] = f"now+{delay}"
        submission.note(self.name, f"begins in {delay} s: the next queue tick places it")

    def tick(self, queue: Queue) -> None:
        if queue.state_dir is None:
            raise AgentError("allox needs the agent's state directory", AGENT_CLUSTER)
        found = settings_from(queue.config)
        path = Path(queue.state_dir) / STATE_FILE
        state = load_state(path)
        remember_asked(state, queue)
        if state["asked"] or state["seen"]:
            nodes = {node.name: node for node in queue.cluster_nodes()}
            learn(state, queue, nodes, found.samples)
            self.place(queue, state, list(nodes.values()), found)
        save_state(path, state)

    def place(self, queue: Queue, state: dict, nodes: list[Node], found: Settings) -> None:
        asked = state["asked"]
        candidates = sorted(
            (
                job
                for job in queue.jobs
                if job.state == "PENDING"
                and modeled(job)
                and job.job_id in asked
                and len(asked[job.job_id]["types"]) >= 2
                and (not job.reason.startswith(NOT_WAITING_FOR_NODES) or delayed_for_placement(job))
            ),
            key=arrival,
        )
        if not candidates:
            return
        running = [job for job in queue.jobs if job.state == "RUNNING"]
        types = sorted({t for job in candidates for t in asked[job.job_id]["types"]})
        remaining = {job.job_id: remaining_of(job, state, found) for job in running}
        kinds = {job_id: kind for job_id, (_, kind) in state["seen"].items()}
        total = sum(
            count for node in nodes if node.in_service() for _, count in node_gpus(node, types)
        )
        users = chosen_users(candidates, running, state, total, found)
        matched = [job for job in candidates if job.user in users][: found.window]
        found_devices = devices(nodes, running, types, remaining, kinds, wanted=len(matched))
        times = {
            job.job_id: {
                kind: estimate(
                    runs_of(state, key_of(job)),
                    kind,
                    asked[job.job_id]["types"],
                    job.time_limit_seconds,
                    found,
                )
                for kind in asked[job.job_id]["types"]
            }
            for job in matched
        }
        placed = plan(matched, times, found_devices)
        for job in matched:
            entry = asked[job.job_id]
            device = placed.get(job.job_id)
            wanted = device.kind if device else "|".join(entry["types"])
            if job.features != wanted:
                if not queue.set_features(job.job_id, wanted):
                    continue
                entry["set"] = wanted
                self.note_placed(queue, job, device, wanted, times[job.job_id], entry["types"])
            if device is not None and delayed_for_placement(job) and queue.start_now(job.job_id):
                queue.notes.append(
                    f"allox: job {job.job_id} placed: starts without its submit delay"
                )

    @staticmethod
    def note_placed(
        queue: Queue,
        job: QueuedJob,
        device: Device | None,
        wanted: str,
        times: dict[str, float],
        types: list[str],
    ) -> None:
        if device is None:
            queue.notes.append(
                f"allox: job {job.job_id} -> {wanted} as asked (no device of its types to plan on)"
            )
            return
        others = ", ".join(f"{t} {times[t]:.0f} s" for t in types if t != device.kind)
        queue.notes.append(
            f"allox: job {job.job_id} -> {device.kind} (est. "
            f"{times[device.kind]:.0f} s; {others}), "
            f"{device.free_in:.0f} s to its device"
        )
