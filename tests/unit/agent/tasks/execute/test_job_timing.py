"""The job's start marks (tacc_agent/tasks/execute/timing.py, issue [12] point 1): the batch
step and each rank note where their start goes in the job's private status/timing/,
cheaply and without ever failing the job; bench/submit_steps.py turns them, the
client's TCLOUD_TIMING lines and Slurm's logs into named steps."""

from __future__ import annotations

import importlib.util
import json
import os
import stat
import time
from itertools import islice

import pytest

from tacc_agent import slurm
from tacc_agent.tasks.execute import timing
from tacc_agent.tasks.execute.agreement import poll_intervals
from tacc_agent.tasks.execute.launch import first_output_marked, step_hostnames
from tests.conftest import ROOT


def load_bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_marks_are_written_once_per_save_into_a_private_directory(tmp_path):
    (tmp_path / "status").mkdir(mode=0o700)
    marks = timing.Marks(tmp_path, "rank-3")
    marks.mark("wrapper", 100.0)
    marks.mark("rendezvous")
    marks.save()
    written = json.loads((tmp_path / "status/timing/rank-3.json").read_text())
    assert written["wrapper"] == 100.0
    assert written["process"] <= written["rendezvous"] <= time.time()
    assert stat.S_IMODE(os.stat(tmp_path / "status/timing").st_mode) == 0o700
    timing.clear(tmp_path)
    assert not list((tmp_path / "status/timing").iterdir())


def test_a_mark_that_cannot_be_written_never_fails_the_job(tmp_path):
    marks = timing.Marks(tmp_path / "gone", "batch")  # no status/ to write into
    marks.mark("batch")
    marks.save()
    assert not (tmp_path / "gone").exists()


def test_the_first_output_line_is_marked_once_and_every_line_still_reaches_the_log(tmp_path):
    (tmp_path / "status").mkdir()
    marks = timing.Marks(tmp_path, "rank-0")
    seen: list[bytes] = []
    sink = first_output_marked(seen.append, marks)
    sink(b"first\n")
    first = json.loads((tmp_path / "status/timing/rank-0.json").read_text())["first_output"]
    sink(b"second\n")
    assert seen == [b"first\n", b"second\n"]
    assert json.loads((tmp_path / "status/timing/rank-0.json").read_text())["first_output"] == (
        first
    )


CTLD_LOG = """\
[2026-11-24T05:00:01.250] _slurm_rpc_submit_batch_job: JobId=7 InitPrio=1 usec=400
[2026-11-24T05:00:01.900] sched: Allocate JobId=7 NodeList=n2 #CPUs=1 Partition=batch
[2026-11-24T05:00:02.000] _slurm_rpc_submit_batch_job: JobId=8 InitPrio=1 usec=400
[2026-11-24T05:00:02.100] sched/backfill: _start_job: Started JobId=8 in batch on n3
"""
SLURMD_LOG = "[2026-11-24T05:00:01.950] Launching batch job 7 for UID 2001\n"


def test_slurms_logs_give_submission_allocation_and_launch_times():
    steps = load_bench("submit_steps")
    found = steps.slurm_points(CTLD_LOG, SLURMD_LOG)
    assert found["7"]["allocated"] - found["7"]["submitted"] == pytest.approx(0.65)
    assert found["7"]["slurmd_launch"] - found["7"]["allocated"] == pytest.approx(0.05)
    assert found["8"]["by"] == "sched/backfill"
    assert "slurmd_launch" not in found["8"]


def test_a_sample_splits_into_client_and_cluster_steps_and_medians_are_per_step():
    steps = load_bench("submit_steps")
    points = {
        "launch": 0.0,
        "exit": 2.0,
        "queued": 1.7,
        "submitted": 1.75,
        "allocated": 2.5,
        "slurmd_launch": 2.55,
        "batch.process": 2.6,
        "batch.batch": 3.0,
        "batch.environment": 3.01,
        "batch.srun": 3.02,
        "rank-0.process": 3.2,
        "rank-0.wrapper": 3.6,
        "rank-0.rendezvous": 3.7,
        "rank-0.program": 3.71,
        "rank-0.first_output": 3.72,
        "running": 3.705,
    }
    client = [
        {"step": "connect", "start": 0.8, "end": 1.0},
        {"step": "session", "start": 1.0, "end": 1.4},
        {"step": "store", "start": 1.4, "end": 1.5},
        {"step": "store", "start": 1.6, "end": 1.9},
    ]
    one = steps.split({"points": points, "client": client})
    assert one["client: start (Python + imports + task compile)"] == pytest.approx(0.8)
    assert one["client: store (2)"] == pytest.approx(0.3)
    assert one["client: between steps (hashing, manifest, ...)"] == pytest.approx(0.1)
    assert one["client: after last step -> exit"] == pytest.approx(0.1)
    assert one["Slurm schedules (submit -> allocated)"] == pytest.approx(0.75)
    assert one["batch step: Python start + imports"] == pytest.approx(0.4)
    assert one["TOTAL launch -> program's first line"] == pytest.approx(3.72)
    other = dict(one, **{"Slurm schedules (submit -> allocated)": 0.25})
    medians = steps.medians([one, other, other])
    assert medians["Slurm schedules (submit -> allocated)"] == pytest.approx(0.25)
    table = steps.table({"tcloud": medians, "sbatch": {"ssh + sbatch (command + RPC)": 0.5}})
    assert table.splitlines()[0] == "| step | tcloud | sbatch |"
    assert "| ssh + sbatch (command + RPC) |  | 0.500 |" in table


def test_a_sample_without_marks_keeps_the_steps_it_has():
    steps = load_bench("submit_steps")
    one = steps.split({"points": {"launch": 0.0, "exit": 1.0, "submitted": 0.5, "allocated": 1.5}})
    assert one == {
        "Slurm schedules (submit -> allocated)": 1.0,
        "TOTAL submit command (launch -> exit)": 1.0,
    }


def test_node_lists_and_hostlist_expressions_need_no_scontrol(monkeypatch):
    asked: list[str] = []
    monkeypatch.setattr(
        slurm.nodes, "hostnames", lambda nodelist, _timeout: asked.append(nodelist) or ["x1"]
    )
    assert step_hostnames("n2", 5) == ["n2"]
    assert step_hostnames("n3,n2", 5) == ["n3", "n2"]
    assert step_hostnames("n[2-3]", 5) == ["n2", "n3"]
    assert step_hostnames("gpu[01-02],n[7,9]", 5) == ["gpu01", "gpu02", "n7", "n9"]
    assert asked == []
    # An expression this parser does not read is Slurm's to expand.
    assert step_hostnames("n[2-x]", 5) == ["x1"]
    assert asked == ["n[2-x]"]


def test_rendezvous_polls_start_fast_and_back_off_to_a_tenth_of_a_second():
    assert list(islice(poll_intervals(), 7)) == [0.01, 0.02, 0.04, 0.08, 0.1, 0.1, 0.1]
