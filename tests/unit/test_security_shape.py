"""Issue [10].3: the cluster's shape. A login node that is not an NFS client keeps
researchers' workspaces on its own disk, where jobs on compute nodes never see them; the
lab has the production shape (a separate login node), so such a bug shows there."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tacc_lab.inventory import InventoryNode, NodeHardware, render_inventory
from tests.conftest import ROOT


def group_hosts(children: dict, group: str) -> set[str]:
    return set((children.get(group) or {}).get("hosts") or {})


@pytest.mark.security
def test_p3_every_login_and_compute_host_of_the_example_mounts_shared():
    example = yaml.safe_load((ROOT / "inventory/example/hosts.yml").read_text())
    children = example["all"]["children"]
    users = group_hosts(children, "login") | group_hosts(children, "slurm_compute")
    assert users - group_hosts(children, "nfs_clients") == set()


@pytest.mark.security
def test_p3_the_lab_has_a_separate_login_node_that_mounts_shared():
    nodes = [InventoryNode("login1", "10.77.0.10", 0)] + [
        InventoryNode(f"n{i}", f"10.77.0.{10 + i}", i) for i in (1, 2, 3)
    ]
    text = render_inventory(
        nodes,
        ssh_key=Path("/k"),
        known_hosts=Path("/kh"),
        proxy_url="http://10.77.0.1:3128",
        lab_name="lab",
        hardware=NodeHardware(cpus=2, memory_mb=4000),
        subnet="10.77.0.0/24",
    )
    children = yaml.safe_load(text)["all"]["children"]
    assert group_hosts(children, "login") == {"login1"}
    assert "login1" in group_hosts(children, "nfs_clients")
    assert group_hosts(children, "login") & group_hosts(children, "slurm_controller") == set()
