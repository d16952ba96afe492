"""Fail-safe transport switching: RDMA when every allocated node has an active RDMA
port, else TCP (NCCL_IB_DISABLE=1), with the reason for the job log.

A node's RDMA state comes from the agent's facts file when it is fresh (written by
`tacc-agent serve`), else straight from <rdma_sysfs_root>/class/infiniband.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.health.checks import rdma
from tacc_agent.tasks import records

RDMA_ENV = {"NCCL_IB_DISABLE": "0"}
TCP_ENV = {"NCCL_IB_DISABLE": "1"}


@dataclass(frozen=True)
class Choice:
    name: str
    reason: str
    env: dict[str, str]


def sysfs_ports(sysfs_root: str) -> list[dict]:
    """Every RDMA port and whether it is ACTIVE, as the rdma health check reads them."""
    return [
        {"device": device, "port": number, "active": "ACTIVE" in port["state"]}
        for port in rdma.ports(sysfs_root)
        for device, number in [port["name"].split("/")]
    ]


def local_rdma(config: AgentConfig) -> dict:
    facts = records.read_json(Path(config.facts_file))
    if facts and time.time() - facts.get("time", 0) <= config.facts_max_age_seconds:
        rdma = facts.get("rdma")
        if isinstance(rdma, dict) and "active_ports" in rdma:
            return {"active_ports": int(rdma["active_ports"]), "source": "agent facts"}
    ports = sysfs_ports(config.rdma_sysfs_root)
    return {"active_ports": sum(p["active"] for p in ports), "source": "sysfs"}


def choose(requested: str, ranks: list[dict]) -> Choice:
    """ranks: each rank's {"host", "rdma": {"active_ports"}} from its status file (a node
    with several ranks is named once)."""
    if requested == "tcp":
        return Choice("tcp", "the task asks for tcp", TCP_ENV)
    ranks = list({r["host"]: r for r in ranks}.values())
    lacking = [r["host"] for r in ranks if not r.get("rdma", {}).get("active_ports")]
    if ranks and not lacking:
        counts = ", ".join(f"{r['host']}: {r['rdma']['active_ports']}" for r in ranks)
        return Choice("rdma", f"active RDMA ports on every node ({counts})", RDMA_ENV)
    why = f"no active RDMA port on {', '.join(lacking)}" if lacking else "no node facts"
    if requested == "rdma":
        why = f"the task asks for rdma, but {why}; falling back"
    return Choice("tcp", f"{why} (fail-safe switching, NCCL_IB_DISABLE=1)", TCP_ENV)
