"""Where the time of one submit goes (issue [12] point 1), from four clocks that are one
clock on the lab (its nodes are containers of one host):

- the client's steps: TCLOUD_TIMING lines {"step", "start", "end"} (tcloud/timing.py),
  between the bench's launch of `tcloud submit` and its exit;
- the job's record: its QUEUED event (written just before sbatch) and RUNNING event;
- Slurm's logs: slurmctld's submission and allocation lines, slurmd's batch launch;
- the job's marks in status/timing/ (tacc_agent/tasks/execute/timing.py): the batch step's
  process start, code start, environment, srun; rank 0's process start, code start,
  rendezvous, program start, first output line.

`split` turns one sample's points into named steps (seconds), `table` prints the median
of every step over the samples of each run, side by side.
"""

from __future__ import annotations

import calendar
import math
import re
import statistics
from collections import Counter
from datetime import datetime

# slurmctld's lines: the submission, and the allocation by the main scheduler ("sched:
# Allocate JobId=N") or by the backfill scheduler ("Started JobId=N in ..."); slurmd's
# batch launch.
SUBMITTED = re.compile(r"^\[(\S+)\] _slurm_rpc_submit_batch_job: JobId=(\d+) ")
ALLOCATED = re.compile(
    r"^\[(\S+)\] (sched): Allocate JobId=(\d+) |"
    r"^\[(\S+)\] (sched/backfill): _start_job: Started JobId=(\d+) "
)
LAUNCHED = re.compile(r"^\[(\S+)\] Launching batch job (\d+) ")
CTLD_GREP = "grep -E 'submit_batch_job: JobId=|Allocate JobId=|Started JobId=' "
SLURMD_GREP = "grep -E 'Launching batch job' "

# The cluster's chain, in order: (step, from point, to point).
CLUSTER_CHAIN = [
    ("sbatch (command + RPC)", "queued", "submitted"),
    ("Slurm schedules (submit -> allocated)", "submitted", "allocated"),
    ("slurmctld -> slurmd batch launch", "allocated", "slurmd_launch"),
    ("slurmstepd + job.sh start", "slurmd_launch", "batch.process"),
    ("batch step: Python start + imports", "batch.process", "batch.batch"),
    ("batch step: records + environment", "batch.batch", "batch.environment"),
    ("batch step: setup lines", "batch.environment", "batch.srun"),
    ("srun -> wrapper process (step launch)", "batch.srun", "rank-0.process"),
    ("wrapper: Python start + imports", "rank-0.process", "rank-0.wrapper"),
    ("wrapper: facts + plug-ins + rendezvous", "rank-0.wrapper", "rank-0.rendezvous"),
    ("wrapper: RUNNING record -> program start", "rank-0.rendezvous", "rank-0.program"),
    ("program start -> its first line", "rank-0.program", "rank-0.first_output"),
]
BASELINE_CHAIN = [
    ("ssh + sbatch (command + RPC)", "launch", "submitted"),
    ("Slurm schedules (submit -> allocated)", "submitted", "allocated"),
    ("slurmctld -> slurmd batch launch", "allocated", "slurmd_launch"),
    ("slurmstepd + batch script -> first line", "slurmd_launch", "first_line"),
]
TOTALS = [
    ("TOTAL submit command (launch -> exit)", "launch", "exit"),
    ("TOTAL launch -> RUNNING record", "launch", "running"),
    ("TOTAL launch -> program's first line", "launch", "rank-0.first_output"),
]
BASELINE_TOTALS = [("TOTAL launch -> batch script's first line", "launch", "first_line")]


def log_time(stamp: str) -> float:
    """A Slurm log's iso8601_ms time (the lab's nodes run in UTC) as a clock time."""
    parsed = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f")
    return calendar.timegm(parsed.timetuple()) + parsed.microsecond / 1e6


def slurm_points(ctld_log: str, slurmd_logs: str) -> dict[str, dict[str, float | str]]:
    """{job id: {"submitted", "allocated", "by", "slurmd_launch"}} from the grep output
    of slurmctld's log (CTLD_GREP) and of the compute nodes' slurmd logs (SLURMD_GREP)."""
    found: dict[str, dict[str, float | str]] = {}
    for line in ctld_log.splitlines():
        if match := SUBMITTED.match(line):
            found.setdefault(match.group(2), {})["submitted"] = log_time(match.group(1))
        elif match := ALLOCATED.match(line):
            stamp, by, job = [g for g in match.groups() if g is not None]
            found.setdefault(job, {}).update(allocated=log_time(stamp), by=by)
    for line in slurmd_logs.splitlines():
        if match := LAUNCHED.match(line):
            found.setdefault(match.group(2), {})["slurmd_launch"] = log_time(match.group(1))
    return found


def client_steps(launch: float, end: float, lines: list[dict]) -> dict[str, float]:
    """The client's own steps: its start (launch -> first step), each step by name (a
    name seen twice: "name (2)"), what ran between steps, and its exit (last step ->
    exit)."""
    steps: dict[str, float] = {}
    if not lines:
        return steps
    lines = sorted(lines, key=lambda x: x["start"])
    seen: Counter[str] = Counter()
    steps["client: start (Python + imports + task compile)"] = lines[0]["start"] - launch
    between = 0.0
    cursor = lines[0]["start"]
    for line in lines:
        seen[line["step"]] += 1
        count = seen[line["step"]]
        name = f"client: {line['step']}" + (f" ({count})" if count > 1 else "")
        steps[name] = line["end"] - line["start"]
        between += max(0.0, line["start"] - cursor)
        cursor = max(cursor, line["end"])
    steps["client: between steps (hashing, manifest, ...)"] = between
    steps["client: after last step -> exit"] = end - cursor
    return steps


def chain(points: dict[str, float], links: list[tuple[str, str, str]]) -> dict[str, float]:
    return {
        name: points[stop] - points[start]
        for name, start, stop in links
        if start in points and stop in points
    }


def split(sample: dict) -> dict[str, float]:
    """One tcloud sample's steps: client steps, then the cluster's chain, then totals."""
    points = dict(sample["points"])
    return (
        client_steps(points["launch"], points["exit"], sample.get("client", []))
        | chain(points, CLUSTER_CHAIN)
        | chain(points, TOTALS)
    )


def baseline_split(sample: dict) -> dict[str, float]:
    return chain(sample["points"], BASELINE_CHAIN) | chain(sample["points"], BASELINE_TOTALS)


def medians(splits: list[dict[str, float]]) -> dict[str, float]:
    """Median per step over the samples that have it, in the order steps first appear."""
    order: list[str] = []
    for one in splits:
        order += [name for name in one if name not in order]
    return {
        name: statistics.median(values)
        for name in order
        if (values := [one[name] for one in splits if name in one and math.isfinite(one[name])])
    }


def table(columns: dict[str, dict[str, float]]) -> str:
    """A Markdown table: one row per step, one column per run (median seconds)."""
    order: list[str] = []
    for column in columns.values():
        order += [name for name in column if name not in order]
    head = "| step | " + " | ".join(columns) + " |"
    rule = "| --- |" + " ---: |" * len(columns)
    rows = [
        f"| {name} | "
        + " | ".join(f"{c[name]:.3f}" if name in c else "" for c in columns.values())
        + " |"
        for name in order
    ]
    return "\n".join([head, rule, *rows])
