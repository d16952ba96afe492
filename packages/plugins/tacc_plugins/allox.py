"""AlloX (Le et al., EuroSys'20): jobs that accept several kinds of device, which run them
at different speeds, are placed by a min-cost matching that cuts their mean completion
time, with a fairness knob.

- Candidates: pending one-node jobs asking for one GPU (not held, not waiting for a
  dependency or a start time) whose constraint is an either-or of GPU types
  (`gpu_types: [a100, h100, l40s]` writes `a100|h100|l40s`). AlloX's model is one job
  per device; jobs asking for more keep Slurm's own placement.
- Devices: each GPU of a node in service whose features name one of the candidates'
  types. A free GPU is free now; a held one is free when its job's estimate (or, for a
  job allox knows nothing of, its time limit) says.
- Estimates, per job owner and job name, per type: the median of the last `samples`
  runs the plug-in watched on that type (AlloX runs a short profile on each device
  instead). A type not yet seen is estimated from a seen one through the ops' prior
  speeds (`speed: {h100: 3.0, a100: 1.0}`, 1 for a type not listed); a job never seen
  from its time limit (else `default_seconds`), as on the slowest type it accepts.
- Matching (AlloX's): a job in the k-th place from the end of a device's queue adds k
  times its time there to the sum of completion times, plus the wait until the device
  is free; the assignment of jobs to (device, place) of least total cost is the
  schedule. Each matched job's constraint is narrowed to its device's type
  (`Queue.set_features`), so Slurm starts it only there; the matching is made again at
  every tick, so a job moves when the queue does. Order within a type stays Slurm's
  (or tiresias', when on).
- Fairness (AlloX's alpha): users are ranked by the share of the GPUs their running jobs
  hold (a job on a slower type than its best counts that much less); only the jobs of
  the ceil(alpha x users) lowest are matched in a tick, the others get back the
  constraint their owner asked for. alpha 1 (the default) is pure completion time.
- At most `window` candidates are matched per tick (the oldest first).

A policy: ops turn it on with the agent's `plugins: [allox]` and a `queue_tick_seconds` on
the controller; settings under `plugin_settings.allox`.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tacc_contract.errors import AGENT_CLUSTER, AgentError
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugins import (
    NOT_WAITING_FOR_NODES,
    Node,
    Plugin,
    Queue,
    QueuedJob,
    settings_of,
)
from tacc_plugins.matching import INFEASIBLE, min_cost_assignment

STATE_FILE = "allox.json"
TYPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_KEYS = 2000  # (user, name) pairs remembered, the least recently run forgotten first
SEP = "\x1f"  # between user and job name in a key: neither holds it


@dataclass(frozen=True)
class Settings:
    """plugin_settings.allox, each key checked (a bad one stops the tick)."""

    alpha: float = 1.0
    window: int = 20
    speed: dict[str, float] = field(default_factory=dict)
    default_seconds: float = 3600.0
    samples: int = 5

    KEYS: ClassVar[tuple[str, ...]] = ("alpha", "window", "speed", "default_seconds", "samples")


def bad_setting(key: str, expected: str, value: object) -> AgentError:
    return AgentError(f"agent config: plugin_settings.allox.{key}: expected {expected}, "
                      f"got {value!r}", AGENT_CLUSTER)  # fmt: skip


def number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def settings_from(config: object) -> Settings:
    given = settings_of(config, "allox")
    unknown = sorted(set(given) - set(Settings.KEYS))
    if unknown:
        raise AgentError(f"agent config: plugin_settings.allox: unknown key(s) "
                         f"{', '.join(unknown)} (known: {', '.join(Settings.KEYS)})",
                         AGENT_CLUSTER)  # fmt: skip
    found = Settings()
    alpha = given.get("alpha", found.alpha)
    if not number(alpha) or not 0 < alpha <= 1:
        raise bad_setting("alpha", "a number above 0 and at most 1 (1: no fairness)", alpha)
    window = given.get("window", found.window)
    if not whole(window) or not 1 <= window <= 200:
        raise bad_setting("window", "an integer from 1 to 200", window)
    speed = given.get("speed", {})
    if not isinstance(speed, dict) or not all(
        isinstance(k, str) and TYPE.fullmatch(k) and number(v) and v > 0 for k, v in speed.items()
    ):
        raise bad_setting("speed", "a mapping of GPU type to a number above 0 "
                          "({h100: 3.0, a100: 1.0})", speed)  # fmt: skip
    default = given.get("default_seconds", found.default_seconds)
    if not number(default) or default <= 0:
        raise bad_setting("default_seconds", "a number of seconds above 0", default)
    samples = given.get("samples", found.samples)
    if not whole(samples) or not 1 <= samples <= 100:
        raise bad_setting("samples", "an integer from 1 to 100", samples)
    return Settings(float(alpha), window, {k: float(v) for k, v in speed.items()},
                    float(default), samples)  # fmt: skip


def either_or(features: str) -> list[str]:
    """The types of a plain either-or constraint ("a100|h100"); [] for anything else."""
    terms = features.split("|")
    return terms if features and all(TYPE.fullmatch(t) for t in terms) else []


def key_of(job: QueuedJob) -> str:
    return f"{job.user}{SEP}{job.name}"


# --- what the plug-in remembers ----------------------------------------------------------


def load_state(path: Path) -> dict:
    data = read_json(path) or {}
    state = {}
    for part in ("asked", "seen", "runs"):
        found = data.get(part)
        state[part] = dict(found) if isinstance(found, dict) else {}
    return state


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)  # atomic: a tick killed mid-write leaves the old state


def remember_asked(state: dict, queue: Queue) -> None:
    """Each job's types as its owner asked for them (kept from the first tick that saw
    the job: once narrowed, Slurm has only the one type). A job of one type is no
    candidate, but its runs are learned all the same."""
    present = {job.job_id for job in queue.jobs}
    asked = {k: v for k, v in state["asked"].items() if k in present and isinstance(v, list)}
    for job in queue.jobs:
        types = either_or(job.features)
        if job.job_id not in asked and types:
            asked[job.job_id] = types
    state["asked"] = asked


def node_type(node: Node | None, types: list[str]) -> str | None:
    """The one of `types` the node's features name; None for none, or for more than one."""
    named = [t for t in types if node is not None and t in node.features]
    return named[0] if len(named) == 1 else None


def learn(state: dict, queue: Queue, nodes: dict[str, Node], samples: int) -> None:
    """Watch the running jobs that named their types (type, seconds run); a job gone from
    the queue leaves its last figure as a run of its (user, name) on that type."""
    present = {job.job_id: job for job in queue.jobs}
    for job_id, (key, kind, seconds) in list(state["seen"].items()):
        if job_id in present:
            continue
        del state["seen"][job_id]
        if seconds >= 1:
            runs = state["runs"].pop(key, {})  # re-inserted: the most recent last
            runs[kind] = [*runs.get(kind, []), seconds][-samples:]
            state["runs"][key] = runs
    while len(state["runs"]) > MAX_KEYS:
        del state["runs"][next(iter(state["runs"]))]
    for job in queue.jobs:
        types = state["asked"].get(job.job_id)
        if job.state != "RUNNING" or not types or len(job.node_names) != 1:
            continue
        kind = node_type(nodes.get(job.node_names[0]), types)
        if kind:
            state["seen"][job.job_id] = [key_of(job), kind, job.elapsed_seconds]


# --- estimates -----------------------------------------------------------------------------


def estimate(runs: dict, kind: str, types: list[str], limit: int, found: Settings) -> float:
    """Seconds a job of these runs takes on `kind`."""
    speed = found.speed
    if runs.get(kind):
        return float(statistics.median(runs[kind]))
    converted = [statistics.median(seconds) * speed.get(seen, 1.0) / speed.get(kind, 1.0)
                 for seen, seconds in runs.items() if seconds]  # fmt: skip
    if converted:
        return float(statistics.median(converted))
    slowest = min(speed.get(t, 1.0) for t in types)
    return (limit or found.default_seconds) * slowest / speed.get(kind, 1.0)


@dataclass(frozen=True)
class Device:
    node: str
    kind: str
    free_in: float  # seconds from now


def devices(nodes: list[Node], running: list[QueuedJob], types: list[str],
            remaining: dict[str, float]) -> list[Device]:  # fmt: skip
    """Each GPU of a node in service of one of `types`, and when it is free."""
    busy: dict[str, list[float]] = {}
    for job in running:
        if not job.node_names:
            continue
        per_node = math.ceil(job.gpus / len(job.node_names)) if job.gpus > 0 else 0
        for name in job.node_names:
            busy.setdefault(name, []).extend([remaining[job.job_id]] * per_node)
    found = []
    for node in nodes:
        kind = node_type(node, types)
        if kind is None or node.gpus < 1 or not node.in_service():
            continue
        held = sorted(busy.get(node.name, []))[: node.gpus]
        found += [Device(node.name, kind, free_in) for free_in in held]
        found += [Device(node.name, kind, 0.0)] * (node.gpus - len(held))
    return found


def remaining_of(job: QueuedJob, state: dict, found: Settings) -> float:
    """Seconds a running job still needs: its estimate on its type when allox watches it,
    else its time limit, else the default."""
    seen = state["seen"].get(job.job_id)
    if seen:
        key, kind, _ = seen
        types = state["asked"].get(job.job_id, [kind])
        took = estimate(state["runs"].get(key, {}), kind, types, job.time_limit_seconds, found)
    else:
        took = float(job.time_limit_seconds or found.default_seconds)
    return max(took - job.elapsed_seconds, 0.0)


# --- fairness and the matching -------------------------------------------------------------


def chosen_users(candidates: list[QueuedJob], running: list[QueuedJob], state: dict,
                 total_gpus: int, found: Settings) -> set[str]:  # fmt: skip
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
            key, kind, _ = seen
            types = state["asked"].get(job.job_id, [kind])
            runs = state["runs"].get(key, {})
            times = {t: estimate(runs, t, types, job.time_limit_seconds, found) for t in types}
            weight *= min(times.values()) / times[kind] if times[kind] > 0 else 1.0
        share[job.user] += weight
    ranked = sorted(users, key=lambda user: (share[user], user))
    return set(ranked[: math.ceil(found.alpha * len(ranked))])


def plan(jobs: list[QueuedJob], times: dict[str, dict[str, float]],
         found_devices: list[Device]) -> dict[str, Device]:  # fmt: skip
    """Each job's device by AlloX's matching (jobs x (device, k-th from last))."""
    places = len(jobs)
    columns = [(device, k) for device in found_devices for k in range(1, places + 1)]
    if not jobs or len(columns) < len(jobs):
        return {}
    cost = [[device.free_in + k * times[job.job_id][device.kind]
             if device.kind in times[job.job_id] else INFEASIBLE
             for device, k in columns] for job in jobs]  # fmt: skip
    given = min_cost_assignment(cost)
    pairs = enumerate(zip(jobs, given, strict=True))
    return {job.job_id: columns[column][0] for row, (job, column) in pairs
            if cost[row][column] < INFEASIBLE}  # fmt: skip


def arrival(job: QueuedJob) -> tuple[int, str]:
    number_part = job.job_id.split("_")[0]
    return (int(number_part) if number_part.isdigit() else 1 << 62, job.job_id)


class Allox(Plugin):
    name = "allox"
    order = 64
    layers = ("schedule",)
    summary = "allox: place jobs that accept several GPU types by AlloX's min-cost matching"
    default_on = False
    policy = True

    def tick(self, queue: Queue) -> None:
        if queue.state_dir is None:
            raise AgentError("allox needs the agent's state directory", AGENT_CLUSTER)
        found = settings_from(queue.config)
        path = Path(queue.state_dir) / STATE_FILE
        state = load_state(path)
        remember_asked(state, queue)
        if not state["asked"] and not state["seen"]:
            save_state(path, state)
            return
        nodes = {node.name: node for node in queue.cluster_nodes()}
        learn(state, queue, nodes, found.samples)
        save_state(path, state)
        asked = state["asked"]
        pending = sorted((job for job in queue.jobs if job.state == "PENDING"
                          and len(asked.get(job.job_id, ())) >= 2), key=arrival)  # fmt: skip
        # One GPU on one node (AlloX's one job per device); a pending array's unsplit
        # rest ("12_[3-9]") is many jobs, not one.
        candidates = [job for job in pending
                      if job.nodes == 1 and job.gpus == 1 and "[" not in job.job_id
                      and not job.reason.startswith(NOT_WAITING_FOR_NODES)]  # fmt: skip
        if not candidates:
            return
        running = [job for job in queue.jobs if job.state == "RUNNING"]
        types = sorted({t for job in candidates for t in state["asked"][job.job_id]})
        remaining = {job.job_id: remaining_of(job, state, found) for job in running}
        found_devices = devices(list(nodes.values()), running, types, remaining)
        users = chosen_users(candidates, running, state, len(found_devices), found)
        matched = [job for job in candidates if job.user in users][: found.window]
        times = {
            job.job_id: {
                kind: estimate(state["runs"].get(key_of(job), {}), kind,
                               state["asked"][job.job_id], job.time_limit_seconds, found)
                for kind in state["asked"][job.job_id]
            }
            for job in matched
        }  # fmt: skip
        placed = plan(matched, times, found_devices)
        for job in candidates:
            asked = state["asked"][job.job_id]
            device = placed.get(job.job_id)
            wanted = device.kind if device else "|".join(asked)
            if job.features == wanted:
                continue
            if queue.set_features(job.job_id, wanted):
                if device:
                    others = ", ".join(f"{t} {times[job.job_id][t]:.0f} s" for t in asked
                                       if t != device.kind)  # fmt: skip
                    queue.notes.append(
                        f"allox: job {job.job_id} -> {device.kind} (est. "
                        f"{times[job.job_id][device.kind]:.0f} s; {others}), "
                        f"{device.free_in:.0f} s to its device")  # fmt: skip
                else:
                    queue.notes.append(f"allox: job {job.job_id} -> {wanted} as asked")
