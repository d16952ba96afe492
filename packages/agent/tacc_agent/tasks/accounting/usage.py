"""`tacc-agent usage`: the caller's own usage from Slurm's accounting (slurmdbd, read with
sacct): the CPU and GPU seconds their jobs were allocated, by month, account and
partition (tacc_contract.answers.Usage); tcloud formats them (`tcloud usage`,
docs/usage.md). The ops report (tasks/accounting/usage_report.py) reads every user's
jobs through the same functions.

Whose jobs: sacct is asked for the calling user's own (--user=<this process's uid>;
tcloud runs the agent over SSH as that user), never for a name a request carries (a
request has no such word), and a row whose User is not the caller's is dropped too, so
neither a request nor a cluster whose PrivateData shows everyone's jobs widens it.

What a job used: its allocation (AllocTRES: cpu=N, gres/gpu=N) times its wall time in
the window, from Start to End (a running job: to now) clipped to [since, until); a job
that crosses a month is split by its time in each month (the cluster's local time, as
sacct prints it). --allocations: the allocation's line only (its steps share those
resources); --duplicates: every run of a requeued job (a halted job's run before its
requeue held its resources too)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, time

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.slurm import accounting
from tacc_agent.slurm.accounting import Allocation
from tacc_agent.tasks.store import workspace
from tacc_contract import verbs
from tacc_contract.wire import BadArgument

ISO = "%Y-%m-%dT%H:%M:%S"
DEFAULT_MONTHS = 3  # the current month and the two before it
NO_ACCOUNTING = "usage reports need Slurm accounting (slurmdbd)"


@dataclass(frozen=True)
class Window:
    """[since, until) in the cluster's local time; until is never later than now."""

    since: datetime
    until: datetime


def now_here() -> datetime:
    return datetime.now().replace(microsecond=0)


def default_since(now: datetime) -> datetime:
    """The first day of the month DEFAULT_MONTHS - 1 months before now's."""
    months = now.year * 12 + now.month - 1 - (DEFAULT_MONTHS - 1)
    return datetime(months // 12, months % 12 + 1, 1)


def window(since: str | None, until: str | None, now: datetime) -> Window:
    """The window `--since`/`--until` name (both days or months included); Rejected
    (exit 2) for a word that is not a date or a since after the until."""
    try:
        first = verbs.usage_period(since, "--since")[0] if since is not None else None
        after = verbs.usage_period(until, "--until")[1] if until is not None else None
    except BadArgument as exc:
        raise Rejected(str(exc)) from None
    if first is not None and after is not None and first >= after:
        raise Rejected(f"--since {since} comes after --until {until}")
    start = datetime.combine(first, time()) if first is not None else default_since(now)
    end = min(datetime.combine(after, time()), now) if after is not None else now
    return Window(start, end)


# --- sacct ------------------------------------------------------------------------------


def allocations(scope: list[str], window: Window, config: AgentConfig) -> list[Allocation]:
    """Every run in the window of the jobs scope names, oldest first."""
    timeout = config.slurm_timeout_seconds
    found = accounting.allocations(scope, window.since, window.until, timeout, NO_ACCOUNTING)
    return sorted(found, key=lambda a: (a.start, int(a.job_id)))


# --- sums -------------------------------------------------------------------------------


def month_of(moment: datetime) -> str:
    return moment.strftime("%Y-%m")


def next_month(moment: datetime) -> datetime:
    months = moment.year * 12 + moment.month  # the month after, counted from year 0
    return datetime(months // 12, months % 12 + 1, 1)


def month_pieces(start: datetime, end: datetime) -> list[tuple[str, int]]:
    """(YYYY-MM, whole seconds) of [start, end) in each month it touches; a run of no
    time is one piece of 0 s in its month."""
    pieces = []
    while True:
        cut = min(next_month(start), end)
        pieces.append((month_of(start), int((cut - start).total_seconds())))
        if cut >= end:
            return pieces
        start = cut


def month_rows(runs: Iterable[Allocation], window: Window) -> list[dict]:
    """USAGE_ROW sums by (month, account, partition). Each job counts once in `jobs`: in
    the month of its first run in the window (a requeued job's later runs add time, not
    jobs), so the rows of any grouping sum to the number of jobs."""
    rows: dict[tuple[str, str, str], dict] = {}
    counted: set[str] = set()
    for run in runs:
        span = run.span(window.since, window.until)
        if span is None:
            continue
        for index, (month, seconds) in enumerate(month_pieces(*span)):
            row = rows.setdefault(
                (month, run.account, run.partition),
                {
                    "month": month,
                    "account": run.account,
                    "partition": run.partition,
                    "jobs": 0,
                    "running": 0,
                    "cpu_seconds": 0,
                    "gpu_seconds": 0,
                },
            )
            row["cpu_seconds"] += run.cpus * seconds
            row["gpu_seconds"] += run.gpus * seconds
            if index == 0 and run.job_id not in counted:
                counted.add(run.job_id)
                row["jobs"] += 1
                row["running"] += run.end is None
    return [rows[key] for key in sorted(rows)]


def usage(
    config: AgentConfig,
    since: str | None = None,
    until: str | None = None,
    now: datetime | None = None,
) -> dict:
    """USAGE of the calling user: their jobs only, whatever the request says."""
    user = workspace.current_user()
    span = window(since, until, now or now_here())
    runs: list[Allocation] = []
    if span.since < span.until:
        found = allocations([f"--user={os.getuid()}"], span, config)
        own = {user, str(os.getuid())}  # sacct prints the uid where it knows no name
        runs = [run for run in found if run.user in own]
    return {
        "user": user,
        "since": span.since.strftime(ISO),
        "until": span.until.strftime(ISO),
        "rows": month_rows(runs, span),
    }
