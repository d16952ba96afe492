"""fluid: the rung plan, ASHA's rule in tacc_fluid (under a lock shared by processes),
the task fields, and the plug-in's execute and finish hooks."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_contract.plugins import Launch, Outcome
from tacc_plugins import fluid, programlib
from tacc_plugins.programlib import tacc_fluid
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError
from tests.unit.plugins.test_plugins import base, cluster, compiled, planned, write_task

__all__ = ["cluster"]  # the shared fixture (autouse) of the plug-in tests

ADAPTIVE = {"metric": "accuracy", "max_steps": 9}
GRID = {"LR": [0.1, 0.01, 0.001]}


def adaptive_task(**adaptive) -> dict:
    sweep = {"parameters": GRID, "parallel": 2, "adaptive": {**ADAPTIVE, **adaptive}}
    return base(sweep=sweep, plugins=["fluid"])


def fluid_env(tmp: Path, trial: int, mode: str = "max") -> dict[str, str]:
    return {
        "TACC_FLUID_RUNGS": "1,3,9",
        "TACC_FLUID_ETA": "3",
        "TACC_FLUID_MODE": mode,
        "TACC_FLUID_METRIC": "accuracy",
        "TACC_FLUID_DIR": str(tmp / "sweep" / "fluid"),
        "TACC_FLUID_TRIAL": str(trial),
        "TACC_FLUID_TRIAL_DIR": str(tmp / "trials" / str(trial) / "fluid"),
    }


def spec(tmp: Path, task: dict):
    """The task as the cluster reads it, compiled from a project of its own."""
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    return compiled(project, task)[1]


def trial_dir(tmp: Path, index: int = 4) -> Path:
    directory = tmp / "jobs" / "abc-1" / "trials" / str(index)
    directory.mkdir(parents=True)
    return directory


def test_rungs_are_min_times_eta_powers_up_to_max():
    assert fluid.rungs_of(1, 9, 3) == [1, 3, 9]
    assert fluid.rungs_of(1, 27, 3) == [1, 3, 9, 27]
    assert fluid.rungs_of(1, 10, 3) == [1, 3, 9, 10]
    assert fluid.rungs_of(2, 20, 2) == [2, 4, 8, 16, 20]


def test_the_asha_rule_on_a_hand_made_sequence(tmp_path, monkeypatch):
    """eta 3: top floor(n/3) of the rung's values go on; below 3 values, the best so far."""
    expected = [
        (0.5, True),  # n=1: the best so far
        (0.4, False),  # n=2: not the best
        (0.6, True),  # n=3, keep 1: the best
        (0.55, False),  # n=4, keep 1
        (0.3, False),  # n=5, keep 1
        (0.58, True),  # n=6, keep 2: 0.6, 0.58
        (0.58, True),  # n=7, keep 2: a tie with the second goes on
        (0.57, False),
    ]  # n=8, keep 2
    for trial, (value, goes_on) in enumerate(expected):
        for key, text in fluid_env(tmp_path, trial).items():
            monkeypatch.setenv(key, text)
        assert tacc_fluid.report(1, value) is goes_on, (trial, value)
    state = json.loads((tmp_path / "sweep/fluid/rungs.json").read_text())
    assert len(state["rungs"]["1"]) == len(expected)
    result = json.loads((tmp_path / "trials/7/fluid/result.json").read_text())
    assert result == {
        "rung": 1,
        "rungs": 3,
        "step": 1,
        "value": 0.57,
        "best": 0.6,
        "stopped": True,
        "metric": "accuracy",
    }


def test_min_mode_keeps_the_smallest_and_the_last_rung_always_goes_on(tmp_path, monkeypatch):
    assert tacc_fluid.promoted(0.1, [0.3, 0.2, 0.1], 3, maximize=False)
    assert not tacc_fluid.promoted(0.2, [0.3, 0.2, 0.1], 3, maximize=False)
    for trial, value in enumerate([0.9, 0.1]):
        for key, text in fluid_env(tmp_path, trial).items():
            monkeypatch.setenv(key, text)
        assert tacc_fluid.report(9, value) is True  # max_steps: the trial ends anyway
        assert tacc_fluid.report(2, value) is True  # not a rung
    lines = (tmp_path / "trials/1/fluid/metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [9, 2]


def test_without_the_plugin_report_goes_on_and_writes_nothing(tmp_path, monkeypatch):
    for key in fluid_env(tmp_path, 0):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    assert all(tacc_fluid.report(step, 0.0) for step in range(1, 10))
    assert list(tmp_path.iterdir()) == []


REPORTER = """
import os, sys
sys.path.insert(0, sys.argv[1])
import tacc_fluid
first = int(sys.argv[2])
for trial in range(first, first + 40):
    os.environ["TACC_FLUID_TRIAL"] = str(trial)
    tacc_fluid.report(1, trial / 100)
"""


def test_two_processes_reporting_at_once_lose_no_value(tmp_path):
    env = {**os.environ, **fluid_env(tmp_path, 0)}
    library = str(Path(programlib.HERE))
    reporters = [
        subprocess.Popen([sys.executable, "-c", REPORTER, library, str(first)], env=env)
        for first in (0, 1000)
    ]
    assert [p.wait(timeout=30) for p in reporters] == [0, 0]
    rung = json.loads((tmp_path / "sweep/fluid/rungs.json").read_text())["rungs"]["1"]
    assert len(rung) == 80 and rung["1039"] == 10.39


@pytest.mark.fault
def test_a_file_system_without_locks_leaves_the_trial_running_and_says_so(
    tmp_path, monkeypatch, capsys
):
    """An NFS mount without lock service answers lockf with ENOLCK: the trial is not
    compared (it goes on, unpruned) instead of failing the user's training."""

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(tacc_fluid.fcntl, "lockf", no_locks)
    for key, text in fluid_env(tmp_path, 0).items():
        monkeypatch.setenv(key, text)
    assert tacc_fluid.report(1, 0.1) is True and tacc_fluid.report(3, 0.1) is True
    assert capsys.readouterr().err.count("tacc_fluid: no file locks in") == 1
    assert not (tmp_path / "sweep/fluid/rungs.json").exists()


@pytest.mark.fault
def test_the_rungs_file_is_replaced_whole_under_its_own_lock_file(tmp_path, monkeypatch):
    for key, text in fluid_env(tmp_path, 0).items():
        monkeypatch.setenv(key, text)
    tacc_fluid.report(1, 0.3)
    before = os.stat(tmp_path / "sweep/fluid/rungs.json").st_ino
    tacc_fluid.report(3, 0.4)
    assert os.stat(tmp_path / "sweep/fluid/rungs.json").st_ino != before  # renamed into place
    assert sorted(os.listdir(tmp_path / "sweep/fluid")) == ["rungs.json", "rungs.lock"]


@pytest.mark.fault
def test_a_damaged_rungs_file_starts_the_rung_afresh(tmp_path, monkeypatch):
    (tmp_path / "sweep/fluid").mkdir(parents=True)
    (tmp_path / "sweep/fluid/rungs.json").write_text("{not json")
    for key, text in fluid_env(tmp_path, 0).items():
        monkeypatch.setenv(key, text)
    assert tacc_fluid.report(1, 0.2) is True
    assert json.loads((tmp_path / "sweep/fluid/rungs.json").read_text()) == {
        "rungs": {"1": {"0": 0.2}}
    }


# ------------------------------------------------------------------ the task fields
@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("adaptive", "field", "message"),
    [
        ({"metric": None}, "sweep.adaptive.metric", "expected the reported value's name"),
        ({"metric": "a b"}, "sweep.adaptive.metric", "expected a metric name"),
        ({"mode": "up"}, "sweep.adaptive.mode", "expected one of max, min, got 'up'"),
        ({"eta": 1}, "sweep.adaptive.eta", "expected an integer >= 2, got 1"),
        ({"min_steps": 0}, "sweep.adaptive.min_steps", "expected an integer >= 1, got 0"),
        ({"max_steps": 2}, "sweep.adaptive.max_steps", "at least min_steps x eta (3)"),
        ({"rungs": [1, 3]}, "sweep.adaptive.rungs", "unknown key"),
    ],
)
def test_bad_adaptive_settings_name_the_file_line_and_field(tmp_path, adaptive, field, message):
    path = write_task(tmp_path, adaptive_task(**adaptive))
    with pytest.raises(TaskFileError) as caught:
        load_task(path, [])
    problem = caught.value.problems[0]
    assert problem.field == field and message in problem.message
    assert problem.line > 0 and str(path) in str(caught.value)


@pytest.mark.bad_input
def test_adaptive_needs_the_plugin_and_a_grid(tmp_path):
    off = write_task(tmp_path, {**adaptive_task(), "plugins": []})
    with pytest.raises(TaskFileError, match=r"sweep.adaptive: unknown key"):
        load_task(off, [])
    no_grid = write_task(tmp_path, base(sweep={"adaptive": ADAPTIVE}, plugins=["fluid"]))
    with pytest.raises(TaskFileError, match=r"sweep.parameters: missing"):
        load_task(no_grid, [])


# ------------------------------------------------------------------ schedule, execute, finish
def test_a_sweep_without_adaptive_compiles_without_an_empty_adaptive(tmp_path):
    """`adaptive: null` in the instruction would be read by the cluster as an empty
    mapping, missing its required keys: the compile pass leaves it out."""
    (tmp_path / "p").mkdir()
    document, task = compiled(tmp_path / "p", base(sweep={"parameters": GRID}, plugins=["fluid"]))
    assert "adaptive" not in document["task"]["sweep"]
    assert fluid.adaptive_of(task) is None


def test_schedule_records_the_plan_and_packs_shared_trials(tmp_path):
    task = spec(tmp_path, adaptive_task())
    submission = planned(task)
    assert submission.options["array"] == "0-2%2"  # whole trials: the user's throttle
    assert submission.data["fluid"] == {
        "rungs": [1, 3, 9],
        "eta": 3,
        "metric": "accuracy",
        "mode": "max",
    }
    shared = {**adaptive_task(), "resources": {"gpus_per_node": 0.25, "partition": "gpu"}}
    task = spec(tmp_path, shared)
    submission = planned(task)
    assert submission.options["array"] == "0-2%3"  # 2 x eta, at most the 3 trials
    assert "array 0-2%2 -> 0-2%3" in submission.notes["fluid"]


def test_execute_sets_the_env_for_an_adaptive_sweeps_trials_only(tmp_path):
    task = spec(tmp_path, adaptive_task())
    trial = trial_dir(tmp_path)
    launch = Launch(task, 0, ["c1"], ["10.0.0.1"], "7", {"SLURM_ARRAY_TASK_ID": "4"}, job_dir=trial)
    fluid.Fluid().execute(launch)
    assert launch.env["TACC_FLUID_RUNGS"] == "1,3,9" and launch.env["TACC_FLUID_ETA"] == "3"
    assert launch.env["TACC_FLUID_MODE"] == "max" and launch.env["TACC_FLUID_TRIAL"] == "4"
    assert launch.env["TACC_FLUID_TRIAL_DIR"] == str(trial / "fluid")
    assert (trial / ".tacc/lib/tacc_fluid.py").is_file()
    assert launch.env["PYTHONPATH"] == str(trial / ".tacc/lib")
    plain = spec(tmp_path, base(sweep={"parameters": GRID}, plugins=["fluid"]))
    other = Launch(plain, 0, ["c1"], ["10.0.0.1"], "7", {"SLURM_ARRAY_TASK_ID": "4"}, job_dir=trial)
    fluid.Fluid().execute(other)
    assert not any(key.startswith("TACC_FLUID") for key in other.env)


@pytest.mark.security
def test_the_shared_dir_comes_from_the_job_dir_never_from_the_task_or_env(tmp_path):
    task = spec(tmp_path, adaptive_task())
    trial = trial_dir(tmp_path)
    env = {"SLURM_ARRAY_TASK_ID": "4", "TACC_FLUID_DIR": "/home/bob/jobs/x/fluid"}
    launch = Launch(task, 0, ["c1"], ["10.0.0.1"], "7", env, job_dir=trial)
    fluid.Fluid().execute(launch)
    assert launch.env["TACC_FLUID_DIR"] == str(tmp_path / "jobs/abc-1/fluid")
    assert (tmp_path / "jobs/abc-1/fluid").stat().st_mode & 0o077 == 0
    not_a_trial = Launch(
        task,
        0,
        ["c1"],
        ["10.0.0.1"],
        "7",
        {"SLURM_ARRAY_TASK_ID": "4"},
        job_dir=tmp_path / "jobs" / "abc-1",
    )
    fluid.Fluid().execute(not_a_trial)
    assert "TACC_FLUID_DIR" not in not_a_trial.env


def outcome_of(tmp_path: Path, trial: Path) -> Outcome:
    task = spec(tmp_path, adaptive_task())
    return Outcome(task, trial, 0, 5.0, {})


def test_finish_says_where_the_trial_stopped(tmp_path):
    trial = trial_dir(tmp_path)
    (trial / "fluid").mkdir()
    result = {"rung": 2, "rungs": 3, "step": 3, "value": 0.71, "best": 0.83, "stopped": True}
    (trial / "fluid/result.json").write_text(json.dumps(result))
    line = fluid.Fluid().finish(outcome_of(tmp_path, trial))
    assert line == "fluid: stopped at rung 2 of 3 (step 3), value 0.71 (best 0.83)"
    (trial / "fluid/result.json").write_text(
        json.dumps({**result, "rung": 3, "step": 9, "stopped": False})
    )
    line = fluid.Fluid().finish(outcome_of(tmp_path, trial))
    assert line == "fluid: ran to the last rung (step 9), value 0.71 (best 0.83)"


@pytest.mark.security
@pytest.mark.parametrize(
    "kind", ["missing", "garbage", "wrong types", "too big", "link", "linked dir", "fifo"]
)
def test_finish_tolerates_missing_garbage_and_linked_results(tmp_path, kind):
    trial = trial_dir(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"rung": 1, "rungs": 3, "step": 1, "value": 42}))
    if kind == "linked dir":
        (trial / "fluid").symlink_to(tmp_path)
        (tmp_path / "result.json").symlink_to(secret)
    elif kind != "missing":
        (trial / "fluid").mkdir()
    path = trial / "fluid/result.json"
    if kind == "garbage":
        path.write_bytes(b"\xff{{{")
    elif kind == "wrong types":
        path.write_text(json.dumps({"rung": "1", "rungs": [], "step": None}))
    elif kind == "too big":
        path.write_text(json.dumps({"rung": 1, "rungs": 3, "step": 1, "pad": "x" * 5000}))
    elif kind == "link":
        path.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(path)
    line = fluid.Fluid().finish(outcome_of(tmp_path, trial))
    assert line == "fluid: no decision recorded (the program did not call tacc_fluid.report)"
