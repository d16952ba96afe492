"""Early stopping for a sweep's trials: asynchronous successive halving (ASHA), the
program side of the `fluid` plug-in. Standard library only (it runs in the program's
own Python).

    import tacc_fluid                     # only there when the plug-in is on
    for step in range(1, max_steps + 1):
        value = train_one_step()
        if not tacc_fluid.report(step, value):
            break                         # stopped: exit 0, stopping is success

The plug-in sets, for each trial of a sweep with `sweep.adaptive`:
  TACC_FLUID_RUNGS    the steps at which trials are compared ("1,3,9"); the last one
                      is max_steps, where a trial ends anyway
  TACC_FLUID_ETA      keep the top 1/eta at each rung (3)
  TACC_FLUID_MODE     max | min: whether a larger value is better
  TACC_FLUID_METRIC   the value's name (for the records)
  TACC_FLUID_DIR      the sweep's shared directory: rungs.json, every trial's value at
                      every rung it reached (read and replaced under an fcntl lock
                      on rungs.lock)
  TACC_FLUID_TRIAL    this trial's index
  TACC_FLUID_TRIAL_DIR  this trial's own directory: metrics.jsonl (every report) and
                      result.json (the last decision, for the job log)
Without them (the plug-in off, or a run outside a sweep) report() writes nothing and
always returns True: the plain grid.

The rule at a rung (ASHA, Li et al. 2020): with n values recorded there (this trial's
included), a trial goes on when it is among the best floor(n/eta). ASHA would *pause*
a trial it cannot promote yet (fewer than eta values) and maybe promote it later; a
trial here cannot be paused and resumed, so below eta values it goes on only when it
is the best so far (the choice Optuna's SuccessiveHalvingPruner makes for the same
reason). Ties go on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import sys
import time

RUNGS_FILE = "rungs.json"
LOCK_FILE = "rungs.lock"  # locked while rungs.json is read and replaced
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "result.json"
MAX_STATE_BYTES = 4 * 1024 * 1024  # rungs.json of 1,000 trials x ~10 rungs is ~300 KB


class Settings:
    """What the plug-in set in the environment; `None` from `settings()` when it did not."""

    def __init__(self, env: dict[str, str]) -> None:
        self.rungs = [int(step) for step in env["TACC_FLUID_RUNGS"].split(",")]
        self.eta = int(env["TACC_FLUID_ETA"])
        self.maximize = env.get("TACC_FLUID_MODE", "max") != "min"
        self.metric = env.get("TACC_FLUID_METRIC", "value")
        self.shared_dir = env["TACC_FLUID_DIR"]
        self.trial = env.get("TACC_FLUID_TRIAL") or str(os.getpid())
        self.trial_dir = env["TACC_FLUID_TRIAL_DIR"]


def settings(env: dict[str, str] | None = None) -> Settings | None:
    env = os.environ if env is None else env
    try:
        found = Settings(dict(env))
    except (KeyError, ValueError):
        return None
    if not found.rungs or found.eta < 2:
        return None
    return found


def promoted(value: float, recorded: list[float], eta: int, maximize: bool) -> bool:
    """Whether `value` is among the best max(floor(n/eta), 1) of `recorded` (which holds
    it): ASHA's rung rule, with the best-so-far rule below eta values."""
    keep = max(len(recorded) // eta, 1)
    ranked = sorted(recorded, reverse=maximize)
    threshold = ranked[keep - 1]
    return value >= threshold if maximize else value <= threshold


def best_of(values: list[float], maximize: bool) -> float:
    return max(values) if maximize else min(values)


def report(step: int, value: float) -> bool:
    """Record `value` at `step` (1-based); False: this trial should stop now."""
    found = settings()
    if found is None:
        return True
    value = float(value)
    append_metric(found, step, value)
    if step not in found.rungs:
        return True
    rung = found.rungs.index(step)
    last = rung == len(found.rungs) - 1
    if not math.isfinite(value):  # a diverged trial never goes on past a rung
        write_result(found, rung, step, value, None, stopped=not last)
        return last
    recorded = record_at_rung(found, step, value)
    best = best_of(recorded, found.maximize)
    keep = last or promoted(value, recorded, found.eta, found.maximize)
    write_result(found, rung, step, value, best, stopped=not keep)
    return keep


def append_metric(found: Settings, step: int, value: float) -> None:
    line = {
        "step": step,
        found.metric: value if math.isfinite(value) else None,
        "time": round(time.time(), 3),
    }
    os.makedirs(found.trial_dir, mode=0o700, exist_ok=True)
    path = os.path.join(found.trial_dir, METRICS_FILE)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "a") as metrics:
        metrics.write(json.dumps(line) + "\n")


def record_at_rung(found: Settings, step: int, value: float) -> list[float]:
    """Add this trial's value at rung `step` to the shared file, under an exclusive lock
    on its own lock file (fcntl.lockf: POSIX record locks, which NFS v4 carries across
    nodes); return every value recorded at that rung. The file is replaced whole
    (written beside it, then renamed), so a trial killed mid-write leaves the last one.
    A rerun trial (requeued) replaces its own value. Where the file system has no locks
    (an NFS mount without lock service: ENOLCK), the trial says so once and goes on
    unpruned rather than fail."""
    os.makedirs(found.shared_dir, mode=0o700, exist_ok=True)
    path = os.path.join(found.shared_dir, RUNGS_FILE)
    lock = os.open(
        os.path.join(found.shared_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600
    )
    try:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX)
        except OSError as exc:
            if exc.errno != errno.ENOLCK:
                raise
            warn_once(
                f"tacc_fluid: no file locks in {found.shared_dir} ({exc.strerror}): "
                "this trial is not compared with the others"
            )
            return [value]
        state = read_state(path)
        rung = state["rungs"].setdefault(str(step), {})
        rung[found.trial] = value
        temporary = f"{path}.{socket.gethostname()}.{os.getpid()}"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        return [v for v in rung.values() if isinstance(v, int | float) and math.isfinite(v)]
    finally:
        os.close(lock)  # closing the descriptor drops the lock


WARNED: set[str] = set()


def warn_once(text: str) -> None:
    if text not in WARNED:
        WARNED.add(text)
        print(text, file=sys.stderr, flush=True)


def read_state(path: str) -> dict:
    """rungs.json (no link followed, at most MAX_STATE_BYTES); missing: nothing yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return {"rungs": {}}
    with os.fdopen(fd, "rb") as handle:
        return parsed_state(handle.read(MAX_STATE_BYTES + 1))


def parsed_state(data: bytes) -> dict:
    """The shared file's content; empty, oversized or damaged: start from nothing."""
    if not data or len(data) > MAX_STATE_BYTES:
        return {"rungs": {}}
    try:
        state = json.loads(data)
    except ValueError:
        return {"rungs": {}}
    if not isinstance(state, dict) or not isinstance(state.get("rungs"), dict):
        return {"rungs": {}}
    state["rungs"] = {k: v for k, v in state["rungs"].items() if isinstance(v, dict)}
    return state


def write_result(
    found: Settings, rung: int, step: int, value: float, best: float | None, stopped: bool
) -> None:
    """The trial's last decision, for the plug-in's line in the job log (atomic)."""
    result = {
        "rung": rung + 1,
        "rungs": len(found.rungs),
        "step": step,
        "value": value if math.isfinite(value) else None,
        "best": best,
        "stopped": stopped,
        "metric": found.metric,
    }
    path = os.path.join(found.trial_dir, RESULT_FILE)
    temporary = f"{path}.{os.getpid()}"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(result, out)
    os.replace(temporary, path)
