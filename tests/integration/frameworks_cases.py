"""Issue [9]: real frameworks through the four layers. PyTorch DDP through torchrun on
2 nodes x 2 processes (CPU, gloo) with an environment built by uv from the cluster's
package cache and locked; halt writes a checkpoint and resume goes on from it; cancel
leaves no torchrun or worker behind; rerun builds the same locked versions; MPI (mpi4py,
OpenMPI) through mpirun and through srun with 2 ranks per node; a legacy tuxiv.conf runs
unchanged.

The MPI and tuxiv.conf cases are collected by test_slurm_cluster.py (its lab, Debian 13).
The PyTorch cases are collected by test_release_smoke.py (Debian 12): the lab feeds
torch from this machine's CPU-only wheel, and a Debian 12 host has it for Python 3.11
only (PyPI carries no CPU build), so they run on the lab whose nodes have that Python.
That module's `cpu_torch` fixture skips them, saying so, on a host with no such wheel.
Each collecting module gives `alice` (tcloud as alice on its lab) and `shaped_lab`.
"""

from __future__ import annotations

import json
import re
import shutil
import time

import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.lab_helpers import node_sh, status, submit, wait_state

FINAL = ("COMPLETED", "FAILED", "CANCELLED")
RANK_LABELS = ("[n2:0]", "[n2:1]", "[n3:2]", "[n3:3]")


def wait_log(tcloud, job: str, pattern: str, seconds: int) -> str:
    deadline = time.monotonic() + seconds
    while not re.search(pattern, log := tcloud("logs", job).stdout, re.M):
        assert time.monotonic() < deadline, f"no {pattern!r} in job {job}'s log:\n{log[-4000:]}"
        time.sleep(1)
    return log


def losses(log: str) -> list[float]:
    return [float(m) for m in re.findall(r"^\[n2:0\] epoch \d+/\d+ loss ([0-9.]+)$", log, re.M)]


def no_process(lab: str, node: str, pattern: str) -> bool:
    table = node_sh(lab, node, "ps -eo args").stdout.splitlines()
    return not [line for line in table if pattern in line]


@pytest.fixture(scope="module")
def ddp_job(alice, cpu_torch) -> tuple[str, str]:
    """examples/pytorch-ddp as it is, run to the end: (job id, its log)."""
    job = submit(alice, ROOT / "examples/pytorch-ddp")
    info = wait_state(alice, job, FINAL, 900)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED", (info, log[-4000:])
    return job, log


def test_pytorch_ddp_trains_through_torchrun_on_two_nodes_by_two_processes(alice, ddp_job):
    job, log = ddp_job
    for rank, label in enumerate(RANK_LABELS):
        host = label[1:3]
        assert f"{label} rank {rank}/4 (local {rank % 2}) on {host}: cpu, backend gloo" in log, log
    # Only worker lines carry a rank label beyond the node's first: torchrun's own lines
    # stay with the node's wrapper.
    assert not [line for line in log.splitlines() if line.startswith(("[n2:2]", "[n3:1]"))]
    found = losses(log)
    assert len(found) == 8 and found[-1] < found[0], found  # the loss falls
    info = status(alice, job)
    environment = info["environment"]
    assert [line.split("==")[0] for line in environment["lock"]].count("torch") == 1
    assert environment["index"].startswith("http://n1:3141/"), environment
    assert environment["installer"].startswith("uv "), environment
    text = alice("status", job).stdout
    assert "locked:" in text and next(x for x in environment["lock"] if "torch==" in x) in text


def test_rerun_builds_the_same_locked_versions_from_the_same_files(alice, ddp_job):
    job, _ = ddp_job
    past = status(alice, job)
    proc = alice("rerun", "--json", job)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["rerun_of"] == job and answer["lock"] == past["environment"]["lock"]
    info = wait_state(alice, answer["job_id"], FINAL, 900)
    assert info["state"] == "COMPLETED", (info, alice("logs", answer["job_id"]).stdout[-6000:])
    assert info["environment"]["lock"] == past["environment"]["lock"]
    assert info["code_digest"] == past["code_digest"] and info["rerun_of"] == job
    assert f"a rerun of job {job}" in alice("status", answer["job_id"]).stdout


def test_halt_checkpoints_resume_goes_on_and_cancel_leaves_no_worker(
    alice, cpu_torch, shaped_lab, tmp_path
):
    project = tmp_path / "ddp"
    shutil.copytree(ROOT / "examples/pytorch-ddp", project)
    task = yaml.safe_load((project / "tcloud.yaml").read_text())
    task["run"] = [task["run"][0].replace("--epochs 8 ", "--epochs 400 ")]
    # The program checkpoints at the signal and exits (the example's STOP_ON_SIGNAL).
    task["environment"]["env"] = {"STOP_ON_SIGNAL": "1"}
    (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
    job = submit(alice, project)
    wait_log(alice, job, r"^\[n2:0\] epoch 2/400 loss", 600)
    halted = alice("halt", job, "--grace", "60")
    assert halted.returncode == 0, halted.stderr
    assert "the program exited within the 60 s grace period" in halted.stdout, halted.stdout
    wait_state(alice, job, ("HALTED",), 60)
    log = alice("logs", job).stdout
    saved = re.findall(r"^\[n2:0\] checkpoint: next epoch (\d+) ", log, re.M)
    assert saved, log[-4000:]
    assert alice("resume", job).returncode == 0
    log = wait_log(alice, job, r"^\[n3:3\] rank 3: resumed from .* at epoch \d+$", 600)
    resumed = int(re.findall(r"^\[n3:3\] rank 3: resumed from .* at epoch (\d+)$", log, re.M)[-1])
    assert resumed >= int(saved[-1]) >= 1, log[-4000:]  # the epoch counter goes on
    wait_log(alice, job, rf"^\[n2:0\] epoch {resumed + 1}/400 loss", 300)
    assert alice("cancel", job).returncode == 0
    wait_state(alice, job, ("CANCELLED",), 60)
    deadline = time.monotonic() + 60
    watched = [(n, p) for n in ("n2", "n3") for p in ("torchrun", "train.py")]
    while not all(no_process(shaped_lab.name, node, what) for node, what in watched):
        assert time.monotonic() < deadline, "torchrun or a worker survived cancel"
        time.sleep(1)


@pytest.mark.parametrize("task_file", ["tcloud.yaml", "srun.yaml"])
def test_mpi_allreduce_on_two_nodes_by_two_ranks(alice, tmp_path, task_file):
    project = ROOT / "examples/mpi-allreduce"
    job = submit(alice, project / task_file)
    info = wait_state(alice, job, FINAL, 300)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED", (info, log[-4000:])
    assert log.count("allreduce sum 10 (expected 10) OK") == 4, log
    fetched = alice("download", job, str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    result = json.loads((tmp_path / "got/outputs/allreduce.json").read_text())
    assert result["size"] == 4 and result["sum"] == 10, result
    assert result["per_node"] == {"n2": 2, "n3": 2}, result


LEGACY = """\
entrypoint:
  - python3 ${TACC_WORKDIR}/train.py
environment:
  name: legacy-env
  dependencies: []
job:
  name: legacy
  general:
    - nodes=2
    - ntasks-per-node=2
    - mem=200M
    - time=5
"""


def test_a_legacy_tuxiv_conf_job_runs_unchanged(alice, tmp_path):
    project = tmp_path / "legacy"
    project.mkdir()
    (project / "tuxiv.conf").write_text(LEGACY)
    (project / "train.py").write_text(
        "import os, socket\nprint('legacy rank', os.environ['RANK'], 'on', socket.gethostname())\n"
    )
    assert alice("validate", str(project)).returncode == 0
    job = submit(alice, project)
    info = wait_state(alice, job, FINAL, 300)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED", (info, log[-3000:])
    for label in RANK_LABELS:
        assert f"{label} legacy rank {label[4]} on {label[1:3]}" in log, log
