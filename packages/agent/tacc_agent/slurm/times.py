"""Times as Slurm prints them: run times and limits ([days-][hours:]minutes:seconds) and
moments printed with run.EPOCH_TIMES (epoch seconds)."""

from __future__ import annotations

import functools
import re

ASCII_DIGITS = re.compile(r"[0-9]+")


@functools.lru_cache(maxsize=4096)  # a queue of 10,000 jobs holds few distinct run times
def elapsed_seconds(text: str) -> int:
    """A run time as Slurm prints it (squeue %M, scontrol RunTime, %l):
    [days-][hours:]minutes:seconds; 0 for UNLIMITED and the like."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(p) for p in rest.split(":") if p.isdigit()]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return (int(days) if days.isdigit() else 0) * 86400 + seconds


def epoch_seconds(text: str) -> float:
    """A time Slurm printed with EPOCH_TIMES ("1795587794") in seconds; 0 for N/A,
    Unknown and the like."""
    text = text.strip()
    return float(text) if ASCII_DIGITS.fullmatch(text) else 0.0  # "²".isdigit() is True


def run_time(seconds: int) -> str:
    """A run time as squeue prints it (%M): minutes:seconds, hours:minutes:seconds, or
    days-hours:minutes:seconds."""
    days, rest = divmod(max(0, int(seconds)), 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}-{hours:02}:{minutes:02}:{seconds:02}"
    if hours:
        return f"{hours}:{minutes:02}:{seconds:02}"
    return f"{minutes}:{seconds:02}"
