"""The `oort` plug-in: the `federated:` task kind (its fields and their messages), the
library offer at execution (tacc_oort in the job's .tacc/lib, TACC_FL_* and
TACC_PARTICIPANT_SELECTION=oort, only for federated tasks) and the finish line from the
program's outputs/fl.json (never through a link, garbage tolerated)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from tacc_agent.tasks.schedule.instruction import parse
from tacc_contract.plugins import Launch, Outcome
from tacc_contract.registry import select
from tacc_plugins import oort
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError

FEDERATED = {
    "clients": 200,
    "per_round": 10,
    "target_accuracy": 0.75,
    "round_deadline_s": 10,
    "max_rounds": 300,
}


@pytest.fixture(autouse=True)
def no_plugin_words(monkeypatch):
    monkeypatch.delenv("TACC_PLUGINS", raising=False)


def task_file(tmp: Path, **extra) -> Path:
    task = {"name": "fl", "run": ["python3 train.py"], **extra}
    (tmp / "tcloud.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return tmp / "tcloud.yaml"


def federated_task(tmp: Path, **changes):
    return load_task(task_file(tmp, federated={**FEDERATED, **changes}), [])


def launch_of(task, job_dir: Path) -> Launch:
    return Launch(task, 0, ["n2"], ["10.0.0.2"], "7", {"PYTHONPATH": "/mine"}, job_dir=job_dir)


# ------------------------------------------------------------------ schema
def test_oort_is_on_by_default_and_a_task_may_turn_it_off():
    assert "oort" in {p.name for p in select()}
    assert "oort" not in {p.name for p in select([], ["-oort"])}


def test_a_federated_task_is_read_with_its_settings(tmp_path):
    spec = federated_task(tmp_path)
    assert spec.extensions["federated"]["per_round"] == 10
    assert spec.extensions["federated"]["round_penalty"] == 2.0  # Oort's alpha
    assert load_task(task_file(tmp_path), []).extensions.get("federated") is None


def test_the_cluster_reads_the_federated_settings_from_the_instruction(tmp_path):
    document = compile_task(federated_task(tmp_path)).document
    cluster_task = parse(json.dumps(document), "instruction.json")
    assert cluster_task.extensions["federated"]["clients"] == 200
    launch = launch_of(cluster_task, tmp_path / "job")
    oort.Oort().execute(launch)
    assert launch.env["TACC_FL_TARGET_ACCURACY"] == "0.75"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"clients": 1}, r"federated.clients: expected an integer >= 2, got 1"),
        ({"per_round": 0}, r"federated.per_round: expected an integer >= 1, got 0"),
        ({"per_round": 201}, r"federated.per_round: at most federated.clients \(200\)"),
        ({"target_accuracy": 1.5}, r"federated.target_accuracy: expected a fraction between 0"),
        ({"target_accuracy": 0}, r"federated.target_accuracy: expected a fraction"),
        ({"round_deadline_s": 0}, r"federated.round_deadline_s: expected the preferred round"),
        ({"round_deadline_s": "soon"}, r"federated.round_deadline_s: expected"),
        ({"max_rounds": 0}, r"federated.max_rounds: expected an integer >= 1"),
        ({"round_penalty": -1}, r"federated.round_penalty: expected a number >= 0"),
        ({"blacklist_rounds": 0}, r"federated.blacklist_rounds: expected an integer >= 1"),
        ({"clinets": 3}, r"federated.clinets"),
    ],
)
def test_bad_federated_settings_name_the_field_and_what_is_expected(tmp_path, changes, message):
    with pytest.raises(TaskFileError, match=message) as caught:
        federated_task(tmp_path, **changes)
    assert f"{tmp_path / 'tcloud.yaml'}:" in str(caught.value)  # file and line


@pytest.mark.bad_input
def test_a_federated_task_names_every_missing_setting(tmp_path):
    with pytest.raises(TaskFileError, match=r"federated.round_deadline_s") as caught:
        load_task(task_file(tmp_path, federated={"clients": 5, "per_round": 2}), [])
    assert "federated.target_accuracy" in str(caught.value)
    assert "federated.max_rounds" in str(caught.value)


@pytest.mark.bad_input
def test_with_oort_off_the_federated_field_is_unknown(tmp_path):
    with pytest.raises(TaskFileError, match=r"federated"):
        load_task(task_file(tmp_path, federated=FEDERATED), ["-oort"])


# ------------------------------------------------------------------ execute
def test_execute_offers_the_library_and_the_settings_to_a_federated_task(tmp_path):
    launch = launch_of(federated_task(tmp_path), tmp_path / "job")
    oort.Oort().execute(launch)
    lib = tmp_path / "job" / ".tacc" / "lib"
    assert (lib / "tacc_oort.py").read_bytes() == (
        Path(oort.programlib.HERE) / "tacc_oort.py"
    ).read_bytes()
    assert launch.env["PYTHONPATH"] == f"{lib}{os.pathsep}/mine"
    assert launch.env["TACC_PARTICIPANT_SELECTION"] == "oort"
    assert {k: v for k, v in launch.env.items() if k.startswith("TACC_FL_")} == {
        "TACC_FL_CLIENTS": "200",
        "TACC_FL_PER_ROUND": "10",
        "TACC_FL_TARGET_ACCURACY": "0.75",
        "TACC_FL_ROUND_DEADLINE_S": "10",
        "TACC_FL_MAX_ROUNDS": "300",
        "TACC_FL_ROUND_PENALTY": "2",
    }
    assert "10 of 200 clients" in launch.notes["oort"]


def test_large_and_fractional_settings_reach_the_program_exactly(tmp_path):
    launch = launch_of(
        federated_task(tmp_path, clients=1000000, round_deadline_s=12.3456789), tmp_path / "job"
    )
    oort.Oort().execute(launch)
    assert launch.env["TACC_FL_CLIENTS"] == "1000000"
    assert launch.env["TACC_FL_ROUND_DEADLINE_S"] == "12.3456789"


def test_execute_leaves_other_tasks_alone(tmp_path):
    launch = launch_of(load_task(task_file(tmp_path), []), tmp_path / "job")
    oort.Oort().execute(launch)
    assert launch.env == {"PYTHONPATH": "/mine"}
    assert not (tmp_path / "job").exists()
    assert launch.notes == {}


# ------------------------------------------------------------------ finish
def outcome_of(task, job_dir: Path) -> Outcome:
    return Outcome(task, job_dir, 0, 12.0, {})


RESULT = {
    "selector": "oort",
    "rounds": 41,
    "round_to_target": 41,
    "seconds_to_target": 576.3,
    "final_accuracy": 0.751,
    "simulated_seconds": 576.3,
}


def test_finish_reports_the_time_to_target(tmp_path):
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "fl.json").write_text(json.dumps(RESULT))
    line = oort.Oort().finish(outcome_of(federated_task(tmp_path), tmp_path))
    assert line == (
        "oort: target 0.75 reached at round 41, 576 s (simulated); "
        "final accuracy 0.751 (oort selection)"
    )


def test_finish_reports_a_target_not_reached(tmp_path):
    (tmp_path / "outputs").mkdir()
    result = {**RESULT, "round_to_target": None, "seconds_to_target": None, "rounds": 300}
    (tmp_path / "outputs" / "fl.json").write_text(json.dumps(result))
    line = oort.Oort().finish(outcome_of(federated_task(tmp_path), tmp_path))
    assert line is not None and "target 0.75 not reached in 300 rounds" in line


def test_finish_says_nothing_for_other_tasks(tmp_path):
    assert oort.Oort().finish(outcome_of(load_task(task_file(tmp_path), []), tmp_path)) is None


@pytest.mark.fault
@pytest.mark.parametrize("content", [None, b"", b"{not json", b"[1, 2]", b"\xff\xfe", b"7"])
def test_finish_tolerates_a_missing_or_garbled_result(tmp_path, content):
    if content is not None:
        (tmp_path / "outputs").mkdir()
        (tmp_path / "outputs" / "fl.json").write_bytes(content)
    line = oort.Oort().finish(outcome_of(federated_task(tmp_path), tmp_path))
    assert line == "oort: no readable outputs/fl.json (the program writes it)"


@pytest.mark.fault
def test_finish_tolerates_wrong_types_inside_the_result(tmp_path):
    (tmp_path / "outputs").mkdir()
    result = {
        "selector": ["x"],
        "round_to_target": "41",
        "seconds_to_target": True,
        "final_accuracy": "high",
    }
    (tmp_path / "outputs" / "fl.json").write_text(json.dumps(result))
    line = oort.Oort().finish(outcome_of(federated_task(tmp_path), tmp_path))
    assert line is not None and "target 0.75 not reached" in line


@pytest.mark.fault
def test_finish_refuses_a_result_over_the_size_cap(tmp_path, monkeypatch):
    monkeypatch.setattr(oort, "MAX_RESULT_BYTES", 64)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "fl.json").write_text(json.dumps({**RESULT, "curve": [1] * 100}))
    assert oort.read_result(tmp_path) is None


@pytest.mark.security
def test_finish_never_follows_a_link_to_the_result_or_its_folder(tmp_path):
    """A link planted at outputs/fl.json (or outputs/ itself) pointing at a file of
    someone else's is not read."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "fl.json").write_text(json.dumps(RESULT))
    job = tmp_path / "job"
    (job / "outputs").mkdir(parents=True)
    (job / "outputs" / "fl.json").symlink_to(elsewhere / "fl.json")
    assert oort.read_result(job) is None
    other = tmp_path / "other"
    other.mkdir()
    (other / "outputs").symlink_to(elsewhere)
    assert oort.read_result(other) is None
    line = oort.Oort().finish(outcome_of(federated_task(tmp_path), job))
    assert line is not None and "no readable" in line


@pytest.mark.security
def test_finish_does_not_block_on_a_fifo(tmp_path):
    (tmp_path / "outputs").mkdir()
    os.mkfifo(tmp_path / "outputs" / "fl.json")
    assert oort.read_result(tmp_path) is None
