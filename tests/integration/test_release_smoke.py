"""Issue [20] point 4: Debian 12 (bookworm, Slurm 22.05) stays supported while every other
lab runs Debian 13 (trixie, Slurm 24.11). On the factory's `bw` lab (tests/integration/
labs.py: BOOKWORM_SMOKE, 10.77.14.0/24, the prebaked bookworm image, n1 the controller
and login, n2 compute): site.yml converges and a second run changes nothing; a node (n3)
is added and takes a job; tcloud runs a job across both compute nodes; PyTorch DDP goes
through torchrun (frameworks_cases, which also halts, resumes, cancels and reruns it).
In that order: the jobs need the added node (its cases are imported last, so pytest
collects them after this module's own tests).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tacc_lab.demo import researcher_env
from tacc_lab.releases import BOOKWORM, OS_ENV, Release, release_named
from tacc_lab.wheels import host_has_torch_for
from tests.conftest import run_cli
from tests.integration.lab_helpers import (
    lab_cli,
    lab_status,
    node_ok,
    node_sh,
    site,
    status,
    submit,
    wait_state,
)
from tests.integration.labs import BOOKWORM_SMOKE

pytestmark = pytest.mark.lab

NAME = BOOKWORM_SMOKE.name
FINAL = ("COMPLETED", "FAILED", "CANCELLED")


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


@pytest.fixture(scope="module")
def converged(shaped_lab) -> dict:
    """site.yml, then again: the second run's changed count per host."""
    inventory = shaped_lab.inventory
    site(inventory)
    _, second = site(inventory)
    return {"inventory": inventory, "second": second}


@pytest.fixture(scope="module")
def alice(converged, tmp_path_factory):
    env = researcher_env(NAME, "alice")
    home = tmp_path_factory.mktemp("alice")

    def tcloud_cli(*argv: str, cwd: Path = home):
        return run_cli("tcloud", *argv, env=env, cwd=cwd)

    return tcloud_cli


@pytest.fixture(scope="module")
def release(shaped_lab) -> Release:
    """The release the lab's nodes run (bookworm unless TACC_LAB_OS says otherwise)."""
    return release_named(lab_status(NAME)["os"])


@pytest.fixture(scope="module")
def cpu_torch(release) -> None:
    """The PyTorch cases need this machine's CPU torch wheel for the nodes' Python."""
    if not host_has_torch_for(release):
        python = ".".join(map(str, release.python))
        pytest.skip(
            f"no CPU torch wheel for {release.codename}'s Python {python} in this machine's "
            "pip find-links (PyPI has only the CUDA build): the PyTorch cases need one"
        )


def test_bw1_the_nodes_run_the_release_and_its_slurm(converged, release):
    """Debian 12 and Slurm 22.05 (another release only where TACC_LAB_OS says so)."""
    assert release == BOOKWORM or os.environ.get(OS_ENV), release
    assert sh("n2", "cat /etc/debian_version").startswith(f"{release.version}.")
    assert sh("n1", "sinfo --version").startswith(f"slurm-wlm {release.slurm}.")


def test_bw2_a_second_site_run_changes_nothing(converged):
    assert converged["second"] == {"n1": 0, "n2": 0}, converged["second"]


def test_bw3_an_added_node_joins_and_takes_a_job(converged):
    """n3, from `tacc-lab up --nodes 3` and site.yml limited to the controller and the
    new node (as an operator adds one), passes acceptance and runs a job."""
    inventory = converged["inventory"]
    proc = lab_cli(NAME, "up", "--nodes", "3", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stderr
    _, changed = site(inventory, "--limit", "n1,n3")
    assert set(changed) == {"n1", "n3"} and changed["n3"] > 0, changed
    deadline = time.monotonic() + 120
    while "n3 idle" not in sh("n1", "sinfo -h -N -o '%N %t'"):
        assert time.monotonic() < deadline, sh("n1", "sinfo -h -N -o '%N %t %E'")
        time.sleep(2)
    assert sh("n1", "timeout 60 srun -w n3 -N1 hostname").strip() == "n3"


def test_bw4_a_tcloud_job_runs_on_both_compute_nodes(alice, tmp_path):
    line = 'echo "rank $RANK/$WORLD_SIZE on $(hostname)"'
    (tmp_path / "tcloud.yaml").write_text(
        json.dumps(
            {
                "name": "two-nodes",
                "resources": {"nodes": 2, "mem": "100M", "time": "5"},
                "run": [line],
            }
        )
    )
    job = submit(alice, tmp_path)
    info = wait_state(alice, job, FINAL, 300)
    assert info["state"] == "COMPLETED", (info, alice("logs", job).stdout[-3000:])
    log = alice("logs", job).stdout.splitlines()
    assert "[n2:0] rank 0/2 on n2" in log and "[n3:1] rank 1/2 on n3" in log, log


# Last (see the module's docstring): they run on n2 and n3.
from tests.integration.frameworks_cases import (  # noqa: E402, F401  (issue [9]: torch here)
    ddp_job,
    test_halt_checkpoints_resume_goes_on_and_cancel_leaves_no_worker,
    test_pytorch_ddp_trains_through_torchrun_on_two_nodes_by_two_processes,
    test_rerun_builds_the_same_locked_versions_from_the_same_files,
)

# The python acceptance's torch test runs: root's, on /shared (every node sees it), built
# from the cluster's package cache with the torch alice's DDP job locked.
TORCH_ENV = "/shared/.tacc-accept-torch"


def test_bw5_acceptance_runs_a_torch_all_reduce_between_two_nodes_and_keeps_a_slow_node_out(
    alice,
    ddp_job,  # noqa: F811  (the fixture imported above)
):
    """Issue [22] point 5: `tacc-agent accept n3 --peer n2` runs torch.distributed's
    all_reduce between the two nodes (gloo: no GPUs), the path researchers' jobs take,
    with the python the acceptance setting torch_python names; its bus bandwidth under
    the floor leaves n3 drained with the figure as the reason."""
    lock = status(alice, ddp_job[0])["environment"]
    pin = next(line for line in lock["lock"] if line.startswith("torch=="))
    uv = "/opt/tacc-agent/venv/bin/uv"  # the one the agent builds environments with
    build = (
        f"set -e; rm -rf {TORCH_ENV}; {uv} venv -q --python /usr/bin/python3 {TORCH_ENV}; "
        f"{uv} pip install -q --python {TORCH_ENV}/bin/python --index-url {lock['index']} '{pin}'; "
        # uv leaves its .lock writable by anyone (0666): acceptance refuses such a venv.
        f"chmod -R go-w {TORCH_ENV}"
    )
    built = node_sh(NAME, "n2", build)
    assert built.returncode == 0, built.stdout + built.stderr
    floor = {"torch_python": f"{TORCH_ENV}/bin/python", "torch_allreduce_pair_min_gbps": 1000}
    try:
        proc = node_sh(
            NAME, "n1", f"tacc-agent accept n3 --peer n2 --json --thresholds '{json.dumps(floor)}'"
        )
        assert proc.returncode == 1, proc.stdout + proc.stderr
        tests = {test["name"]: test for test in json.loads(proc.stdout)["tests"]}
        torch = tests["torch all_reduce with n2"]
        assert torch["status"] == "failed", torch
        assert torch["detail"] == "gloo, 32 MiB x 10" and 0 < torch["figure"] < 1000, torch
        assert tests["mpi allreduce with n2"]["status"] == "passed", tests
        reason = sh("n1", "sinfo -h -N -n n3 -o %E").strip()
        assert reason.startswith("tacc: acceptance failed: torch all_reduce with n2 "), reason
        assert reason.endswith("< 1000 GB/s"), reason
    finally:
        sh("n1", f"scontrol update NodeName=n3 State=RESUME; rm -rf {TORCH_ENV}")
