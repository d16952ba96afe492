"""The facts the transport plug-in (tacc_plugins/transport.py) decides from: this
node's RDMA ports, from the agent's facts file when it is fresh (written by
`tacc-agent serve`), else straight from <rdma_sysfs_root>/class/infiniband. Each rank
writes them into its status record; rank 0's plug-in reads every rank's (Launch.agree).
"""

from __future__ import annotations

import time
from pathlib import Path

from tacc_agent import rdma_sysfs
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.jobs import records


def sysfs_ports(sysfs_root: str) -> list[dict]:
    """Every RDMA port and whether it is ACTIVE, as the rdma health check reads them."""
    return [
        {"device": device, "port": number, "active": "ACTIVE" in port["state"]}
        for port in rdma_sysfs.ports(sysfs_root)
        for device, number in [port["name"].split("/")]
    ]


def local_rdma(config: AgentConfig) -> dict:
    """{"active_ports", "source", "declared"}: declared when the inventory gives the node
    RDMA (rdma_nodes: the agent's rdma_declared) and it has an RDMA device, whatever its
    ports' state; a node of that group with no device at all is one the rdma role
    skipped (it says so), and TCP is its normal case."""
    ports = sysfs_ports(config.rdma_sysfs_root)
    declared = {"declared": bool(config.rdma_declared and ports)}
    facts = records.read_json(Path(config.facts_file))
    if facts and time.time() - facts.get("time", 0) <= config.facts_max_age_seconds:
        rdma = facts.get("rdma")
        if isinstance(rdma, dict) and "active_ports" in rdma:
            return {"active_ports": int(rdma["active_ports"]), "source": "agent facts"} | declared
    return {"active_ports": sum(p["active"] for p in ports), "source": "sysfs"} | declared
