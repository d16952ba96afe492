"""Duration prediction ("AI for systems" time prediction; the paper's expected
duration): when a task sets no time limit, predict its run time from the caller's
earlier runs of the same instruction digest, else of the same entry point (task name
and run lines), and ask Slurm for that plus a safety margin, capped at the cluster's
default limit. A tight limit lets Slurm's backfill start the job in gaps a one-hour
default would not fit. The job log says prediction vs actual when the run ends.

The earlier runs come from `Submission.history` (the caller's job records, read by the
agent). Only runs that COMPLETED count: a failed or cancelled run says nothing about how long
the work takes. A run that hit a predicted limit (TIMEOUT) makes the next prediction
start from double that limit.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass

from tacc_contract.plugins import Outcome, PastJob, Plugin, Submission
from tacc_contract.slurm_time import time_seconds

RECENT_JOBS = 300  # earlier jobs read, newest first


@dataclass(frozen=True)
class PastRun:
    digest: str
    entrypoint: str
    seconds: float | None  # None: did not complete
    timed_out_at: float | None = None  # the limit a TIMEOUT run hit


def entrypoint_of(task) -> str:
    """Same user + entry point: the task's name and run lines."""
    text = json.dumps([task.name, list(task.run)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_seconds(entries: list[dict]) -> float | None:
    """From the last RUNNING to COMPLETED of the last run; None if it did not complete."""
    running = [e["time"] for e in entries if e.get("state") == "RUNNING" and "time" in e]
    done = [e["time"] for e in entries if e.get("state") == "COMPLETED" and "time" in e]
    if not running or not done or done[-1] < running[-1]:
        return None
    return done[-1] - running[-1]


def past_runs(jobs: list[PastJob]) -> list[PastRun]:
    """The runs of the caller's earlier jobs (newest first) that say how long one takes."""
    found = []
    for job in jobs:
        submit = job.submit
        if not submit.get("entrypoint"):
            continue
        entries = job.events
        timed_out = next((e for e in entries if "TIMEOUT" in str(e.get("reason", ""))), None)
        limit = (submit.get("plugin_data") or {}).get("duration", {}).get("limit_seconds")
        found.append(
            PastRun(
                submit.get("digest", ""),
                submit["entrypoint"],
                run_seconds(entries),
                limit if timed_out else None,
            )
        )
    return found


@dataclass(frozen=True)
class Prediction:
    seconds: int  # the limit asked for
    basis: str  # "digest" or "entrypoint"
    runs: int
    longest: float


def predict(runs: list[PastRun], digest: str, entrypoint: str, config) -> Prediction | None:
    for basis, same in (
        ("digest", lambda r: r.digest == digest and digest),
        ("entrypoint", lambda r: r.entrypoint == entrypoint),
    ):
        matching = [r for r in runs if same(r)][: config.duration_history]
        done = [r.seconds for r in matching if r.seconds is not None]
        floors = [2 * r.timed_out_at for r in matching if r.timed_out_at]
        if len(done) + len(floors) >= config.duration_min_runs:
            longest = max([*done, *floors])
            limit = longest * config.duration_margin + config.duration_pad_seconds
            return Prediction(math.ceil(limit / 60) * 60, basis, len(done), longest)
    return None


def slurm_minutes(seconds: int) -> str:
    hours, minutes = divmod(seconds // 60, 60)
    return f"{hours:02d}:{minutes:02d}:00"


class DurationPrediction(Plugin):
    name = "duration"
    order = 50
    layers = ("schedule", "execute")
    summary = "no time limit given: predict one from earlier runs (digest, then entry point)"

    def schedule(self, submission: Submission) -> None:
        task, config = submission.task, submission.config
        entrypoint = entrypoint_of(task)
        submission.data["entrypoint"] = entrypoint
        if task.resources["time"]:
            return
        runs = past_runs(submission.history(RECENT_JOBS))
        found = predict(runs, submission.digest, entrypoint, config)
        cap = time_seconds(config.default_time_limit)
        if found is None:
            return
        seconds = found.seconds if cap is None else min(found.seconds, cap)
        submission.options["time"] = slurm_minutes(seconds)
        submission.data["duration"] = {
            "limit_seconds": seconds,
            "basis": found.basis,
            "runs": found.runs,
            "longest": round(found.longest, 1),
        }
        submission.note(
            self.name,
            f"predicted {slurm_minutes(seconds)} from {found.runs} earlier run(s) of the same "
            f"{found.basis} (longest {found.longest:.0f} s, x{config.duration_margin:g} "
            f"+ {config.duration_pad_seconds} s, cap {config.default_time_limit})",
        )

    def finish(self, outcome: Outcome) -> str | None:
        predicted = (outcome.submit.get("plugin_data") or {}).get("duration")
        if not predicted:
            return None
        limit = predicted["limit_seconds"]
        return (
            f"duration: ran {outcome.seconds:.0f} s; predicted limit {limit} s "
            f"({outcome.seconds / limit:.0%} of it used)"
        )
