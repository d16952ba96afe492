"""`tacc-agent usage`: the caller's own usage from Slurm's accounting (slurmdbd, read with
sacct): the CPU and GPU seconds their jobs were allocated, by month, account and
partition (protocol.USAGE); tcloud formats them (`tcloud usage`, docs/usage.md). The ops
report (tasks/accounting/usage_report.py) reads every user's jobs through the same functions.

Whose jobs: sacct is asked for the calling user's own (--user=<this process's uid>;
tcloud runs the agent over SSH as that user), never for a name a request carries (a
request has no such word), and a row whose User is not the caller's is dropped too, so
neither a request nor a cluster whose PrivateData shows everyone's jobs widens it.

What a job used: its allocation (AllocTRES: cpu=N, gres/gpu=N) times its wall time in
the window, from Start to End (a running job: to now) clipped to [since, until); a job
that crosses a month is split by its time in each month (the cluster's local time, as
sacct prints it). --allocations: the allocation's line only (its steps share those
resources); --duplicates: every run of a requeued job (a halted job's run before its
requeue held its resources too).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, time

from tacc_agent.config import AgentConfig
from tacc_agent.errors import EXIT_CLUSTER, AgentError, Rejected
from tacc_agent.tasks.store import workspace
from tacc_contract import protocol

FIELDS = (
    "JobIDRaw",
    "User",
    "Account",
    "Partition",
    "State",
    "Start",
    "End",
    "AllocCPUS",
    "AllocTRES",
)
ISO = "%Y-%m-%dT%H:%M:%S"
WHOLE = re.compile(r"[0-9]+")
GPU_TRES = "gres/gpu"
# sacct prints times as SLURM_TIME_FORMAT says; a user's own setting must not change them.
SACCT_ENV = {"SLURM_TIME_FORMAT": "standard"}
DEFAULT_MONTHS = 3  # the current month and the two before it
NO_ACCOUNTING = "usage reports need Slurm accounting (slurmdbd)"


@dataclass(frozen=True)
class Window:
    """[since, until) in the cluster's local time; until is never later than now."""

    since: datetime
    until: datetime

    def sacct_words(self) -> list[str]:
        return [f"--starttime={self.since.strftime(ISO)}", f"--endtime={self.until.strftime(ISO)}"]


@dataclass(frozen=True)
class Allocation:
    """One run of one job as sacct reports it (--allocations --duplicates)."""

    job_id: str
    user: str
    account: str
    partition: str
    state: str
    start: datetime
    end: datetime | None  # None: still running
    cpus: int
    gpus: int

    def span(self, window: Window) -> tuple[datetime, datetime] | None:
        """The part of its run inside the window (a running job: up to its end, now)."""
        start = max(self.start, window.since)
        end = min(self.end or window.until, window.until)
        return (start, end) if start <= end else None


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
        first = protocol.usage_period(since, "--since")[0] if since is not None else None
        after = protocol.usage_period(until, "--until")[1] if until is not None else None
    except protocol.BadArgument as exc:
        raise Rejected(str(exc)) from None
    if first is not None and after is not None and first >= after:
        raise Rejected(f"--since {since} comes after --until {until}")
    start = datetime.combine(first, time()) if first is not None else default_since(now)
    end = min(datetime.combine(after, time()), now) if after is not None else now
    return Window(start, end)


# --- sacct ------------------------------------------------------------------------------


def sacct_argv(scope: list[str], window: Window) -> list[str]:
    """scope: ["--user=UID"] (a researcher's own report) or ["--allusers"] (ops)."""
    return [
        "sacct",
        "--noheader",
        "--parsable2",
        "--allocations",
        "--duplicates",
        *scope,
        *window.sacct_words(),
        "--format=" + ",".join(FIELDS),
    ]


def run_sacct(argv: list[str], timeout: float) -> str:
    """sacct's stdout; AgentError (exit 3) when it fails, hangs or is missing."""
    env = {**os.environ, **SACCT_ENV}
    try:
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, check=False, env=env
        )
    except FileNotFoundError:
        raise AgentError(f"sacct not found: {NO_ACCOUNTING}", EXIT_CLUSTER) from None
    except subprocess.TimeoutExpired:
        raise AgentError(f"sacct did not answer within {timeout:g} s", EXIT_CLUSTER) from None
    if proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        raise AgentError(f"sacct failed: {message} ({NO_ACCOUNTING})", EXIT_CLUSTER)
    return proc.stdout


def tres(text: str) -> dict[str, str]:
    """A TRES string (cpu=4,mem=16G,node=1,billing=4,gres/gpu=2) as {name: value}."""
    pairs = (item.partition("=") for item in text.split(","))
    return {name.strip(): value.strip() for name, sep, value in pairs if sep and name.strip()}


def whole(text: str) -> int:
    return int(text) if WHOLE.fullmatch(text) else 0


def gpus_of(counts: dict[str, str]) -> int:
    """gres/gpu=N; where Slurm names only typed GPUs (gres/gpu:a100=N), their sum."""
    if GPU_TRES in counts:
        return whole(counts[GPU_TRES])
    return sum(whole(value) for name, value in counts.items() if name.startswith(GPU_TRES + ":"))


def moment(text: str) -> datetime | None:
    """A sacct time; None for Unknown, None or anything else that is not one."""
    try:
        return datetime.strptime(text.strip(), ISO)
    except ValueError:
        return None


def parse_line(line: str) -> Allocation | None:
    """One sacct line (FIELDS, '|' between them); None for a job that never started or
    a line that is not one."""
    values = line.split("|")
    if len(values) != len(FIELDS):
        return None
    row = dict(zip(FIELDS, values, strict=True))
    start = moment(row["Start"])
    if start is None or not WHOLE.fullmatch(row["JobIDRaw"]):
        return None
    counts = tres(row["AllocTRES"])
    cpus = whole(counts.get("cpu", "")) or whole(row["AllocCPUS"])
    return Allocation(
        job_id=row["JobIDRaw"],
        user=row["User"],
        account=row["Account"],
        partition=row["Partition"],
        state=row["State"].split(" ")[0],
        start=start,
        end=moment(row["End"]),
        cpus=cpus,
        gpus=gpus_of(counts),
    )


def allocations(scope: list[str], window: Window, config: AgentConfig) -> list[Allocation]:
    """Every run in the window of the jobs scope names, oldest first."""
    out = run_sacct(sacct_argv(scope, window), config.slurm_timeout_seconds)
    found = (parse_line(line) for line in out.splitlines() if line.strip())
    return sorted((a for a in found if a is not None), key=lambda a: (a.start, int(a.job_id)))


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
        span = run.span(window)
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
