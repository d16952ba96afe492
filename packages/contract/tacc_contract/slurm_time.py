"""Slurm's time formats, read the same way by the agent (the checkpoint signal, the
default limit) and by plug-ins (a predicted limit capped at the cluster's default)."""

from __future__ import annotations


def time_seconds(text: str) -> int | None:
    """Slurm's time formats (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); None when unlimited."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
