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
from tests.conftest import ROOT, run_cli
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


@pytest.fixture(scope="module")
def tcloud(cluster, tmp_path_factory):
    """Run tcloud against the lab's login node n1, as root, host keys verified."""
    home = tmp_path_factory.mktemp("tcloud")
    cfg = resolve_config(NAME, SUBNET, SUBNET)
    env = {"TCLOUD_CONFIG": str(home / "config.yaml"), "TCLOUD_CACHE_DIR": str(home)}

    def tcloud_cli(*argv: str, cwd: Path = ROOT):
        return run_cli("tcloud", *argv, env=env, cwd=cwd)

    add = tcloud_cli("config", "add", "lab", "--host", "10.77.6.11", "--user", "root",
                     "--key", str(cfg.ssh_key), "--known-hosts", str(cfg.known_hosts),
                     "--userdir", "/shared/tcloud/root")  # fmt: skip
    assert add.returncode == 0, add.stderr
    return tcloud_cli


def task_dir(root: Path, name: str, run: str, nodes: int = 2) -> Path:
    root.mkdir()
    (root / "hello.sh").write_text(
        "#!/bin/sh\n"
        'echo "hello from $(hostname)"\n'
        'echo "$SLURM_PROCID" > "$TACC_WORKDIR/outputs/rank$SLURM_PROCID"\n'
    )
    (root / "hello.sh").chmod(0o755)
    (root / "tcloud.yaml").write_text(
        f"name: {name}\nresources: {{nodes: {nodes}, mem: 100M, time: '5'}}\nrun: [{run!r}]\n"
    )
    return root


def wait_until_gone(job: str, seconds: int = 90) -> None:
    deadline = time.monotonic() + seconds
    while node_sh(NAME, "n1", f"squeue -h -j {job}").stdout.strip():
        assert time.monotonic() < deadline, f"job {job} never finished"
        time.sleep(2)


def test_tcloud_submit_runs_a_task_and_shows_every_nodes_log(tcloud, tmp_path):
    """Issue [4] end to end: tcloud over SSH uploads, builds the job's workdir on shared
    storage and submits it; the job runs on both compute nodes."""
    project = task_dir(tmp_path / "task", "hello", "./hello.sh")
    proc = tcloud("submit", "--json", str(project))
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)
    assert job["blobs_sent"] == 2
    wait_until_gone(job["job"])
    log = tcloud("logs", job["job"])
    assert log.returncode == 0, log.stderr
    assert sorted(log.stdout.splitlines()) == ["0: hello from n2", "1: hello from n3"]
    only = tcloud("logs", job["job"], "--node", "1").stdout.splitlines()
    assert only == ["1: hello from n3"]
    assert "COMPLETED" in tcloud("status", job["job"]).stdout
    again = json.loads(tcloud("submit", "--json", str(project)).stdout)
    assert again["blobs_sent"] == 0 and again["workdir"] != job["workdir"]
    fetched = tcloud("download", job["job"], str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in (tmp_path / "got/outputs").iterdir()) == ["rank0", "rank1"]
    assert (tmp_path / "got/logs" / f"hello-{job['job']}.out").exists()


def test_tcloud_ps_halt_resume_cancel(tcloud, tmp_path):
    project = task_dir(tmp_path / "long", "sleeper", "sleep 300", nodes=1)
    job = json.loads(tcloud("submit", "--json", str(project)).stdout)["job"]
    deadline = time.monotonic() + 30
    while json.loads(tcloud("status", "--json", job).stdout)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(1)
    listed = json.loads(tcloud("ps", "--json").stdout)
    assert [row["name"] for row in listed if row["job"] == job] == ["sleeper"]
    assert tcloud("halt", job).returncode == 0
    held = json.loads(tcloud("status", "--json", job).stdout)
    # Slurm 22.05 says Reason=job_requeued_in_held_state (JobHeldUser on later versions).
    assert held["JobState"] in ("PENDING", "REQUEUE_HOLD") and "held" in held["Reason"].lower()
    assert tcloud("resume", job).returncode == 0
    released = json.loads(tcloud("status", "--json", job).stdout)
    assert "held" not in released["Reason"].lower(), released
    assert tcloud("cancel", job).returncode == 0
    wait_until_gone(job, 30)
    bad = tcloud("cancel", "12; rm -rf /")
    assert bad.returncode == 4 and "not a job id" in bad.stderr


def test_tcloud_files_and_envs(tcloud, tmp_path):
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    assert tcloud("upload", str(tmp_path / "notes.txt")).returncode == 0
    listing = json.loads(tcloud("ls", "--json", "files").stdout)
    assert {"name": "notes.txt", "size": 18, "mode": "0o600"} in listing
    assert tcloud("cat", "files/notes.txt").stdout == "remember the milk\n"
    escape = tcloud("cat", "../../../etc/shadow")
    assert escape.returncode == 4 and "outside your cluster directory" in escape.stderr
    assert json.loads(tcloud("env", "ls", "--json").stdout) == []


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
