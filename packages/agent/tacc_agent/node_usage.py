"""`tacc-agent node-usage`: one node's live figures of the job whose step runs it, as one
JSON line on stdout. `job top` (tasks/interactive/top.py) runs it on every node of the caller's
running job, as the caller, in a step of that job (`srun --jobid --overlap`); this module
joins the two halves of the agent (the figures are health.job_usage's, the verb serves
the task backend), like serve.py.

Whose figures: the job is the one whose root-owned step daemon (`slurmstepd: [JOB.STEP]`)
this process descends from, never a word or a variable of the request (a user writes
any SLURM_JOB_ID into an environment), and Slurm only starts a step of a job for its
owner; of that job's figures only those of the caller's own processes are kept. So a run
of this verb tells nobody of another user's job, whatever node it runs on. Outside a
step, or where /proc hides the step daemon (hidepid), it answers an error line.

The line (tacc_contract.answers.NodeUsage without host and rank, plus "job" and "host"):
{"job", "host", "cpu_seconds", "memory_bytes", "cpus", "gpus": [{"index",
"utilization_ratio", "memory_used_bytes", "memory_total_bytes"}], "sampled"}; figures
null where the job has no process on the node; or {"host", "error"}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Iterable

from tacc_agent.config import AgentConfig
from tacc_agent.health import job_usage
from tacc_agent.health.checks.base import Sample
from tacc_agent.procfs.processes import process_table

NODE_FIGURES = {
    "job_cpu_seconds_total": "cpu_seconds",
    "job_memory_bytes": "memory_bytes",
    "job_cpus": "cpus",
}
GPU_FIGURES = {
    "job_gpu_utilization_ratio": "utilization_ratio",
    "job_gpu_memory_used_bytes": "memory_used_bytes",
    "job_gpu_memory_total_bytes": "memory_total_bytes",
}
WHOLE = {"memory_bytes", "cpus", "memory_used_bytes", "memory_total_bytes"}
NO_FIGURES = {"cpu_seconds": None, "memory_bytes": None, "cpus": None, "gpus": []}


def figure(name: str, value: float) -> float | int:
    return int(value) if name in WHOLE else round(value, 4)


def own_job(proc_root: str, pid: int) -> str | None:
    """The Slurm job whose step daemon process pid descends from; None outside a step."""
    return job_usage.job_of(pid, process_table(proc_root), {})


def job_figures(samples: Iterable[Sample], job: str, user: str) -> dict:
    """The figures of job's samples labelled with user: cpu_seconds, memory_bytes, cpus
    and gpus; NO_FIGURES where there are none."""
    node: dict = {}
    gpus: dict[int, dict] = {}
    for sample in samples:
        if sample.labels.get("job") != job or sample.labels.get("user") != user:
            continue
        if sample.name in NODE_FIGURES:
            key = NODE_FIGURES[sample.name]
            node[key] = figure(key, sample.value)
        elif sample.name in GPU_FIGURES and sample.labels.get("gpu", "").isdigit():
            index, key = int(sample.labels["gpu"]), GPU_FIGURES[sample.name]
            gpus.setdefault(index, {"index": index})[key] = figure(key, sample.value)
    return NO_FIGURES | node | {"gpus": [gpus[index] for index in sorted(gpus)]}


def node_name() -> str:
    """This node's name in Slurm (the step's SLURMD_NODENAME), else the host name."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def here(sources: job_usage.Sources, pid: int, uid: int, host: str) -> dict:
    """The line of the job whose step runs process pid, for the user uid."""
    try:
        job = own_job(sources.proc_root, pid)
        if job is None:
            return {
                "host": host,
                "error": "node-usage runs only in a step of a job "
                "(srun --jobid), where it can see its step daemon in /proc",
            }
        samples = job_usage.collect(sources, only=job)
    except OSError as exc:  # /proc unreadable
        return {"host": host, "error": f"cannot read this node's processes: {exc}"}
    figures = job_figures(samples, job, job_usage.user_name(uid))
    return {"job": job, "host": host, **figures, "sampled": round(time.time(), 3)}


def run(config: AgentConfig) -> int:
    """The verb: one JSON line, exit 0 (an error is said in the line)."""
    host = node_name()
    sources = dataclasses.replace(job_usage.Sources.of(config), node=host)
    line = here(sources, os.getpid(), os.getuid(), host)
    print(json.dumps(line, sort_keys=True), flush=True)
    return 0
