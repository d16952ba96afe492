"""Issue [10].3: the cluster's shape. A login node that is not an NFS client keeps
researchers' workspaces on its own disk, where jobs on compute nodes never see them; the
lab has the production shape (a separate login node), so such a bug shows there."""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT
from tests.unit.lab.test_lab_inventory import render_lab


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
    children = render_lab(3, login_node=True)["all"]["children"]
    assert group_hosts(children, "login") == {"login1"}
    assert "login1" in group_hosts(children, "nfs_clients")
    assert group_hosts(children, "login") & group_hosts(children, "slurm_controller") == set()
