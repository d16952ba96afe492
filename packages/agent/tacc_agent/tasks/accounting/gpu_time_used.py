"""How busy jobs kept their GPUs, from the cluster's Prometheus (config.prometheus_url):
the node daemons export each running job's GPUs as
tacc_agent_job_gpu_utilization_ratio{job, user, gpu} (0..1, health/job_usage.py), and
Prometheus keeps what it scraped. For the ops usage report's UTILISATION columns
(tasks/accounting/usage_report.py) only: a scrape is no source for a figure that bills or decides a
quota (a node's /metrics can be wrong, or served by something else than its daemon);
those come from Slurm's accounting (tasks/accounting/usage.py).

How: a job's used GPU-seconds are, for each of its GPU series (a GPU of a node), the
series' average utilization over its samples in the report's window times the job's
wall time in the window (sacct), summed over its series. The average does not depend on
the scrape interval (which is Prometheus' setting, not the agent's); it assumes the
samples cover the job's run evenly (the node daemon exports a job's GPUs from its first
process there to its last). The window is asked in chunks of CHUNK_SECONDS, each as
sum_over_time and count_over_time at the chunk's end, so no query loads more than a day
of samples (Prometheus refuses a query past its sample limit); the sums and counts add
up across chunks. A job Prometheus has no samples of (older than its retention, a node
it did not scrape) is not measured: the report says how many GPU-hours that leaves out.

Prometheus relabels a target's own `job` label to `exported_job` unless the scrape
config honours labels; the Slurm job id is read from either.

Every query goes straight to Prometheus (tacc_agent/prometheus.py), each within
QUERY_TIMEOUT_SECONDS, all within DEADLINE_SECONDS. Prometheus unset or not answering is
no error: the used figures are None and a warning says why.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from tacc_agent.prometheus import PrometheusUnavailable, query, usable_url

METRIC = "tacc_agent_job_gpu_utilization_ratio"
JOB_LABELS = ("exported_job", "job")  # relabelled by Prometheus, or honoured as exported
CHUNK_SECONDS = 86400
QUERY_TIMEOUT_SECONDS = 10.0
DEADLINE_SECONDS = 120.0


@dataclass
class Measured:
    """used: job id -> GPU-seconds used in the window, for each job with samples (None:
    nothing could be measured); warnings: why not, said to ops."""

    used: dict[str, float] | None
    warnings: list[str] = field(default_factory=list)


@dataclass
class SeriesSum:
    job_id: str
    total: float = 0.0
    samples: float = 0.0


def slurm_job(labels: Mapping) -> str | None:
    for name in JOB_LABELS:
        value = labels.get(name)
        if isinstance(value, str) and value.isascii() and value.isdigit():
            return value
    return None


def sample_value(item: dict) -> float | None:
    try:
        value = float(item["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        return None
    return value if value == value else None  # NaN: no figure


def series_sums(base_url: str, since: float, until: float, deadline: float) -> dict:
    """{series labels: SeriesSum} of every GPU series with samples in [since, until]."""
    sums: dict[tuple, SeriesSum] = {}
    start = since
    while start < until:
        end = min(start + CHUNK_SECONDS, until)
        # 1 ms short of the chunk: Prometheus 2 takes both ends of a range, so a sample
        # at a chunk's boundary would count in two chunks.
        span = f"[{max(1, round((end - start) * 1000) - 1)}ms]"
        for function, slot in (("sum_over_time", "total"), ("count_over_time", "samples")):
            left = deadline - time.monotonic()
            if left <= 0:
                raise PrometheusUnavailable(f"no answer within {DEADLINE_SECONDS:g} s in all")
            for item in query(
                base_url, f"{function}({METRIC}{span})", end, min(QUERY_TIMEOUT_SECONDS, left)
            ):
                labels = item.get("metric") if isinstance(item, dict) else None
                job_id = slurm_job(labels) if isinstance(labels, dict) else None
                value = sample_value(item)
                if job_id is None or value is None:
                    continue
                key = tuple(sorted(labels.items()))
                entry = sums.setdefault(key, SeriesSum(job_id))
                setattr(entry, slot, getattr(entry, slot) + value)
        start = end
    return sums


def used_gpu_seconds(
    url: str, since: float, until: float, job_seconds: Mapping[str, float]
) -> Measured:
    """The used GPU-seconds of each job in job_seconds ({job id: its wall seconds in the
    window}) that Prometheus has samples of, between the Unix times since and until."""
    if not url:
        unset = "prometheus_url is not set in the agent's config (/etc/tacc-agent/config.yaml)"
        return Measured(None, [f"{unset}: no GPU utilisation to show"])
    if problem := usable_url(url):
        return Measured(None, [f"{problem}: no GPU utilisation to show"])
    try:
        sums = series_sums(url, since, until, time.monotonic() + DEADLINE_SECONDS)
    except PrometheusUnavailable as exc:
        return Measured(
            None, [f"Prometheus at {url} did not answer ({exc}): no GPU utilisation to show"]
        )
    used: dict[str, float] = {}
    for entry in sums.values():
        if entry.job_id in job_seconds and entry.samples > 0:
            average = entry.total / entry.samples
            used[entry.job_id] = used.get(entry.job_id, 0.0) + average * job_seconds[entry.job_id]
    return Measured(used)
