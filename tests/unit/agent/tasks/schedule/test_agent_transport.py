"""Fail-safe transport switching, from fixture sysfs trees and facts files: the choice,
its warning where the inventory gives a node RDMA it lacks (issue [22] point 4), the
refusal of `transport: rdma` without it, and what `tcloud status` shows."""

from __future__ import annotations

import io
import json
import time

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_agent.tasks.jobs import verbs as job_verbs
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.schedule.transport import local_rdma, sysfs_ports
from tacc_contract.errors import AgentError
from tacc_contract.plugins import Launch
from tacc_plugins.transport import FailSafeTransport, choose
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.jobs.verbs import describe


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
    assert local_rdma(config) == {"active_ports": 2, "source": "agent facts", "declared": False}
    facts.write_text(json.dumps({"time": time.time() - 3600, "rdma": {"active_ports": 2}}))
    assert local_rdma(config) == {"active_ports": 0, "source": "sysfs", "declared": False}


def rank(host: str, ports: int) -> dict:
    return {"host": host, "rdma": {"active_ports": ports}}


def test_rdma_only_when_every_node_has_an_active_port():
    both = choose("auto", [rank("n2", 2), rank("n3", 1)])
    # Issue [22] point 4: UCX for MPI where RDMA exists, for every rank alike.
    assert both.name == "rdma" and both.env == {
        "NCCL_IB_DISABLE": "0",
        "OMPI_MCA_pml": "ucx",
        "OMPI_MCA_osc": "ucx",
        "OMPI_MCA_btl": "^uct,openib,ofi",
        "OMPI_MCA_pml_ucx_devices": "any",
        "OMPI_MCA_pml_ucx_tls": "any",
    }
    assert both.reason == "active RDMA ports on every node (n2: 2, n3: 1)"
    one = choose("auto", [rank("n2", 2), rank("n3", 0)])
    assert one.name == "tcp" and one.env == {"NCCL_IB_DISABLE": "1"}  # the nodes' MPI defaults
    assert one.reason.startswith("no active RDMA port on n3 (fail-safe switching")
    assert choose("tcp", [rank("n2", 2)]).reason == "the task asks for tcp"
    assert not one.warning and not one.error  # n3's inventory gives it no RDMA


def test_a_task_that_asks_for_rdma_fails_where_a_node_has_none_instead_of_using_tcp():
    asked = choose("rdma", [rank("n2", 2), rank("n3", 0)])
    assert asked.error == (
        "transport: rdma: no active RDMA port on n3; the job does not run over TCP "
        "(transport: auto would)"
    )
    assert asked.env == {} and asked.name == "none"
    assert choose("rdma", [rank("n2", 2), rank("n3", 1)]).error == ""


def test_falling_back_on_a_node_the_inventory_gives_rdma_is_a_warning():
    down = {"host": "n3", "rdma": {"active_ports": 0, "declared": True}}
    fallback = choose("auto", [rank("n2", 2), down])
    assert fallback.name == "tcp" and fallback.env == {"NCCL_IB_DISABLE": "1"}
    assert fallback.warning.startswith("RDMA is down on n3, which the inventory gives RDMA")
    assert not fallback.error


def test_the_plugin_refuses_the_launch_with_the_reason(tmp_path):
    path = tmp_path / "task.yaml"
    path.write_text(
        yaml.safe_dump({"name": "x", "run": ["true"], "runtime": {"transport": "rdma"}})
    )
    task = parse(json.dumps(compile_task(load_task(path)).document), "instruction")
    launch = Launch(task, 0, ["n2"], ["10.0.0.2"], "7", {}, facts=rank("n2", 0))
    with pytest.raises(AgentError, match="transport: rdma: no active RDMA port on n2"):
        FailSafeTransport().execute(launch)
    assert launch.transport is None and "TACC_TRANSPORT" not in launch.env


def test_an_rdma_job_gets_ucx_unless_its_task_sets_openmpis_own(tmp_path):
    """Issue [22] point 4: every rank of an RDMA job selects OpenMPI's UCX; a task that
    names its own PML (an MPI built without UCX) keeps it, on every rank alike."""
    path = tmp_path / "task.yaml"
    own = {"env": {"OMPI_MCA_pml": "ob1"}}
    for environment, pml in (({}, "ucx"), (own, "ob1")):
        task_file = {"name": "x", "run": ["true"], "environment": environment}
        path.write_text(yaml.safe_dump(task_file))
        task = parse(json.dumps(compile_task(load_task(path)).document), "instruction")
        env = dict(task.environment["env"])
        launch = Launch(task, 0, ["n2"], ["10.0.0.2"], "7", env, facts=rank("n2", 1))
        FailSafeTransport().execute(launch)
        assert launch.env["OMPI_MCA_pml"] == pml and launch.env["OMPI_MCA_osc"] == "ucx"
        assert launch.env["NCCL_IB_DISABLE"] == "0"


def test_the_node_facts_say_whether_the_inventory_gives_it_rdma(tmp_path):
    """Declared: in rdma_nodes (rdma_declared) with an RDMA device, whatever its ports'
    state; a node of the group without any device is one the rdma role skipped."""
    down = fixture_tree(tmp_path / "down", {"mlx5_0/1": "1: DOWN"})

    def facts(root, declared: bool) -> dict:
        config = AgentConfig(
            rdma_sysfs_root=str(root), facts_file=str(tmp_path / "none"), rdma_declared=declared
        )
        return local_rdma(config)

    assert facts(down, True) == {"active_ports": 0, "source": "sysfs", "declared": True}
    assert facts(down, False)["declared"] is False
    assert facts(tmp_path / "no-device", True)["declared"] is False


def test_tcloud_status_shows_the_last_runs_warning():
    down = "RDMA is down on n3, which the inventory gives RDMA: this job runs over TCP"
    history = [
        {"state": "RUNNING", "warnings": ["an earlier run's"]},
        {"state": "QUEUED"},
        {"state": "RUNNING", "warnings": [down]},
    ]
    assert job_verbs._warnings(history) == [down]
    assert job_verbs._warnings([{"state": "RUNNING"}]) == []
    out = io.StringIO()
    status = {"job_id": "7", "name": "x", "state": "RUNNING", "workdir": "/w", "warnings": [down]}
    describe(status, out)
    assert f"WARNING: {down}\n" in out.getvalue()
