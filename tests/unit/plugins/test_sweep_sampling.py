"""Sampled sweeps (issue [24]): ranges drawn N times at compile time, at random or by a
scrambled Sobol sequence from a seed; the trials go into the instruction, the cluster
checks them against their ranges and never draws, so a rerun runs the same ones."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from tacc_agent.tasks.schedule.instruction import parse
from tacc_contract.errors import Rejected
from tacc_contract.instruction import InvalidInstruction
from tacc_contract.plugins import Launch, Submission
from tacc_contract.trials import planned_count
from tacc_plugins import sampling, sweep
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.compile.tasks import check_sweep
from tcloud.errors import TaskFileError

RANGES = {
    "LR": {"loguniform": [1.0e-4, 1.0e-1]},
    "DROPOUT": {"uniform": [0.0, 0.5]},
    "LAYERS": {"int": [2, 8]},
    "OPT": {"choice": ["adam", "sgd"]},
    "BATCH": [32, 64],
}


def task_file(tmp: Path, sweep_section: dict) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    path = tmp / "tcloud.yaml"
    task = {"name": "t", "run": ["python train.py"], "sweep": sweep_section}
    path.write_text(yaml.safe_dump(task, sort_keys=False))
    return path


def compiled(tmp: Path, sweep_section: dict) -> tuple[dict, object]:
    spec = load_task(task_file(tmp, sweep_section), [])
    document = compile_task(spec).document
    return document, parse(json.dumps(document), "instruction.json")


@pytest.mark.parametrize("sampler", ["random", "sobol"])
def test_a_seeded_draw_is_the_same_every_time_and_inside_every_range(tmp_path, sampler):
    section = {"parameters": RANGES, "samples": 8, "sampler": sampler, "seed": 23}
    first, task = compiled(tmp_path / "a", section)
    again, _ = compiled(tmp_path / "b", section)
    trials = first["task"]["sweep"]["trials"]
    assert trials == again["task"]["sweep"]["trials"] and len(trials) == 8
    assert len({json.dumps(t, sort_keys=True) for t in trials}) == 8  # 8 different trials
    for trial in trials:
        assert set(trial) == set(RANGES)
        assert 1.0e-4 <= float(trial["LR"]) <= 1.0e-1
        assert 0.0 <= float(trial["DROPOUT"]) <= 0.5
        assert trial["LAYERS"] in {str(n) for n in range(2, 9)}
        assert trial["OPT"] in {"adam", "sgd"} and trial["BATCH"] in {"32", "64"}
    launch = Launch(task, 0, ["c1"], ["10.0.0.1"], "7", {"SLURM_ARRAY_TASK_ID": "5"})
    sweep.Sweep().execute(launch)
    assert {k: launch.env[k] for k in RANGES} == trials[5]
    assert launch.env["TACC_TRIALS"] == "8"


def test_sobol_spreads_the_trials_over_a_range_better_than_its_seeded_random_draw():
    # 8 scrambled Sobol points: one in each eighth of [0, 1) (a (0, m, 1)-net), which 8
    # independent draws hit only by chance.
    points = sampling.unit_points(8, 1, "sobol", 5)
    assert sorted(math.floor(p[0] * 8) for p in points) == list(range(8))


def test_loguniform_draws_are_spread_on_a_log_scale():
    values = [float(sampling.value_at({"loguniform": [1e-4, 1e-1]}, u / 10)) for u in range(10)]
    assert values[0] == pytest.approx(1e-4) and values[5] == pytest.approx(10**-2.5, rel=1e-5)


def test_without_a_seed_tcloud_draws_one_and_records_it_with_the_trials(tmp_path):
    document, _ = compiled(tmp_path, {"parameters": RANGES, "samples": 4})
    recorded = document["task"]["sweep"]
    assert recorded["sampler"] == "random" and isinstance(recorded["seed"], int)
    again = sampling.sample(RANGES, 4, "random", recorded["seed"])
    assert again == recorded["trials"]  # the record alone repeats the draw
    assert document["plugins"]["shaped"]["sweep"] == (
        f"4 trials drawn (random, seed {recorded['seed']})"
    )


def test_lists_stay_a_grid_unless_samples_asks_for_a_draw(tmp_path):
    grid, _ = compiled(tmp_path / "g", {"parameters": {"A": [1, 2], "B": ["x", "y"]}})
    assert len(grid["task"]["sweep"]["trials"]) == 4
    # fields left out stay out: the instruction (and its digest) of a grid is as before,
    # and an agent that predates them does not meet keys it does not know
    assert set(grid["task"]["sweep"]) == {"parameters", "trials"}
    drawn, _ = compiled(
        tmp_path / "d", {"parameters": {"A": [1, 2], "B": ["x", "y"]}, "samples": 3, "seed": 1}
    )
    assert len(drawn["task"]["sweep"]["trials"]) == 3


def test_submit_counts_a_sampled_sweep_by_its_samples(tmp_path):
    spec = load_task(task_file(tmp_path, {"parameters": RANGES, "samples": 8}), [])
    assert check_sweep(type("T", (), {"spec": spec, "source": "tcloud.yaml"})(), True) == 8
    assert planned_count({"parameters": {"A": [1, 2, 3]}}) == 3


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("section", "where", "message"),
    [
        (
            {"parameters": {"LR": {"loguniform": [0, 1]}}, "samples": 4},
            "sweep.parameters",
            "LR: loguniform needs low > 0, got 0",
        ),
        (
            {"parameters": {"LR": {"uniform": [1, 1]}}, "samples": 4},
            "sweep.parameters",
            "LR: uniform needs low < high, got [1, 1]",
        ),
        (
            {"parameters": {"N": {"int": [1.5, 4]}}, "samples": 4},
            "sweep.parameters",
            "N: int takes [low, high], two whole numbers",
        ),
        (
            {"parameters": {"N": {"int": [1]}}, "samples": 4},
            "sweep.parameters",
            "N: int takes [low, high], two finite numbers",
        ),
        (
            {"parameters": {"LR": {"uniform": ["a", 1]}}, "samples": 4},
            "sweep.parameters",
            "LR: uniform takes [low, high], two finite numbers",
        ),
        (
            {"parameters": {"O": {"choice": []}}, "samples": 4},
            "sweep.parameters",
            "O: choice takes a non-empty list of numbers or strings",
        ),
        (
            {"parameters": {"O": {"normal": [0, 1]}}, "samples": 4},
            "sweep.parameters",
            "O: 'normal' is not a kind of range; one of {uniform",
        ),
        (
            {"parameters": {"O": {"uniform": [0, 1], "int": [1, 2]}}, "samples": 4},
            "sweep.parameters",
            "O: one of {uniform: [low, high]}",
        ),
        (
            {"parameters": {"LR": {"uniform": [0, 1]}}},
            "sweep.samples",
            "how many trials to draw: LR is a range (1 to 1000)",
        ),
        (
            {"parameters": {"LR": {"uniform": [0, 1]}}, "samples": 0},
            "sweep.samples",
            "expected an integer from 1 to 1000, got 0",
        ),
        (
            {"parameters": {"LR": {"uniform": [0, 1]}}, "samples": 1001},
            "sweep.samples",
            "expected an integer from 1 to 1000, got 1001",
        ),
        (
            {"parameters": {"LR": {"uniform": [0, 1]}}, "samples": 4, "sampler": "grid"},
            "sweep.sampler",
            "expected one of random, sobol, got 'grid'",
        ),
        (
            {"parameters": {"LR": {"uniform": [0, 1]}}, "samples": 4, "seed": -1},
            "sweep.seed",
            "expected an integer >= 0, got -1",
        ),
        (
            {"parameters": {"A": [1, 2]}, "sampler": "sobol"},
            "sweep.sampler",
            "only with sweep.samples (how many trials to draw)",
        ),
        (
            {"parameters": {"A": [1, 2]}, "seed": 3},
            "sweep.seed",
            "only with sweep.samples (how many trials to draw)",
        ),
    ],
)
def test_bad_sampled_sweeps_name_the_field_and_what_is_expected(tmp_path, section, where, message):
    with pytest.raises(TaskFileError) as caught:
        load_task(task_file(tmp_path, section), [])
    text = str(caught.value)
    assert f"{where}: " in text and message in text, text
    assert "tcloud.yaml:" in text  # the file and its line


@pytest.mark.bad_input
def test_a_sobol_sweep_where_tcloud_has_no_scipy_says_how_to_get_it(tmp_path, monkeypatch):
    def no_scipy(*args, **kwargs):
        raise ImportError("No module named 'scipy'")

    monkeypatch.setattr(sampling, "unit_points", no_scipy)
    section = {"parameters": RANGES, "samples": 4, "sampler": "sobol"}
    with pytest.raises(TaskFileError, match=r"sweep.sampler.*pip install 'tacc-plugins\[sobol\]'"):
        compiled(tmp_path, section)


@pytest.mark.security
@pytest.mark.parametrize(
    "forged",
    [
        {"LR": "0.5"},  # outside its loguniform range
        {"LR": "nan"},
        {"LR": "0.01", "EXTRA": "1"},  # a variable the sweep does not have
        {},
    ],
)
def test_the_cluster_refuses_drawn_trials_their_ranges_cannot_give(tmp_path, forged):
    """The agent trusts no client: a crafted instruction's trials must be ones the
    compiler could have drawn (the right count, every parameter, inside its range)."""
    document, _ = compiled(tmp_path, {"parameters": {"LR": RANGES["LR"]}, "samples": 2})
    document["task"]["sweep"]["trials"] = [{"LR": "0.01"}, forged]
    with pytest.raises(InvalidInstruction, match=r"task.sweep.trials: the 2 trial\(s\) tcloud"):
        parse(json.dumps(document), "instruction.json")


@pytest.mark.security
def test_the_cluster_refuses_more_drawn_trials_than_samples(tmp_path):
    document, _ = compiled(tmp_path, {"parameters": {"LR": RANGES["LR"]}, "samples": 2})
    document["task"]["sweep"]["trials"] *= 600  # 1,200 trials for samples: 2
    with pytest.raises(InvalidInstruction, match=r"task.sweep.trials"):
        parse(json.dumps(document), "instruction.json")


@pytest.mark.security
def test_the_cluster_refuses_a_sampled_sweep_whose_trials_were_never_drawn(tmp_path):
    # A hand-made instruction: ranges, samples, no trials. Run as one job it would run
    # once without its parameters; the cluster draws nothing, so it refuses it.
    document, _ = compiled(tmp_path, {"parameters": {"LR": RANGES["LR"]}, "samples": 2})
    del document["task"]["sweep"]["trials"]
    task = parse(json.dumps(document), "instruction.json")
    submission = Submission(task, {"chdir": "/w/job"}, "batch")
    with pytest.raises(Rejected, match="a sampled sweep without its trials") as caught:
        sweep.Sweep().schedule(submission)
    assert caught.value.field == "sweep.trials" and "array" not in submission.options


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"int": [0, 10**400]}, "int takes [low, high], two finite numbers"),
        ({"int": [0, 2**60]}, "int takes [low, high] with low < high, both within +-2**53"),
        (
            {"uniform": [-1.0e308, 1.0e308]},
            "uniform takes [low, high] whose difference is a finite number",
        ),
        ({"uniform": [0, 10**400]}, "uniform takes [low, high], two finite numbers"),
        ({"uniform": ["1_0", 20]}, "uniform takes [low, high], two finite numbers"),
    ],
)
def test_extreme_ranges_are_refused_with_the_field_not_a_traceback(tmp_path, spec, message):
    with pytest.raises(TaskFileError) as caught:
        load_task(task_file(tmp_path, {"parameters": {"X": spec}, "samples": 2}), [])
    assert f"X: {message}" in str(caught.value)


@pytest.mark.security
@pytest.mark.parametrize(
    ("spec", "text"),
    [
        ({"int": [0, 9]}, "²"),
        ({"int": [0, 9]}, "--5"),
        ({"int": [0, 9]}, "9" * 5000),
        ({"int": [0, 9]}, "\u0661"),
        ({"uniform": [0, 1]}, " 0.5\n"),
        ({"uniform": [0, 1]}, "1_0"),
        ({"uniform": [0, 1]}, "inf"),
    ],
)
def test_a_drawn_value_must_be_plain_decimal_text_inside_its_range(spec, text):
    assert sampling.fits(spec, text) is False
