"""Which nodes a job lost: a rank that never recorded its exit was on a node that went
away under it (power cut, kernel panic, network gone), not one that ended or was stopped.
What Slurm says of that node now, when it still says something wrong, explains why."""

from __future__ import annotations

from tacc_agent import slurm
from tacc_agent.errors import AgentError

# scontrol's node State flags that mean "this node is not serving".
BAD_NODE_STATES = ("DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN")


def lost_hosts(ranks: list[dict]) -> list[str]:
    """Hosts of ranks that started but never recorded an exit, in rank order. A rank
    that was told to stop (`terminated`: SIGTERM from a halt, preemption or time limit)
    and then SIGKILLed before it could record its exit was not lost with its node."""
    hosts = [
        r.get("host", "?")
        for r in ranks
        if r.get("state") in ("PROVISIONING", "RUNNING") and not r.get("terminated")
    ]
    return list(dict.fromkeys(hosts))


def node_problem(host: str, timeout: float) -> str:
    """Slurm's word on a node that is down or not responding ("" when it serves, or
    when Slurm cannot be asked)."""
    try:
        found = slurm.nodes.node(host, timeout)
    except AgentError:
        return ""
    if found is None or not any(flag in found.state.split("+") for flag in BAD_NODE_STATES):
        return ""
    return f"{found.state}: {found.reason}" if found.reason else found.state


def describe(ranks: list[dict], timeout: float) -> str:
    """'node n3 failed (DOWN+NOT_RESPONDING: Not responding)', or '' if no rank was lost."""
    described = []
    for host in lost_hosts(ranks):
        problem = node_problem(host, timeout)
        described.append(f"{host} ({problem})" if problem else host)
    if not described:
        return ""
    noun = "node" if len(described) == 1 else "nodes"
    return f"{noun} {', '.join(described)} failed during the run"
