"""What slurmctld says of itself: `scontrol ping` (is a controller up?) and `scontrol
show config` (its settings, "Key = Value" lines)."""

from __future__ import annotations

import re

from tacc_agent.errors import AgentError
from tacc_agent.slurm import run

PING_LINE = re.compile(r"^Slurmctld\((\w+)\) at (\S+) is (UP|DOWN)\s*$", re.MULTILINE)
CONFIG_KEY = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def slurmctld_up(text: str) -> bool:
    """Whether any controller (primary or backup) answered `scontrol ping` ("Slurmctld(
    primary) at n1 is UP"); AgentError when no line names a controller."""
    states = [found.group(3) for found in PING_LINE.finditer(text)]
    if not states:
        raise AgentError(f"scontrol ping: no controller line in {text[:200]!r}")
    return "UP" in states


def parse_config(text: str) -> dict[str, str]:
    """`scontrol show config`'s settings by name ("AccountingStorageType =
    accounting_storage/slurmdbd"); the value is the rest of the line, stripped. Lines
    that set nothing (the heading, blank lines) are left out."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and CONFIG_KEY.fullmatch(key.strip()):
            found.setdefault(key.strip(), value.strip())
    return found


def show_config(timeout: float = run.TIMEOUT) -> dict[str, str]:
    """slurmctld's settings (parse_config)."""
    return parse_config(run.output(["scontrol", "show", "config"], timeout))
