"""The Prometheus exposition of the agent's last check run, through prometheus_client: a
collector turns the last run's samples into metric families, and the library's
ProcessCollector adds the standard process_ figures.

Every family is declared (name, type, HELP, labels): the agent's own here, each check's
in its registry.Check; a family of a check that did not run (turned off on this node)
is absent. Names follow Prometheus' conventions (base units, `_total` for counters,
`_ratio` for 0..1) and node_exporter's where they overlap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from tacc_agent.health.checks.base import STATUSES, Result, Sample
from tacc_agent.health.registry import Family

PREFIX = "tacc_agent_"
# The agent's own families; each check declares its own (registry.Check.families), and
# only the families of the checks that ran are exposed. Process figures use the standard
# process_ names (ProcessCollector).
AGENT_FAMILIES = (
    Family("healthy", "gauge", "1 when every check passed (or found its hardware absent) last run"),
    Family(
        "check_status",
        "gauge",
        "1 for the status each check had in the last run",
        ("check", "status"),
    ),
    Family(
        "check_duration_seconds", "gauge", "How long each check took in the last run", ("check",)
    ),
    Family("check_runs_total", "counter", "Check runs since the daemon started"),
    Family("last_run_timestamp_seconds", "gauge", "When the last check run ended (Unix time)"),
    Family("running_tasks", "gauge", "TACC task wrappers (tacc-agent exec) running on this node"),
    Family("slurm_drained_by_agent", "gauge", "1 while the agent keeps this node drained in Slurm"),
    Family("children_cpu_seconds_total", "counter", "CPU time of the probes the agent ran"),
)
FAMILY_TYPES = {"gauge": GaugeMetricFamily, "counter": CounterMetricFamily}


@dataclass
class Snapshot:
    """What the last check run found; replaced whole, so readers never see half a run."""

    results: list[Result] = field(default_factory=list)
    runs: int = 0
    finished: float = 0.0
    running_tasks: int = 0
    drained_by_agent: bool = False
    # The metric families the checks that ran declare: what their samples may be.
    check_families: tuple[Family, ...] = ()

    def declared(self) -> dict[str, Family]:
        return {family.name: family for family in (*AGENT_FAMILIES, *self.check_families)}


def children_samples() -> list[Sample]:
    """CPU time of the probes the agent ran (ProcessCollector counts the agent's own)."""
    times = os.times()
    return [
        Sample(
            "children_cpu_seconds_total", {}, round(times.children_user + times.children_system, 3)
        )
    ]


def snapshot_samples(snapshot: Snapshot) -> list[Sample]:
    healthy = not any(r.failed for r in snapshot.results)
    samples = [
        Sample("healthy", {}, int(healthy and snapshot.runs > 0)),
        Sample("check_runs_total", {}, snapshot.runs),
        Sample("last_run_timestamp_seconds", {}, round(snapshot.finished, 3)),
        Sample("running_tasks", {}, snapshot.running_tasks),
        Sample("slurm_drained_by_agent", {}, int(snapshot.drained_by_agent)),
    ]
    for result in snapshot.results:
        samples += [
            Sample(
                "check_status",
                {"check": result.check, "status": status},
                int(result.status == status),
            )
            for status in STATUSES
        ]
        samples.append(Sample("check_duration_seconds", {"check": result.check}, result.seconds))
        samples += result.samples
    return samples


def families(samples: Iterable[Sample], declared: Mapping[str, Family]) -> list[Metric]:
    """Group by family (first appearance order), typed, documented and labelled as
    declared. A sample of an undeclared family is left out (the check runner already
    fails a check that emits one, so none gets here)."""
    grouped: dict[str, list[Sample]] = {}
    for sample in samples:
        if sample.name in declared:
            grouped.setdefault(sample.name, []).append(sample)
    found = []
    for name, group in grouped.items():
        spec = declared[name]
        labels = list(spec.labels)
        family = FAMILY_TYPES[spec.kind](PREFIX + name, spec.help, labels=labels)
        for sample in group:
            family.add_metric([str(sample.labels.get(key, "")) for key in labels], sample.value)
        found.append(family)
    return found


class SnapshotCollector:
    """A prometheus_client collector of the last check run, read at each scrape."""

    def __init__(self, last_run: Callable[[], Snapshot]) -> None:
        self.last_run = last_run

    def collect(self) -> Iterator[Metric]:
        snapshot = self.last_run()
        samples = [*snapshot_samples(snapshot), *children_samples()]
        yield from families(samples, snapshot.declared())


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
