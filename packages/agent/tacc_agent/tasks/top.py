"""`job top`: a running job's live usage on each of its nodes, read from the node
daemons' per-job figures (tacc_agent.health.job_usage) at
http://<node address>:<metrics_port>/metrics.

The same checks as `job target` (attach.target: the job is the caller's and running,
else refused, exit 4) decide whether to look at all; then every node is asked at once,
each within NODE_TIMEOUT_SECONDS, and only the samples whose job label is the job's
Slurm id are kept (none: the job has no process there now, figures null). A node that
does not answer gets an "error" of its own: it never fails the whole answer.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tacc_agent.config import AgentConfig
from tacc_agent.tasks import attach

NODE_TIMEOUT_SECONDS = 2.0
MOST_BYTES = 8 << 20  # a node's whole exposition is far smaller
PREFIX = "tacc_agent_job_"
NODE_FIGURES = {"cpu_seconds": "cpu_seconds", "memory_bytes": "memory_bytes", "cpus": "cpus"}
GPU_FIGURES = {
    "gpu_utilization_ratio": "utilization_ratio",
    "gpu_memory_used_bytes": "memory_used_bytes",
    "gpu_memory_total_bytes": "memory_total_bytes",
}
WHOLE = {"memory_bytes", "cpus", "memory_used_bytes", "memory_total_bytes"}


def metrics_url(address: str, port: int) -> str:
    host = f"[{address}]" if ":" in address else address  # an IPv6 address
    return f"http://{host}:{port}/metrics"


# Straight to the node, never through the login node's http_proxy: a cluster's egress
# proxy (the lab's tinyproxy) refuses node addresses, and urllib's no_proxy matching knows
# no address ranges (no_proxy=10.77.6.0/24 does not exempt 10.77.6.12).
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def fetch(url: str, timeout: float) -> str:
    """The exposition text; OSError (URLError, a timeout) when the node does not answer."""
    with DIRECT.open(url, timeout=timeout) as answer:
        return answer.read(MOST_BYTES).decode("utf-8", "replace")


def figure(name: str, value: float) -> float | int:
    return int(value) if name in WHOLE else round(value, 4)


def job_figures(text: str, slurm_job_id: str) -> dict:
    """This job's figures in one node's exposition: cpu_seconds, memory_bytes, cpus and
    gpus [{index, utilization_ratio, memory_used_bytes, memory_total_bytes}]."""
    node: dict = {}
    gpus: dict[int, dict] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("job") != slurm_job_id or not sample.name.startswith(PREFIX):
                continue
            name = sample.name.removeprefix(PREFIX).removesuffix("_total")
            if name in NODE_FIGURES:
                node[NODE_FIGURES[name]] = figure(NODE_FIGURES[name], sample.value)
            elif name in GPU_FIGURES and sample.labels.get("gpu", "").isdigit():
                index = int(sample.labels["gpu"])
                key = GPU_FIGURES[name]
                gpus.setdefault(index, {"index": index})[key] = figure(key, sample.value)
    return node | {"gpus": [gpus[index] for index in sorted(gpus)]}


def node_usage(node: dict, slurm_job_id: str, port: int, timeout: float) -> dict:
    """USAGE_NODE of one node: its figures, or why there are none."""
    where = {"host": node["host"], "rank": node["rank"]}
    try:
        text = fetch(metrics_url(node["address"], port), timeout)
    except urllib.error.HTTPError as exc:
        return where | {"error": f"the node agent answered HTTP {exc.code}"}
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, bad address
        reason = getattr(exc, "reason", exc)
        return where | {"error": f"the node agent did not answer: {reason}"}
    sampled = time.time()
    try:
        figures = job_figures(text, slurm_job_id)
    except ValueError as exc:  # not the exposition format
        return where | {"error": f"the node agent's answer is unreadable: {exc}"}
    # No sample: no process of the job there right now (figures null, not an error).
    empty = {"cpu_seconds": None, "memory_bytes": None, "cpus": None}
    return where | empty | figures | {"sampled": round(sampled, 3)}


def usage(target: dict, port: int, timeout: float = NODE_TIMEOUT_SECONDS) -> dict:
    """JOB_TOP from a JOB_TARGET: every node asked at once."""
    nodes = target["nodes"]
    with ThreadPoolExecutor(max_workers=max(1, min(len(nodes), 32))) as pool:
        found = list(pool.map(
            lambda node: node_usage(node, target["slurm_job_id"], port, timeout), nodes
        ))  # fmt: skip
    return {"job_id": target["job_id"], "state": target["state"], "time": round(time.time(), 3),
            "nodes": found}  # fmt: skip


def top(user_dir: Path, job_id: str, config: AgentConfig) -> dict:
    """JOB_TOP of the caller's running job (refused like `job target` otherwise)."""
    return usage(attach.target(user_dir, job_id, config), config.metrics_port)
