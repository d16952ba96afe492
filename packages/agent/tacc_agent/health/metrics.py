"""The Prometheus exposition of the agent's last check run, through prometheus_client: a
collector turns the last run's samples into metric families, and the library's
ProcessCollector adds the standard process_ figures.

Names follow Prometheus' conventions (base units, `_total` for counters, `_ratio` for
0..1) and node_exporter's where they overlap; every family has HELP and TYPE.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, UnknownMetricFamily
from prometheus_client.metrics_core import Metric

from tacc_agent.health.checks.base import STATUSES, Result, Sample

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
FAMILY_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


@dataclass
class Snapshot:
    """What the last check run found; replaced whole, so readers never see half a run."""

    results: list[Result] = field(default_factory=list)
    runs: int = 0
    finished: float = 0.0
    running_tasks: int = 0
    drained_by_agent: bool = False


def children_samples() -> list[Sample]:
    """CPU time of the probes the agent ran (ProcessCollector counts the agent's own)."""
    times = os.times()
    return [Sample("children_cpu_seconds_total", {},
                   round(times.children_user + times.children_system, 3))]  # fmt: skip


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


def families(samples: Iterable[Sample]) -> list[Metric]:
    """Group by family (first appearance order), typed and documented from FAMILIES."""
    grouped: dict[str, list[Sample]] = {}
    for sample in samples:
        grouped.setdefault(sample.name, []).append(sample)
    found = []
    for name, group in grouped.items():
        kind, text = FAMILIES.get(name, ("untyped", name))
        labels = list(group[0].labels)
        family = FAMILY_TYPES.get(kind, UnknownMetricFamily)(PREFIX + name, text, labels=labels)
        for sample in group:
            family.add_metric([str(sample.labels.get(key, "")) for key in labels], sample.value)
        found.append(family)
    return found


class SnapshotCollector:
    """A prometheus_client collector of the last check run, read at each scrape."""

    def __init__(self, last_run: Callable[[], Snapshot]) -> None:
        self.last_run = last_run

    def collect(self) -> Iterator[Metric]:
        yield from families([*snapshot_samples(self.last_run()), *children_samples()])


def registry(last_run: Callable[[], Snapshot]) -> CollectorRegistry:
    """The daemon's own registry (not the library's global one): the last run, then the
    standard process_ figures (resident memory, CPU seconds, start time, open fds)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(SnapshotCollector(last_run))
    ProcessCollector(registry=found)
    return found


def exposition(source: CollectorRegistry) -> bytes:
    """The text format 0.0.4, as Prometheus scrapes it."""
    return generate_latest(source)
