"""Fail-safe transport switching, from fixture sysfs trees and facts files."""

from __future__ import annotations

import json
import time

from tacc_agent.config import AgentConfig
from tacc_agent.tasks.schedule.transport import local_rdma, sysfs_ports
from tacc_plugins.transport import choose


def fixture_tree(root, states: dict[str, str]):
    for name, state in states.items():
        device, port = name.split("/")
        path = root / "class/infiniband" / device / "ports" / port
        path.mkdir(parents=True)
        (path / "state").write_text(state + "\n")
    return root


def test_sysfs_ports_healthy_and_degraded(tmp_path):
    healthy = fixture_tree(tmp_path / "ok", {"mlx5_0/1": "4: ACTIVE", "mlx5_1/1": "4: ACTIVE"})
    degraded = fixture_tree(tmp_path / "bad", {"mlx5_0/1": "4: ACTIVE", "mlx5_1/1": "1: DOWN"})
    assert [p["active"] for p in sysfs_ports(str(healthy))] == [True, True]
    assert [p["active"] for p in sysfs_ports(str(degraded))] == [True, False]
    assert sysfs_ports(str(tmp_path / "none")) == []


def test_fresh_facts_win_over_sysfs_and_stale_ones_do_not(tmp_path):
    facts = tmp_path / "facts.json"
    config = AgentConfig(rdma_sysfs_root=str(tmp_path / "none"), facts_file=str(facts))
    facts.write_text(json.dumps({"time": time.time(), "rdma": {"active_ports": 2}}))
    assert local_rdma(config) == {"active_ports": 2, "source": "agent facts"}
    facts.write_text(json.dumps({"time": time.time() - 3600, "rdma": {"active_ports": 2}}))
    assert local_rdma(config) == {"active_ports": 0, "source": "sysfs"}


def rank(host: str, ports: int) -> dict:
    return {"host": host, "rdma": {"active_ports": ports}}


def test_rdma_only_when_every_node_has_an_active_port():
    both = choose("auto", [rank("n2", 2), rank("n3", 1)])
    assert both.name == "rdma" and both.env == {"NCCL_IB_DISABLE": "0"}
    assert both.reason == "active RDMA ports on every node (n2: 2, n3: 1)"
    one = choose("auto", [rank("n2", 2), rank("n3", 0)])
    assert one.name == "tcp" and one.env == {"NCCL_IB_DISABLE": "1"}
    assert one.reason.startswith("no active RDMA port on n3 (fail-safe switching")
    asked = choose("rdma", [rank("n2", 0)])
    assert asked.name == "tcp" and "the task asks for rdma, but no active" in asked.reason
    assert choose("tcp", [rank("n2", 2)]).reason == "the task asks for tcp"
