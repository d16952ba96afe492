"""This node's RDMA ports as sysfs shows them (<sysfs_root>/class/infiniband/<dev>/
ports/<n>/): state, phys_state, rate and error counters. Both halves of the agent read
them: the health check (health/checks/rdma.py) and the transport facts a job's ranks
agree on (tasks/schedule/transport.py)."""

from __future__ import annotations

import re
from pathlib import Path

ERROR_COUNTERS = (
    "symbol_error",
    "link_downed",
    "port_rcv_errors",
    "link_error_recovery",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
RATE = re.compile(r"([\d.]+)\s*Gb/sec")


def read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def ports(sysfs_root: str) -> list[dict]:
    found = []
    for port in sorted(Path(sysfs_root, "class", "infiniband").glob("*/ports/*")):
        rate = RATE.search(read(port / "rate"))
        counters = {}
        for name in ERROR_COUNTERS:
            text = read(port / "counters" / name)
            if text.isdigit():
                counters[name] = int(text)
        found.append(
            {
                "name": f"{port.parents[1].name}/{port.name}",
                "state": read(port / "state"),
                "phys_state": read(port / "phys_state"),
                "rate_gbps": float(rate.group(1)) if rate else 0.0,
                "counters": counters,
            }
        )
    return found
