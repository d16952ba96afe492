"""`tcloud top`: a job's live usage per node (JOB_TOP answers) as text frames. CPU% is
the rate of the node's cpu_seconds counter between two answers over their `sampled`
times (100% = one CPU busy), so the first frame shows "-". On a terminal each frame is
drawn in place with two ANSI sequences (cursor home, clear to the end): a table of a few
rows redrawn every couple of seconds needs no TUI library (curses is missing on Windows,
and a full-screen library would take the terminal over and lose the last frame at exit).
"""

from __future__ import annotations

import re

from tacc_contract.jobs import FINAL_STATES

HOME_AND_CLEAR = "\x1b[H\x1b[J"
COLUMNS = ("NODE", "CPU%", "CPUS", "MEMORY", "GPUS")


def node_key(node: dict) -> tuple[str, int]:
    return node["host"], node["rank"]


def cpu_percent(before: dict | None, now: dict) -> float | None:
    """The node's CPU use between two answers, in percent of one CPU; None when unknown."""
    if before is None:
        return None
    try:
        seconds = float(now["cpu_seconds"]) - float(before["cpu_seconds"])
        elapsed = float(now["sampled"]) - float(before["sampled"])
    except (KeyError, TypeError, ValueError):
        return None
    # Sampled no later than before (the daemon's cached figures again, a clock stepped
    # back) or a counter that went down (a process gone): no rate, "-".
    if not elapsed > 0 or seconds < 0:
        return None
    return 100.0 * seconds / elapsed


def size(value: int | None) -> str:
    """Bytes as people read them (binary units)."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    return f"{amount:.1f} TiB"


def gpu_text(gpu: dict) -> str:
    ratio = gpu.get("utilization_ratio")
    util = "-" if ratio is None else f"{100 * ratio:.0f}%"
    used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
    return f"gpu{gpu['index']} {util} {size(used)}/{size(total)}"


def row(node: dict, before: dict | None) -> list[str]:
    where = f"{node['host']}:{node['rank']}"
    if node.get("error"):
        return [where, "-", "-", "-", f"error: {node['error']}"]
    percent = cpu_percent(before, node)
    cpus = node.get("cpus")
    return [
        where,
        "-" if percent is None else f"{percent:.0f}",
        "-" if cpus is None else str(cpus),
        size(node.get("memory_bytes")),
        ", ".join(gpu_text(gpu) for gpu in node.get("gpus") or []) or "-",
    ]


def frame(answer: dict, previous: dict | None) -> str:
    """One frame of the table: the job's state and a row per node (CPU% against the
    previous answer's figures for the same node)."""
    before = {node_key(n): n for n in (previous or {}).get("nodes", []) if not n.get("error")}
    rows = [list(COLUMNS)] + [row(node, before.get(node_key(node))) for node in answer["nodes"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS) - 1)]
    lines = [f"job {answer['job_id']} {answer['state']}"]
    for cells in rows:
        fixed = "  ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=False))
        lines.append(f"{fixed}  {cells[-1]}".rstrip())
    return "\n".join(lines) + "\n"


def drawn(text: str, in_place: bool) -> str:
    """A frame as written: over the last one on a terminal, after it otherwise."""
    return HOME_AND_CLEAR + text if in_place else text + "\n"


def ended_state(message: str, job_id: str) -> str | None:
    """The final state named by the agent's refusal of a job that is no longer running
    ("job 42 is COMPLETED: ..."), None for any other refusal."""
    said = re.match(rf"job {re.escape(job_id)} is ([A-Z_]+)\b", message)
    if said is None or said.group(1) not in FINAL_STATES:
        return None
    return said.group(1)
