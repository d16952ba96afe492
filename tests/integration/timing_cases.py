"""Issue [12] point 1 on the slurm lab: a job's start marks (tacc_agent/tasks/execute/timing.py).
Collected as part of test_slurm_cluster.py (which imports this test), on its lab."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from tests.integration.lab_helpers import node_sh, submit, wait_state
from tests.integration.labs import SLURM_LAB

# /proc's process start has 10 ms steps: a mark may read up to that much early.
TICK = 0.011


def test_a_two_node_job_marks_its_start_in_order_in_its_private_status(alice, tmp_path: Path):
    project = tmp_path / "marks"
    project.mkdir()
    (project / "tcloud.yaml").write_text(
        json.dumps(
            {
                "name": "marks",
                "run": ["echo first; sleep 1"],
                "resources": {"nodes": 2, "cpus": 1, "mem": "50M", "time": "5"},
            }
        )
    )
    job = submit(alice, project)
    info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"), 180)
    assert info["state"] == "COMPLETED", info
    timing = f"{info['workdir']}/status/timing"
    listing = node_sh(SLURM_LAB, "n1", f"stat -c '%a %U' {shlex.quote(timing)}").stdout
    assert listing.split() == ["700", "alice"]
    read = (
        "import json, pathlib, sys; print(json.dumps({p.stem: json.loads(p.read_text()) "
        "for p in pathlib.Path(sys.argv[1]).glob('*.json')}))"
    )
    marks = json.loads(node_sh(SLURM_LAB, "n1", shlex.join(["python3", "-c", read, timing])).stdout)
    assert sorted(marks) == ["batch", "rank-0", "rank-1"]
    batch = marks["batch"]
    assert batch["process"] - TICK <= batch["batch"] <= batch["environment"] <= batch["srun"]
    for rank in ("rank-0", "rank-1"):
        one = marks[rank]
        assert batch["srun"] - TICK <= one["process"], (rank, batch, one)
        assert one["process"] - TICK <= one["wrapper"] <= one["rendezvous"] <= one["program"]
        assert one["program"] <= one["first_output"]
