"""`job top`: a running job's live usage on each of its nodes, as the caller sees it.

The same checks as `job target` (attach.running_job: the job is the caller's and
running, else refused, exit 4) decide whether to look at all. Then one step of the job
(`srun --jobid --overlap`, one task per node, as the caller: Slurm refuses a step in
another user's allocation) runs `tacc-agent node-usage` on every node, which reads the
job's figures there (health.job_usage, the same figures the node daemon computes) and
prints one JSON line (tacc_agent/node_usage.py). The node daemons' /metrics is not read:
it gives per-job series only to the cluster's Prometheus and root, and a figure of
someone else's job never reaches the caller's process this way.

Only a line of one of the job's hosts, naming the job, is taken; a node with no line
(srun refused, timed out, or the node did not run its task) gets an "error" of its own:
it never fails the whole answer. Each answer is one step of the job, which sacct lists
among its steps, and the figures count the step's own brief use of the node.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.self_command import AGENT
from tacc_agent.tasks.interactive import attach
from tacc_contract.answers import NodeUsage
from tacc_contract.shapes import shape_of
from tacc_contract.wire import ProtocolError

NODE_USAGE = shape_of(NodeUsage, "job top")

# srun starts the step (well under a second), each node reads its processes, asks
# nvidia-smi (at most 1.5 s) and scontrol (at most 0.5 s): all within this.
STEP_TIMEOUT_SECONDS = 15.0
FIGURE_KEYS = ("cpu_seconds", "memory_bytes", "cpus", "gpus", "sampled")
NO_ANSWER = "the node gave no figures (its task of the step did not run)"


def node_usage_argv(job: attach.RunningJob) -> list[str]:
    """One task on each of the job's nodes beside its own steps (--overlap), running
    `tacc-agent node-usage`; every word an argv word, never a shell line."""
    count = len(job.hosts)
    return [
        "srun",
        f"--jobid={job.slurm_job_id}",
        *attach.STEP_OPTIONS,
        *attach.AGENT_CODE_ONLY,
        f"--nodes={count}",
        f"--ntasks={count}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(job.hosts)}",
        f"--chdir={job.job_dir}",
        *AGENT,
        "node-usage",
    ]


def node_lines(out: str, slurm_job_id: str, hosts: list[str]) -> dict[str, dict]:
    """The first line of each of the job's hosts that names the job (or says an error);
    anything else srun printed is skipped."""
    found: dict[str, dict] = {}
    for text in out.splitlines():
        try:
            line = json.loads(text)
        except ValueError:
            continue
        if not isinstance(line, dict) or line.get("host") not in hosts or line["host"] in found:
            continue
        if line.get("job") == slurm_job_id or isinstance(line.get("error"), str):
            found[line["host"]] = line
    return found


def node_entry(host: str, rank: int, line: Mapping | None, failure: str) -> dict:
    """NodeUsage of one node: its figures, or why there are none."""
    where = {"host": host, "rank": rank}
    if line is None:
        return where | {"error": failure}
    if "error" in line:
        return where | {"error": str(line["error"])}
    entry = where | {key: line.get(key) for key in FIGURE_KEYS}
    try:
        return NODE_USAGE.check(entry, "job top", "")
    except ProtocolError as exc:
        return where | {"error": f"the node's figures are unreadable: {exc.problem}"}


def usage(job: attach.RunningJob, timeout: float = STEP_TIMEOUT_SECONDS) -> dict:
    """JobTop of a running job: one step on all its nodes."""
    failure = NO_ANSWER
    try:
        out = slurm.run.output(node_usage_argv(job), timeout)
    except AgentError as exc:  # srun refused, failed or hung: every node says why
        out, failure = "", str(exc)
    lines = node_lines(out, job.slurm_job_id, job.hosts)
    nodes = [
        node_entry(host, rank, lines.get(host), failure) for rank, host in enumerate(job.hosts)
    ]
    return {"job_id": job.job_id, "state": "RUNNING", "time": round(time.time(), 3), "nodes": nodes}


def top(user_dir: Path, job_id: str, config: AgentConfig) -> dict:
    """JOB_TOP of the caller's running job (refused like `job target` otherwise)."""
    return usage(attach.running_job(user_dir, job_id, config))
