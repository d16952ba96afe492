"""`tacc-agent report usage`: the ops usage report, run by root on the controller (or any
node with sacct and the cluster's munge key): every user's allocated CPU- and GPU-hours
by user and account from Slurm's accounting (tasks/usage.py, sacct --allusers), beside
the GPU-hours those jobs really used from the cluster's Prometheus
(tasks/gpu_time_used.py), as a table, CSV or JSON (docs/usage.md).

Columns: user, account, jobs, cpu_hours, gpu_hours (allocated), gpu_hours_used (the
jobs Prometheus has samples of), gpu_hours_unmeasured (allocated GPU-hours of the GPU
jobs it has none of), gpu_used_percent (used over the measured jobs' allocated
GPU-hours). Without Prometheus (unset, not answering) the last three are "n/a" (null in
JSON) and a warning line on stderr says why: the report itself still stands.

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
from tacc_agent.errors import EXIT_OK, AgentError
from tacc_agent.tasks import gpu_time_used
from tacc_agent.tasks.usage import ISO, Allocation, Window, allocations, now_here, window

EXIT_NOT_ROOT = 4
FORMATS = ("table", "csv", "json")
COLUMNS = ("user", "account", "jobs", "cpu_hours", "gpu_hours", "gpu_hours_used",
           "gpu_hours_unmeasured", "gpu_used_percent")  # fmt: skip
MEASURED = ("gpu_hours_used", "gpu_hours_unmeasured", "gpu_used_percent")
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
    used_seconds: float = 0.0
    unmeasured_seconds: float = 0.0


def wall_seconds(run: Allocation, span: Window) -> float:
    """The run's seconds in the window; -1 when it ran outside it."""
    inside = run.span(span)
    return (inside[1] - inside[0]).total_seconds() if inside is not None else -1.0


def job_seconds(runs: Iterable[Allocation], span: Window) -> dict[str, float]:
    """Each GPU job's wall seconds in the window (a requeued job's runs added up)."""
    seconds: dict[str, float] = {}
    for run in runs:
        if run.gpus > 0 and (wall := wall_seconds(run, span)) >= 0:
            seconds[run.job_id] = seconds.get(run.job_id, 0.0) + wall
    return seconds


def totals(
    runs: Sequence[Allocation], span: Window, used: dict[str, float] | None
) -> dict[tuple[str, str], Totals]:
    """Sums by (user, account); a job's used GPU-seconds are spread over its runs by
    their share of its allocated GPU-seconds (a requeued job: each run its part)."""
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
        if used is None or gpu_seconds == 0:
            continue
        if run.job_id in used:
            row.used_seconds += used[run.job_id] * gpu_seconds / allocated[run.job_id]
        else:
            row.unmeasured_seconds += gpu_seconds
    return found


def hours(seconds: float) -> float:
    return round(seconds / HOUR, 4)


def report_row(user: str, account: str, sums: Totals, measured: bool) -> dict:
    row = {"user": user, "account": account, "jobs": len(sums.jobs),
           "cpu_hours": hours(sums.cpu_seconds), "gpu_hours": hours(sums.gpu_seconds)}  # fmt: skip
    if not measured:
        return row | dict.fromkeys(MEASURED)
    base = sums.gpu_seconds - sums.unmeasured_seconds
    percent = round(100.0 * sums.used_seconds / base, 1) if base > 0 else None
    return row | {"gpu_hours_used": hours(sums.used_seconds),
                  "gpu_hours_unmeasured": hours(sums.unmeasured_seconds),
                  "gpu_used_percent": percent}  # fmt: skip


def build(runs: Sequence[Allocation], span: Window, measured: gpu_time_used.Measured) -> dict:
    """The report as data (what --format json prints)."""
    by_row = totals(runs, span, measured.used)
    every = Totals(set())
    for sums in by_row.values():
        every.jobs |= sums.jobs
        for name in ("cpu_seconds", "gpu_seconds", "used_seconds", "unmeasured_seconds"):
            setattr(every, name, getattr(every, name) + getattr(sums, name))
    rows = [report_row(user, account, by_row[user, account], measured.used is not None)
            for user, account in sorted(by_row)]  # fmt: skip
    warnings = list(measured.warnings)
    if measured.used is not None and every.unmeasured_seconds > 0:
        warnings.append(
            f"{hours(every.unmeasured_seconds):g} allocated GPU-hours have no utilization "
            "samples in Prometheus (older than its retention, or their nodes were not "
            "scraped): they are in gpu_hours_unmeasured, not in gpu_hours_used"
        )
    return {"since": span.since.strftime(ISO), "until": span.until.strftime(ISO),
            "rows": rows, "total": report_row("", "", every, measured.used is not None),
            "warnings": warnings}  # fmt: skip


def shown(value: object, digits: int = 2) -> str:
    if value is None:
        return NOT_AVAILABLE
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def digits(column: str, hours_digits: int) -> int:
    return 1 if column == "gpu_used_percent" else hours_digits


def table_text(report: dict) -> str:
    total = {**report["total"], "user": "TOTAL", "account": ""}
    cells = [[shown(row[c], digits(c, 2)) for c in COLUMNS] for row in [*report["rows"], total]]
    head = [c.upper().replace("_", "-").replace("-PERCENT", "%") for c in COLUMNS]
    widths = [max(len(text) for text in column) for column in zip(head, *cells, strict=True)]
    numeric = [c not in ("user", "account") for c in COLUMNS]

    def line(texts: list[str]) -> str:
        return "  ".join(
            t.rjust(w) if right else t.ljust(w)
            for t, w, right in zip(texts, widths, numeric, strict=True)
        ).rstrip()

    title = f"GPU and CPU hours from {report['since']} to {report['until']}"
    return "\n".join([title, line(head), *(line(row) for row in cells)]) + "\n"


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
        config.prometheus_url, span.since.timestamp(), span.until.timestamp(),
        job_seconds(runs, span),
    )  # fmt: skip
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
    return EXIT_OK
