"""The dashboard broker's four questions, each answered for a caller the broker has
already identified (dashboard/broker.py):

- job: a job's usage over a time span, from the per-job series the node agents export
  (health/job_usage.py): CPU cores, memory, GPU utilisation and GPU memory, one series
  per node (and GPU). Every query is filtered by the job's id AND the caller's own user
  name, so a researcher only ever sees their own jobs, whatever job id they name; the
  only text of a request that reaches PromQL is that id, digits only.
- cluster (admins): the last day's GPUs allocated and in all per partition, the jobs'
  mean GPU utilisation, nodes per Slurm state (the controller's agent, cluster_metrics).
- alerts (admins): Prometheus' firing alerts.
- queue (admins): every job waiting or running, read as root with the agent's squeue
  readers (slurm/queue.py).

Prometheus unset or not answering, or Slurm missing here, is no error: the answer is
empty and its "problem" says why, in one line.
"""

from __future__ import annotations

import grp
import math
import os
import pwd
import time
from collections.abc import Callable
from typing import NamedTuple

from tacc_agent import prometheus
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.slurm import queue
from tacc_agent.slurm.times import run_time

MOST_SPAN_SECONDS = 7 * 86400  # a job's span is clipped to its last week
MOST_POINTS = 300  # per series
LEAST_STEP_SECONDS = 5
CLUSTER_SPAN_SECONDS = 86400
JOB_ID_DIGITS = 20
# All of an answer's queries together, and each one; the broker's client waits 10 s.
ANSWER_SECONDS = 8.0
QUERY_SECONDS = 5.0


class BadRequest(Exception):
    """The request is not one the broker answers: the message says what is expected."""


class Caller(NamedTuple):
    """Who asks: their passwd name, and whether they are in the admin group (or root)."""

    name: str
    admin: bool


def who(uid: int, admin_group: str) -> Caller | None:
    """The passwd name of uid and whether it is an admin (root, or a member of
    admin_group, by its passwd group or a supplementary one); None for a uid without an
    account here."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return None
    if uid == 0:
        return Caller(account.pw_name, True)
    try:
        admin_gid = grp.getgrnam(admin_group).gr_gid if admin_group else None
        groups = os.getgrouplist(account.pw_name, account.pw_gid)
    except (KeyError, OSError):
        return Caller(account.pw_name, False)
    return Caller(account.pw_name, admin_gid is not None and admin_gid in groups)


class Plot(NamedTuple):
    """One kind of series: its name and unit in the answer, its PromQL, and how each
    series is labelled from its Prometheus labels."""

    name: str
    unit: str
    expression: str
    label: Callable[[dict], str]


def job_plots(job: str, user: str, step: float) -> tuple[Plot, ...]:
    """The job's four kinds of series, each filtered by job id and user."""
    selector = f"{{exported_job={prometheus.label_value(job)},user={prometheus.label_value(user)}}}"
    window = f"{max(2 * step, 120):g}s"  # a rate needs two scrapes at least

    def on(title: str) -> Callable[[dict], str]:
        def label(metric: dict) -> str:
            gpu = f" GPU {metric['gpu']}" if "gpu" in metric else ""
            return f"{title} ({metric.get('instance', '?')}{gpu})"

        return label

    return (
        Plot(
            "cpu",
            "cores",
            f"rate(tacc_agent_job_cpu_seconds_total{selector}[{window}])",
            on("CPU cores"),
        ),
        Plot("memory", "bytes", f"tacc_agent_job_memory_bytes{selector}", on("memory")),
        Plot(
            "gpu_utilization",
            "ratio",
            f"tacc_agent_job_gpu_utilization_ratio{selector}",
            on("GPU utilisation"),
        ),
        Plot(
            "gpu_memory",
            "bytes",
            f"tacc_agent_job_gpu_memory_used_bytes{selector}",
            on("GPU memory"),
        ),
    )


CLUSTER_PLOTS = (
    Plot(
        "gpus_allocated",
        "gpus",
        'max by (partition) (tacc_agent_slurm_gpus{state="allocated"})',
        lambda m: f"GPUs allocated ({m.get('partition', '?')})",
    ),
    Plot(
        "gpus_total",
        "gpus",
        'max by (partition) (tacc_agent_slurm_gpus{state="total"})',
        lambda m: f"GPUs in all ({m.get('partition', '?')})",
    ),
    Plot(
        "gpu_utilization",
        "ratio",
        "avg(tacc_agent_job_gpu_utilization_ratio)",
        lambda m: "jobs' mean GPU utilisation",
    ),
    Plot(
        "nodes",
        "nodes",
        "max by (state) (tacc_agent_slurm_nodes)",
        lambda m: f"nodes {m.get('state', '?')}",
    ),
)


def job_usage(config: AgentConfig, caller: Caller, request: dict) -> dict:
    """{"series": [...], "problem": ""} of the caller's job in the request's span."""
    job = job_id(request.get("job"))
    start, end = span(request.get("start"), request.get("end"), time.time())
    step = max(LEAST_STEP_SECONDS, math.ceil((end - start) / MOST_POINTS))
    plots = job_plots(job, caller.name, step)
    mine = {"exported_job": job, "user": caller.name}
    return plotted(config, plots, start, end, step, mine)


def cluster(config: AgentConfig) -> dict:
    """{"series": [...], "problem": ""}: the cluster over the last day."""
    end = time.time()
    step = math.ceil(CLUSTER_SPAN_SECONDS / MOST_POINTS)
    return plotted(config, CLUSTER_PLOTS, end - CLUSTER_SPAN_SECONDS, end, step, {})


def job_id(value: object) -> str:
    """A Slurm job id: digits only (no array task, no PromQL)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        value = str(value)
    if not (
        isinstance(value, str)
        and 0 < len(value) <= JOB_ID_DIGITS
        and value.isascii()
        and value.isdigit()
    ):
        raise BadRequest(f'expected "job": a Slurm job id (digits only), not {value!r:.60}')
    return value


def span(start: object, end: object, now: float) -> tuple[float, float]:
    """The request's [start, end] in Unix seconds, clipped to its last MOST_SPAN_SECONDS;
    a missing end is now."""
    end = now if end is None else end
    for name, value in (("start", start), ("end", end)):
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise BadRequest(f'expected "{name}": Unix seconds, not {value!r:.60}')
    if end <= start:
        raise BadRequest(f'expected "end" after "start" ({end!r} <= {start!r})')
    return max(float(start), end - MOST_SPAN_SECONDS), float(end)


def plotted(
    config: AgentConfig,
    plots: tuple[Plot, ...],
    start: float,
    end: float,
    step: float,
    only: dict[str, str],
) -> dict:
    """Each plot's series between start and end; those whose labels do not hold every
    pair of `only` are dropped (the queries filter already: this is the second lock)."""
    url = config.prometheus_url
    if problem := unreachable(url):
        return {"series": [], "problem": problem}
    deadline = time.monotonic() + ANSWER_SECONDS
    series = []
    try:
        for plot in plots:
            found = prometheus.query_range(
                url, plot.expression, start, end, step, time_left(deadline)
            )
            for item in found:
                metric = item.get("metric")
                if not isinstance(metric, dict) or any(metric.get(k) != v for k, v in only.items()):
                    continue
                series.append(
                    {
                        "name": plot.name,
                        "label": plot.label(metric),
                        "unit": plot.unit,
                        "points": points(item.get("values")),
                    }
                )
    except prometheus.PrometheusUnavailable as exc:
        return {"series": [], "problem": f"Prometheus at {url} did not answer: {exc}"}
    series.sort(key=lambda s: (s["name"], s["label"]))
    return {"series": series, "problem": ""}


def points(values: object) -> list[list[float]]:
    """[[t, v], ...] of a range result's values; samples that are no number left out."""
    found = []
    for pair in values if isinstance(values, list) else []:
        try:
            moment, value = float(pair[0]), float(pair[1])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(moment) and math.isfinite(value):
            found.append([moment, value])
    return found


def alerts(config: AgentConfig) -> dict:
    """{"alerts": [{name, severity, instance, summary, since}], "problem": ""}: the
    firing alerts, oldest first."""
    url = config.prometheus_url
    if problem := unreachable(url):
        return {"alerts": [], "problem": problem}
    try:
        held = prometheus.alerts(url, QUERY_SECONDS)
    except prometheus.PrometheusUnavailable as exc:
        return {"alerts": [], "problem": f"Prometheus at {url} did not answer: {exc}"}
    found = []
    for alert in held:
        labels, notes = alert.get("labels"), alert.get("annotations")
        labels = labels if isinstance(labels, dict) else {}
        notes = notes if isinstance(notes, dict) else {}
        if alert.get("state") != "firing":
            continue
        found.append(
            {
                "name": str(labels.get("alertname", "")),
                "severity": str(labels.get("severity", "")),
                "instance": str(labels.get("instance", "")),
                "summary": str(notes.get("summary") or notes.get("description") or ""),
                "since": str(alert.get("activeAt", "")),
            }
        )
    found.sort(key=lambda a: (a["since"], a["name"], a["instance"]))
    return {"alerts": found, "problem": ""}


def jobs(config: AgentConfig) -> dict:
    """{"jobs": [{job, user, name, state, partition, nodes, time}], "problem": ""}:
    every pending and running job, as root reads the queue."""
    timeout = min(config.slurm_timeout_seconds, ANSWER_SECONDS / 2)
    try:
        queued = queue.queued_jobs(timeout)
        details = queue.queue_details(timeout)
    except AgentError as exc:
        return {"jobs": [], "problem": f"Slurm's queue cannot be read here: {exc}"}
    rows = []
    for job in queued:
        detail = details.get(job.job_id)
        rows.append(
            {
                "job": job.job_id,
                "user": job.user,
                "name": detail.name if detail else "",
                "state": job.state,
                "partition": job.partition,
                "nodes": ",".join(detail.nodes) if detail else "",
                "time": run_time(job.elapsed_seconds),
            }
        )
    return {"jobs": rows, "problem": ""}


def unreachable(url: str) -> str:
    """Why the broker cannot ask Prometheus at url; "" when it can."""
    if not url:
        return "no Prometheus is set on the monitoring host (the agent's prometheus_url)"
    return prometheus.usable_url(url) or ""


def time_left(deadline: float) -> float:
    """Seconds a query may take: QUERY_SECONDS, less as the answer's deadline nears."""
    left = min(QUERY_SECONDS, deadline - time.monotonic())
    if left <= 0:
        raise prometheus.PrometheusUnavailable(f"no answer within {ANSWER_SECONDS:g} s in all")
    return left
