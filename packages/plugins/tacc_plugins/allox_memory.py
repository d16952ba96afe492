"""What the allox plug-in remembers between ticks (`<state_dir>/allox.json`, root's), and
the estimates it makes from it.

- asked: each candidate job's types as its owner asked for them, kept from the first
  tick that saw it (once narrowed, Slurm has one type), with the value allox last set:
  a constraint that is neither is the owner's own change, taken as the new ask. Kept
  ten minutes after the job leaves the queue (a requeued job is out of squeue's view
  for a moment).
- seen: the type each running job that named its types runs on.
- runs: per job owner and job name, per type, the seconds of its last `samples` runs
  that Slurm says COMPLETED (cancelled, failed and requeued runs say nothing of the
  job's length), with when it was last used; at most MAX_KEYS_PER_USER names per user
  and MAX_KEYS in all, the least recently used forgotten first.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugin_settings import is_number
from tacc_contract.plugins import Node, Queue, QueuedJob, either_or

STATE_FILE = "allox.json"
SEP = "\x1f"  # between user and job name in a key (a name may hold anything else)
FORGET_ASKED_SECONDS = 600.0
MAX_KEYS, MAX_KEYS_PER_USER = 2000, 200


@dataclass(frozen=True)
class Settings:
    """plugin_settings.allox, each key checked by allox.settings_from."""

    alpha: float = 1.0
    window: int = 20
    speed: dict[str, float] = field(default_factory=dict)
    default_seconds: float = 3600.0
    samples: int = 5
    submit_delay_seconds: int = 0

    KEYS: ClassVar[tuple[str, ...]] = (
        "alpha",
        "window",
        "speed",
        "default_seconds",
        "samples",
        "submit_delay_seconds",
    )


def key_of(job: QueuedJob) -> str:
    return f"{job.user}{SEP}{job.name}"


def modeled(job: QueuedJob) -> bool:
    """AlloX's model: one GPU on one node; one job (not an array's unsplit rest)."""
    return job.nodes == 1 and job.gpus == 1 and "[" not in job.job_id and job.details


# --- the file --------------------------------------------------------------------------


def valid_asked(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("types"), list)
        and len(entry["types"]) >= 1
        and all(isinstance(t, str) for t in entry["types"])
        and isinstance(entry.get("set"), str | None)
        and is_number(entry.get("at"))
    )


def valid_seen(entry: object) -> bool:
    return (
        isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)
    )


def valid_runs(entry: object) -> bool:
    return (
        isinstance(entry, dict)
        and is_number(entry.get("at"))
        and isinstance(entry.get("types"), dict)
        and all(
            isinstance(seconds, list) and all(is_number(s) for s in seconds)
            for seconds in entry["types"].values()
        )
    )


def load_state(path: Path) -> dict:
    """The plug-in's memory; an entry of another shape (an older release's, a damaged
    file) is dropped, never the tick."""
    data = read_json(path)
    data = data if isinstance(data, dict) else {}
    checks = {"asked": valid_asked, "seen": valid_seen, "runs": valid_runs}
    state = {}
    for part, valid in checks.items():
        found = data.get(part)
        state[part] = {
            str(k): v for k, v in (found if isinstance(found, dict) else {}).items() if valid(v)
        }
    return state


def save_state(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, state)  # atomic: a tick killed mid-write leaves the old state


# --- asked and seen ----------------------------------------------------------------------


def remember_asked(state: dict, queue: Queue) -> None:
    """Each modeled job's types as its owner asked (see the module's docstring)."""
    asked = state["asked"]
    for job in queue.jobs:
        if not modeled(job):
            continue
        entry = asked.get(job.job_id)
        if entry and job.features not in ("|".join(entry["types"]), entry["set"]):
            entry = None  # its owner changed it: that is the ask now
        if entry is None:
            types = either_or(job.features)
            if not types:
                asked.pop(job.job_id, None)
                continue
            entry = {"types": types, "set": None}
        entry["at"] = queue.now
        asked[job.job_id] = entry
    for job_id in [k for k, v in asked.items() if queue.now - v["at"] > FORGET_ASKED_SECONDS]:
        del asked[job_id]


def node_kind(node: Node | None, types: list[str]) -> str | None:
    """The one of `types` the node's GPUs are (its typed Gres; without types, its
    features); None for none, or for more than one."""
    if node is None:
        return None
    kinds = [kind for kind, _ in node.gpu_kinds] or list(node.features)
    named = [t for t in types if t in kinds]
    return named[0] if len(named) == 1 else None


def learn(state: dict, queue: Queue, nodes: dict[str, Node], samples: int) -> None:
    """Watch the running jobs that named their types; a job Slurm says COMPLETED leaves
    its run time as a run of its (user, name) on the type it ran on."""
    present = {job.job_id for job in queue.jobs}
    for job_id, (key, kind) in list(state["seen"].items()):
        if job_id in present:
            continue
        ended = queue.ended.get(job_id)
        if ended is None:
            continue  # out of squeue's view for a moment (a requeue), or Slurm forgot it
        del state["seen"][job_id]
        final, seconds = ended
        if final == "COMPLETED" and seconds >= 1:
            add_run(state["runs"], key, kind, float(seconds), samples, queue.now)
    for job in queue.jobs:
        entry = state["asked"].get(job.job_id)
        if job.state != "RUNNING" or not entry or len(job.node_names) != 1:
            continue
        kind = node_kind(nodes.get(job.node_names[0]), entry["types"])
        if kind:
            state["seen"][job.job_id] = [key_of(job), kind]


def add_run(runs: dict, key: str, kind: str, seconds: float, samples: int, now: float) -> None:
    entry = runs.get(key) or {"types": {}, "at": now}
    entry["types"][kind] = [*entry["types"].get(kind, []), seconds][-samples:]
    entry["at"] = now
    runs[key] = entry
    user = key.split(SEP, 1)[0]
    mine = sorted((v["at"], k) for k, v in runs.items() if k.split(SEP, 1)[0] == user)
    for _, old in mine[: max(len(mine) - MAX_KEYS_PER_USER, 0)]:
        del runs[old]
    everyone = sorted((v["at"], k) for k, v in runs.items())
    for _, old in everyone[: max(len(everyone) - MAX_KEYS, 0)]:
        del runs[old]


# --- estimates -----------------------------------------------------------------------------


def estimate(runs: dict, kind: str, types: list[str], limit: int, found: Settings) -> float:
    """Seconds a job of these runs ({type: [seconds]}) takes on `kind`."""
    speed = found.speed
    if runs.get(kind):
        return float(statistics.median(runs[kind]))
    converted = [
        statistics.median(seconds) * speed.get(seen, 1.0) / speed.get(kind, 1.0)
        for seen, seconds in runs.items()
        if seconds
    ]
    if converted:
        return float(statistics.median(converted))
    slowest = min(speed.get(t, 1.0) for t in types)
    return (limit or found.default_seconds) * slowest / speed.get(kind, 1.0)


def runs_of(state: dict, key: str) -> dict:
    entry = state["runs"].get(key)
    return entry["types"] if entry else {}


def remaining_of(job: QueuedJob, state: dict, found: Settings) -> float:
    """Seconds a running job still needs: its estimate on its type when allox watches
    it, else its time limit, else the default; once past its estimate, what is left of
    its limit (else as long again: a job past its estimate is no sign it ends now)."""
    seen = state["seen"].get(job.job_id)
    if seen:
        key, kind = seen
        types = state["asked"].get(job.job_id, {}).get("types", [kind])
        took = estimate(runs_of(state, key), kind, types, job.time_limit_seconds, found)
    else:
        took = float(job.time_limit_seconds or found.default_seconds)
    if took > job.elapsed_seconds:
        return took - job.elapsed_seconds
    if job.time_limit_seconds > job.elapsed_seconds:
        return float(job.time_limit_seconds - job.elapsed_seconds)
    return took
