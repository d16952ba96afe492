"""`tcloud usage`: your own CPU- and GPU-hours from the cluster's Slurm accounting, by
month, account and partition (any of them, `--by`), as a table, CSV or JSON. The agent
answers raw sums by month, account and partition for the calling user only
(tacc_contract.answers.Usage, tacc_agent/tasks/accounting/usage.py); this module groups
and formats them (docs/usage.md).

A job counts once in `jobs` (in the first month it ran in the window), so rows grouped
any way add up to the number of jobs; its hours are split by its time in each month."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from tacc_contract import answers, protocol, verbs
from tcloud.errors import UsageError
from tcloud.transport.agent import call

if TYPE_CHECKING:
    import paramiko

GROUPS = ("month", "account", "partition")
FORMATS = ("table", "csv", "json")
SUMS = ("jobs", "running", "cpu_seconds", "gpu_seconds")
HOUR = 3600.0


def group_words(by: str | Sequence[str]) -> tuple[str, ...]:
    """`--by month,account` (or a sequence of words): the group words in the order
    given; UsageError (exit 2) naming an unknown word."""
    words = [w.strip() for w in by.split(",")] if isinstance(by, str) else list(by)
    unknown = [word for word in words if word not in GROUPS]
    if unknown or not words:
        raise UsageError(
            f"--by: unknown group {', '.join(map(repr, unknown or ['']))} (expected one or "
            f"more of {', '.join(GROUPS)}, comma-separated)"
        )
    return tuple(dict.fromkeys(words))


def request(
    since: str | None, until: str | None, by: str | Sequence[str]
) -> tuple[dict[str, str | None], tuple[str, ...]]:
    """(the `usage` verb's fields, the group words), both checked before anything is
    asked: UsageError (exit 2) for a date that is not one, a since after the until, an
    unknown group."""
    groups = group_words(by)
    fields = {"since": since, "until": until}
    try:
        verbs.USAGE.request(**fields)
    except protocol.BadArgument as exc:
        raise UsageError(str(exc)) from None
    return fields, groups


def hours(seconds: float) -> float:
    return round(seconds / HOUR, 4)


def with_hours(row: dict) -> dict:
    return {**row, "cpu_hours": hours(row["cpu_seconds"]), "gpu_hours": hours(row["gpu_seconds"])}


def grouped(rows: Iterable[dict], by: Sequence[str]) -> list[dict]:
    """The agent's rows summed by the `by` words, sorted by them."""
    sums: dict[tuple, dict] = {}
    for row in rows:
        key = tuple(row[word] for word in by)
        total = sums.setdefault(key, {**dict(zip(by, key, strict=True)), **dict.fromkeys(SUMS, 0)})
        for name in SUMS:
            total[name] += row.get(name, 0)
    return [with_hours(sums[key]) for key in sorted(sums)]


def total(rows: Iterable[dict]) -> dict:
    return with_hours({name: sum(row.get(name, 0) for row in rows) for name in SUMS})


def build(answer: dict, by: Sequence[str]) -> dict:
    """The report as data (what --format json prints and Cluster.usage returns)."""
    rows = answer["rows"]
    return {
        "user": answer["user"],
        "since": answer["since"],
        "until": answer["until"],
        "by": list(by),
        "rows": grouped(rows, by),
        "total": total(rows),
    }


def ask(client: paramiko.SSHClient, userdir: str | None, fields: dict) -> answers.Usage:
    """The agent's `usage` answer (checked against its type)."""
    return call(client, verbs.USAGE, userdir, **fields)


def columns(by: Sequence[str]) -> tuple[str, ...]:
    return (*by, "jobs", "cpu_hours", "gpu_hours")


def cell(value: object, digits: int) -> str:
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value) if value != "" else "-"


def table_text(data: dict) -> str:
    """Columns aligned, numbers to the right, a TOTAL line; running jobs said below."""
    names = columns(data["by"])
    labels = {word: "" for word in data["by"]} | {data["by"][0]: "TOTAL"}
    lines = [[cell(row[c], 2) for c in names] for row in data["rows"]]
    lines.append([labels.get(c) if c in labels else cell(data["total"][c], 2) for c in names])
    head = [c.upper().replace("_", "-") for c in names]
    widths = [max(len(text) for text in column) for column in zip(head, *lines, strict=True)]
    numeric = [c not in GROUPS for c in names]

    def line(texts: list[str]) -> str:
        return "  ".join(
            t.rjust(w) if right else t.ljust(w)
            for t, w, right in zip(texts, widths, numeric, strict=True)
        ).rstrip()

    text = [
        f"{data['user']}: CPU and GPU hours from {data['since']} to {data['until']}",
        line(head),
        *(line(row) for row in lines),
    ]
    if running := data["total"]["running"]:
        text.append(f"{running} job(s) still running: counted up to {data['until']}")
    return "\n".join(text) + "\n"


def csv_text(data: dict) -> str:
    """A header row, then one row per group (no total: a spreadsheet sums)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    names = columns(data["by"])
    writer.writerow(names)
    for row in data["rows"]:
        writer.writerow([cell(row[c], 4) if c not in GROUPS else row[c] for c in names])
    return out.getvalue()


def formatted(data: dict, form: str) -> str:
    if form == "json":
        return json.dumps(data, indent=2, sort_keys=True) + "\n"
    return csv_text(data) if form == "csv" else table_text(data)
