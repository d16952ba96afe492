"""The Prometheus text exposition (format 0.0.4) of the agent's last check run.

Names follow Prometheus' conventions (base units, `_total` for counters, `_ratio` for
0..1) and node_exporter's where they overlap; every family has HELP and TYPE. No client
library: the whole format is a few lines, and the daemon stays small.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tacc_agent.checks.base import STATUSES, Result, Sample

PREFIX = "tacc_agent_"
# name (without PREFIX) -> (type, help). Process figures use the standard process_ names.
FAMILIES = {
    "healthy": ("gauge", "1 when every check passed (or found its hardware absent) last run"),
    "check_status": ("gauge", "1 for the status each check had in the last run"),
    "check_duration_seconds": ("gauge", "How long each check took in the last run"),
    "check_runs_total": ("counter", "Check runs since the daemon started"),
    "last_run_timestamp_seconds": ("gauge", "When the last check run ended (Unix time)"),
    "running_tasks": ("gauge", "TACC task wrappers (tacc-agent exec) running on this node"),
    "slurm_drained_by_agent": ("gauge", "1 while the agent keeps this node drained in Slurm"),
    "gpus": ("gauge", "GPUs nvidia-smi reports"),
    "gpu_critical_xids": ("gauge", "Critical Xid events seen since boot (they hold a drain)"),
    "gpu_temperature_celsius": ("gauge", "GPU core temperature"),
    "gpu_utilization_ratio": ("gauge", "GPU utilization over the last sample period"),
    "gpu_memory_used_bytes": ("gauge", "GPU memory in use"),
    "gpu_memory_total_bytes": ("gauge", "GPU memory installed"),
    "gpu_power_watts": ("gauge", "GPU power draw"),
    "gpu_ecc_uncorrected_errors": ("gauge", "Uncorrected ECC errors since the driver loaded"),
    "rdma_ports_active": ("gauge", "RDMA ports in state ACTIVE"),
    "rdma_port_active": ("gauge", "1 when the RDMA port is ACTIVE"),
    "rdma_port_rate_bytes_per_second": ("gauge", "RDMA port link rate"),
    "rdma_port_errors_total": ("counter", "RDMA port error counters (sysfs counters/)"),
    "disk_free_ratio": ("gauge", "Free space of each checked local path"),
    "memory_total_bytes": ("gauge", "Memory the kernel reports (MemTotal)"),
    "memory_configured_bytes": ("gauge", "The node's RealMemory in slurm.conf"),
    "children_cpu_seconds_total": ("counter", "CPU time of the probes the agent ran"),
}
PROCESS = {
    "process_resident_memory_bytes": ("gauge", "Resident memory size in bytes"),
    "process_cpu_seconds_total": ("counter", "User and system CPU time spent in seconds"),
    "process_start_time_seconds": ("gauge", "Start time of the process since unix epoch"),
}
STARTED = time.time()


@dataclass
class Snapshot:
    """What the last check run found; replaced whole, so readers never see half a run."""

    results: list[Result] = field(default_factory=list)
    runs: int = 0
    finished: float = 0.0
    running_tasks: int = 0
    drained_by_agent: bool = False


def escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def sample_line(name: str, labels: dict[str, str], value: float) -> str:
    text = ",".join(f'{key}="{escape(str(val))}"' for key, val in labels.items())
    number = repr(float(value)) if value != int(value) else str(int(value))
    return f"{name}{{{text}}} {number}" if text else f"{name} {number}"


def process_samples() -> list[Sample]:
    times = os.times()
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        pages = 0
    return [
        Sample("process_resident_memory_bytes", {}, pages * os.sysconf("SC_PAGE_SIZE")),
        Sample("process_cpu_seconds_total", {}, round(times.user + times.system, 3)),
        Sample("process_start_time_seconds", {}, round(STARTED, 3)),
        Sample("children_cpu_seconds_total", {},
               round(times.children_user + times.children_system, 3)),
    ]  # fmt: skip


def snapshot_samples(snapshot: Snapshot) -> list[Sample]:
    healthy = not any(r.failed for r in snapshot.results)
    samples = [
        Sample("healthy", {}, int(healthy and bool(snapshot.results))),
        Sample("check_runs_total", {}, snapshot.runs),
        Sample("last_run_timestamp_seconds", {}, round(snapshot.finished, 3)),
        Sample("running_tasks", {}, snapshot.running_tasks),
        Sample("slurm_drained_by_agent", {}, int(snapshot.drained_by_agent)),
    ]
    for result in snapshot.results:
        samples += [Sample("check_status", {"check": result.check, "status": status},
                           int(result.status == status)) for status in STATUSES]  # fmt: skip
        samples.append(Sample("check_duration_seconds", {"check": result.check}, result.seconds))
        samples += result.samples
    return samples


def render(samples: Iterable[Sample]) -> str:
    """Group by family (HELP and TYPE once, before its samples) in a stable order."""
    families: dict[str, list[Sample]] = {}
    for sample in samples:
        families.setdefault(sample.name, []).append(sample)
    lines = []
    for name, group in families.items():
        kind, text = PROCESS.get(name) or FAMILIES.get(name) or ("untyped", name)
        full = name if name in PROCESS else PREFIX + name
        lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}"]
        lines += [sample_line(full, s.labels, s.value) for s in group]
    return "\n".join(lines) + "\n"


def exposition(snapshot: Snapshot) -> str:
    return render([*snapshot_samples(snapshot), *process_samples()])
