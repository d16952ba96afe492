"""Node-wide /proc files: this boot's id, the memory the kernel reports, the time since
boot, and sysctl values (/proc/sys)."""

from __future__ import annotations

from pathlib import Path

from tacc_agent.procfs import PROC

BOOT_ID = "sys/kernel/random/boot_id"
# Ports below this value take root (CAP_NET_BIND_SERVICE) to bind (Linux's sysctl).
UNPRIVILEGED_PORT_START = "sys/net/ipv4/ip_unprivileged_port_start"


def boot_id(proc_root: str = PROC) -> str:
    """This boot's id; "" when unreadable."""
    try:
        return Path(proc_root, BOOT_ID).read_text().strip()
    except OSError:
        return ""


def memory_total_kib(proc_root: str = PROC) -> int:
    """MemTotal of /proc/meminfo in KiB; OSError or ValueError when it cannot be read."""
    words = Path(proc_root, "meminfo").read_text().split()
    return int(words[words.index("MemTotal:") + 1])


def uptime_seconds(proc_root: str = PROC) -> float:
    """Seconds since boot, on the clock a process's starttime counts on; OSError,
    ValueError or IndexError when /proc/uptime cannot be read."""
    return float(Path(proc_root, "uptime").read_text().split()[0])


def sysctl_number(proc_root: str, name: str) -> int | None:
    """A numeric sysctl (`name` below /proc, e.g. UNPRIVILEGED_PORT_START); None when
    unreadable or not a number."""
    try:
        return int(Path(proc_root, name).read_text())
    except (OSError, ValueError):
        return None
