"""The node facts file (/run/tacc-agent/facts.json): what `tacc-agent serve` last found,
for the execution layer (RDMA ports for fail-safe transport switching) and for ops.
World-readable, written atomically, so a reader never sees half a file."""

from __future__ import annotations

from pathlib import Path

from tacc_agent.health.checks.base import Result, write_state
from tacc_agent.procfs.processes import command_line, pids

# argv of the per-node task wrapper: python -I -m tacc_agent exec JOBDIR (execute.py)
WRAPPER = b"tacc_agent\0exec\0"


def running_tasks(proc_root: str) -> int:
    """TACC task wrappers running on this node, from their command lines."""
    return sum(WRAPPER in (command_line(proc_root, pid) or b"") for pid in pids(proc_root))


def sample(result: Result, name: str) -> float:
    return next((s.value for s in result.samples if s.name == name and not s.labels), 0)


def build(node: str, results: list[Result], tasks: int, now: float) -> dict:
    """The facts of this run. `rdma` and `gpu` only when their check ran: a node that turns
    the rdma check off leaves the execution layer to read sysfs itself (transport.py), not
    to take "no active port" from a check that never looked."""
    ran = {result.check: result for result in results}
    facts = {
        "node": node,
        "time": round(now, 3),
        "healthy": not any(r.failed for r in results),
        "checks": {r.check: {"status": r.status, "detail": r.detail} for r in results},
    }
    if "rdma" in ran:
        facts["rdma"] = {"active_ports": int(sample(ran["rdma"], "rdma_ports_active"))}
    if "gpu" in ran:
        facts["gpu"] = {"count": int(sample(ran["gpu"], "gpus"))}
    return facts | {"running_tasks": tasks}


def write(path: Path, facts: dict) -> None:
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
        path.parent.chmod(0o755)  # the agent runs with umask 077
    write_state(path, facts, mode=0o644)  # the task wrappers run as the job's user
