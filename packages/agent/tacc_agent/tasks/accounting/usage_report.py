"""`tacc-agent report usage`: the ops usage report, run by root on the controller (or any
node with sacct and the cluster's munge key): every user's allocated CPU- and GPU-hours
by user and account from Slurm's accounting (tasks/accounting/usage.py, sacct --allusers), beside
how busy those GPUs were by the cluster's Prometheus (tasks/accounting/gpu_time_used.py), as a
table, CSV or JSON (docs/usage.md).

Two kinds of figures, never mixed. BILLING (jobs, cpu_hours, gpu_hours): Slurm's
accounting alone (AllocTRES times the wall time), what money and quotas are decided on;
no scrape changes them. UTILISATION (gpu_util_hours: utilisation times wall time of the
jobs Prometheus has samples of; gpu_util_unsampled_hours: allocated GPU-hours of the GPU
jobs it has none of; gpu_util_percent: gpu_util_hours over the sampled jobs' allocated
GPU-hours): from what Prometheus scraped of the node daemons, a hint of how well the
GPUs were used and not a figure to bill by (a scrape can be wrong or forged). Without
Prometheus (unset, not answering) the utilisation columns are "n/a" (null in JSON) and a
warning line on stderr says why: the report itself still stands.

Root only (exit 4 otherwise): it reads every user's jobs, and Slurm shows a plain user
only their own where PrivateData hides jobs, which would be a report that looks whole
and is not.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_OK, AgentError
from tacc_agent.slurm.accounting import Allocation
from tacc_agent.tasks.accounting import gpu_time_used
from tacc_agent.tasks.accounting.usage import ISO, Window, allocations, now_here, window

EXIT_NOT_ROOT = 4
FORMATS = ("table", "csv", "json")
BILLING = ("jobs", "cpu_hours", "gpu_hours")
UTILISATION = ("gpu_util_hours", "gpu_util_unsampled_hours", "gpu_util_percent")
COLUMNS = ("user", "account", *BILLING, *UTILISATION)
SOURCES = {
    **dict.fromkeys(BILLING, "Slurm accounting (sacct): billing"),
    **dict.fromkeys(UTILISATION, "Prometheus scrape: utilisation, not billing"),
}
NOT_AVAILABLE = "n/a"
HOUR = 3600.0


class NotRoot(AgentError):
    """The report asked by someone else than root."""

    def __init__(self) -> None:
        super().__init__(
            "report usage: run it as root on the controller (sudo tacc-agent report usage): "
            "it reads every user's jobs from Slurm's accounting",
            EXIT_NOT_ROOT,
        )


@dataclass
class Totals:
    """One user and account's sums (seconds)."""

    jobs: set
    cpu_seconds: float = 0.0
    gpu_seconds: float = 0.0
    util_seconds: float = 0.0
    unsampled_seconds: float = 0.0


def wall_seconds(run: Allocation, span: Window) -> float:
    """The run's seconds in the window; -1 when it ran outside it."""
    inside = run.span(span.since, span.until)
    return (inside[1] - inside[0]).total_seconds() if inside is not None else -1.0


def job_seconds(runs: Iterable[Allocation], span: Window) -> dict[str, float]:
    """Each GPU job's wall seconds in the window (a requeued job's runs added up)."""
    seconds: dict[str, float] = {}
    for run in runs:
        if run.gpus > 0 and (wall := wall_seconds(run, span)) >= 0:
            seconds[run.job_id] = seconds.get(run.job_id, 0.0) + wall
    return seconds


def totals(
    runs: Sequence[Allocation], span: Window, busy: dict[str, float] | None
) -> dict[tuple[str, str], Totals]:
    """Sums by (user, account); a job's busy GPU-seconds (utilisation, from the scrape)
    are spread over its runs by their share of its allocated GPU-seconds (a requeued
    job: each run its part). The billing sums never read `busy`."""
    allocated: dict[str, float] = {}
    for run in runs:
        allocated[run.job_id] = allocated.get(run.job_id, 0.0) + run.gpus * max(
            0.0, wall_seconds(run, span)
        )
    found: dict[tuple[str, str], Totals] = {}
    for run in runs:
        seconds = wall_seconds(run, span)
        if seconds < 0:
            continue
        row = found.setdefault((run.user, run.account), Totals(set()))
        row.jobs.add(run.job_id)
        row.cpu_seconds += run.cpus * seconds
        gpu_seconds = run.gpus * seconds
        row.gpu_seconds += gpu_seconds
        if busy is None or gpu_seconds == 0:
            continue
        if run.job_id in busy:
            row.util_seconds += busy[run.job_id] * gpu_seconds / allocated[run.job_id]
        else:
            row.unsampled_seconds += gpu_seconds
    return found


def hours(seconds: float) -> float:
    return round(seconds / HOUR, 4)


def report_row(user: str, account: str, sums: Totals, sampled: bool) -> dict:
    billing = {
        "jobs": len(sums.jobs),
        "cpu_hours": hours(sums.cpu_seconds),
        "gpu_hours": hours(sums.gpu_seconds),
    }
    row = {"user": user, "account": account, **billing}
    if not sampled:
        return row | dict.fromkeys(UTILISATION)
    base = sums.gpu_seconds - sums.unsampled_seconds
    percent = round(100.0 * sums.util_seconds / base, 1) if base > 0 else None
    return row | {
        "gpu_util_hours": hours(sums.util_seconds),
        "gpu_util_unsampled_hours": hours(sums.unsampled_seconds),
        "gpu_util_percent": percent,
    }


def build(runs: Sequence[Allocation], span: Window, measured: gpu_time_used.Measured) -> dict:
    """The report as data (what --format json prints)."""
    by_row = totals(runs, span, measured.used)
    every = Totals(set())
    for sums in by_row.values():
        every.jobs |= sums.jobs
        for name in ("cpu_seconds", "gpu_seconds", "util_seconds", "unsampled_seconds"):
            setattr(every, name, getattr(every, name) + getattr(sums, name))
    rows = [
        report_row(user, account, by_row[user, account], measured.used is not None)
        for user, account in sorted(by_row)
    ]
    warnings = list(measured.warnings)
    if measured.used is not None and every.unsampled_seconds > 0:
        warnings.append(
            f"{hours(every.unsampled_seconds):g} allocated GPU-hours have no utilization "
            "samples in Prometheus (older than its retention, or their nodes were not "
            "scraped): they are in gpu_util_unsampled_hours, not in gpu_util_hours"
        )
    return {
        "since": span.since.strftime(ISO),
        "until": span.until.strftime(ISO),
        "rows": rows,
        "total": report_row("", "", every, measured.used is not None),
        "warnings": warnings,
        "sources": SOURCES,
    }


def shown(value: object, digits: int = 2) -> str:
    if value is None:
        return NOT_AVAILABLE
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def digits(column: str, hours_digits: int) -> int:
    return 1 if column == "gpu_util_percent" else hours_digits


def heading(column: str) -> str:
    return column.upper().replace("_", "-").replace("-PERCENT", "%")


def sources_line() -> str:
    """Where each column comes from: 'JOBS, CPU-HOURS, GPU-HOURS: Slurm ...; ...'."""
    by_source: dict[str, list[str]] = {}
    for column, source in SOURCES.items():
        by_source.setdefault(source, []).append(heading(column))
    return "; ".join(f"{', '.join(columns)}: {source}" for source, columns in by_source.items())


def table_text(report: dict) -> str:
    total = {**report["total"], "user": "TOTAL", "account": ""}
    cells = [[shown(row[c], digits(c, 2)) for c in COLUMNS] for row in [*report["rows"], total]]
    head = [heading(c) for c in COLUMNS]
    widths = [max(len(text) for text in column) for column in zip(head, *cells, strict=True)]
    numeric = [c not in ("user", "account") for c in COLUMNS]

    def line(texts: list[str]) -> str:
        return "  ".join(
            t.rjust(w) if right else t.ljust(w)
            for t, w, right in zip(texts, widths, numeric, strict=True)
        ).rstrip()

    title = f"GPU and CPU hours from {report['since']} to {report['until']}"
    lines = [title, line(head), *(line(row) for row in cells), sources_line()]
    return "\n".join(lines) + "\n"


def csv_text(report: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in report["rows"]:
        writer.writerow([shown(row[c], digits(c, 4)) for c in COLUMNS])
    return out.getvalue()


def formatted(report: dict, form: str) -> str:
    if form == "json":
        return json.dumps(report, indent=1, sort_keys=True) + "\n"
    return csv_text(report) if form == "csv" else table_text(report)


def report(
    config: AgentConfig, since: str | None, until: str | None, now: datetime | None = None
) -> dict:
    """The report as data (root only)."""
    if os.geteuid() != 0:
        raise NotRoot
    span = window(since, until, now or now_here())
    runs = allocations(["--allusers"], span, config) if span.since < span.until else []
    measured = gpu_time_used.used_gpu_seconds(
        config.prometheus_url,
        span.since.timestamp(),
        span.until.timestamp(),
        job_seconds(runs, span),
    )
    return build(runs, span, measured)


def run(config: AgentConfig, since: str | None, until: str | None, form: str) -> int:
    """The CLI verb: the report on stdout, warnings and errors on stderr (a person or a
    cron job reads them), exit 2 bad dates, 3 Slurm, 4 not root."""
    try:
        data = report(config, since, until)
    except AgentError as exc:
        print(f"tacc-agent: error: {exc}", file=sys.stderr)
        return exc.exit_code
    for warning in data["warnings"]:
        print(f"tacc-agent: warning: {warning}", file=sys.stderr)
    sys.stdout.write(formatted(data, form))
    return AGENT_OK
