"""Issue [2] on a real lab: converge site.yml, Slurm works across nodes, the re-run and
--check --diff change nothing, and adding a node does not disturb a running job.

Runs in CI as root, on its own lab (`slurm`, 10.77.6.0/24).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tacc_lab.lab import resolve_config
from tests.conftest import run_cli
from tests.integration.lab_helpers import lab_cli, node_sh, site

pytestmark = pytest.mark.lab

NAME = "slurm"
SUBNET = "10.77.6.0/24"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Path:
    inventory = tmp_path_factory.mktemp("slurm") / "hosts.yml"
    lab_cli(NAME, "down")
    proc = lab_cli(NAME, "up", "--nodes", "3", "--subnet", SUBNET, "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stderr
    site(inventory)
    yield inventory
    lab_cli(NAME, "down")


def test_compute_nodes_are_idle(cluster):
    out = node_sh(NAME, "n1", "sinfo -h -N -o '%N %t'").stdout.split("\n")
    assert sorted(line for line in out if line) == ["n2 idle", "n3 idle"]


def test_srun_spans_both_compute_nodes(cluster):
    proc = node_sh(NAME, "n1", "timeout 60 srun -N2 hostname")
    assert sorted(proc.stdout.split()) == ["n2", "n3"], proc.stderr


def test_munge_credentials_decode_across_nodes(cluster):
    cred = node_sh(NAME, "n3", "munge -n").stdout.strip()
    proc = node_sh(NAME, "n1", f"echo {cred} | unmunge")
    assert "STATUS:          Success (0)" in proc.stdout
    assert "ENCODE_HOST:     n3" in proc.stdout
    mode = node_sh(NAME, "n2", "stat -c '%a %U' /etc/munge/munge.key").stdout.strip()
    assert mode == "400 munge"


def test_tcloud_submit_runs_a_task_on_the_cluster(cluster, tmp_path):
    """Issue [4] end to end: tcloud over SSH uploads, builds the job's workdir on shared
    storage and submits it; the job runs on both compute nodes."""
    cfg = resolve_config(NAME, SUBNET, SUBNET)
    env = {"TCLOUD_CONFIG": str(tmp_path / "config.yaml"), "TCLOUD_CACHE_DIR": str(tmp_path)}
    add = run_cli("tcloud", "config", "add", "lab", "--host", "10.77.6.11", "--user", "root",
                  "--key", str(cfg.ssh_key), "--known-hosts", str(cfg.known_hosts),
                  "--userdir", "/shared/tcloud/root", env=env)  # fmt: skip
    assert add.returncode == 0, add.stderr
    project = tmp_path / "task"
    project.mkdir()
    (project / "hello.sh").write_text('#!/bin/sh\necho "hello from $(hostname)"\n')
    (project / "hello.sh").chmod(0o755)
    (project / "tcloud.yaml").write_text(
        "name: hello\nresources: {nodes: 2, mem: 100M, time: '5'}\nrun: [./hello.sh]\n"
    )
    proc = run_cli("tcloud", "submit", "--json", str(project), env=env)
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    assert job["blobs_sent"] == 2
    deadline = time.monotonic() + 90
    while node_sh(NAME, "n1", f"squeue -h -j {job['job']}").stdout.strip():
        assert time.monotonic() < deadline, "job never finished"
        time.sleep(2)
    log = node_sh(NAME, "n1", f"cat {job['workdir']}/logs/hello-{job['job']}.out").stdout
    assert sorted(log.splitlines()) == ["hello from n2", "hello from n3"]
    again = json.loads(run_cli("tcloud", "submit", "--json", str(project), env=env).stdout)
    assert again["blobs_sent"] == 0 and again["workdir"] != job["workdir"]


def test_check_diff_on_the_converged_cluster_changes_nothing(cluster):
    # (The plain re-run is proven by the last step of the add-node test below, by
    # molecule's idempotence step in the cluster scenario and by test_hardware_roles.)
    _, changed = site(cluster, "--check", "--diff")
    assert changed == {"n1": 0, "n2": 0, "n3": 0}


def test_added_node_joins_without_disturbing_a_running_job(cluster):
    job = node_sh(NAME, "n1", "sbatch --parsable -N1 -w n2 --wrap 'sleep 300'").stdout.strip()
    deadline = time.monotonic() + 30
    while node_sh(NAME, "n1", f"squeue -h -j {job} -o %T").stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(1)
    proc = lab_cli(NAME, "up", "--nodes", "4", "--inventory", str(cluster))
    assert proc.returncode == 0, proc.stderr
    run, changed = site(cluster)
    assert changed["n4"] > 0
    # Existing nodes change only what the new node list changes: /etc/hosts, slurm.conf
    # and the ordered daemon restart.
    for host in ("n1", "n2", "n3"):
        assert changed[host] <= 3, run.stdout[-3000:]
    deadline = time.monotonic() + 60
    while "n4 idle" not in node_sh(NAME, "n1", "sinfo -h -N -o '%N %t'").stdout:
        assert time.monotonic() < deadline, "n4 never became idle"
        time.sleep(2)
    state = node_sh(NAME, "n1", f"squeue -h -j {job} -o '%T %N'").stdout.strip()
    assert state == "RUNNING n2"
    node_sh(NAME, "n1", f"scancel {job}")
    _, changed = site(cluster)
    assert set(changed.values()) == {0}
