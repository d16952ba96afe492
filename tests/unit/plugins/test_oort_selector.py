"""tacc_oort, Oort's participant selector as the program imports it (standard library
only): the utility terms, exploration and its decay, the pacer, the blacklist, seeded
determinism, the random fallback; and examples/federated's simulation, random against
Oort on a fixed seed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from tacc_plugins.programlib import tacc_oort
from tacc_plugins.programlib.tacc_oort import OortSelector, RandomSelector, selector_from_env
from tcloud.compile.task_file import load_task

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "federated" / "train.py"


def feed(selector, picked, utility=lambda c: 10.0, duration=lambda c: 1.0) -> None:
    """Report each participant with |B| = 10 and a loss giving statistical utility `utility`."""
    for client in picked:
        u = utility(client)  # U = |B| sqrt(sum / |B|)  =>  sum = U^2 / |B|
        selector.update(client, u * u / 10, 10, duration(client))


# ------------------------------------------------------------------ the terms
def test_statistical_utility_is_samples_times_root_mean_squared_loss():
    losses = [1.0, 1.0, 2.0, 2.0]
    assert tacc_oort.statistical_utility(sum(x * x for x in losses), 4) == pytest.approx(
        4 * math.sqrt(10 / 4)
    )
    assert tacc_oort.statistical_utility(5.0, 0) == 0.0


def test_staleness_bonus_and_system_utility():
    assert tacc_oort.staleness_bonus(1, 1) == 0.0
    assert tacc_oort.staleness_bonus(10, 2) == pytest.approx(math.sqrt(0.1 * math.log(10) / 2))
    assert tacc_oort.staleness_bonus(10, 1) > tacc_oort.staleness_bonus(10, 9)  # long untried
    assert tacc_oort.system_utility(10, 8) == 1.0  # within T: no bonus
    assert tacc_oort.system_utility(10, 20) == pytest.approx(0.25)  # (T/t)^2
    assert tacc_oort.system_utility(10, 20, alpha=1) == pytest.approx(0.5)


# ------------------------------------------------------------------ selection
def test_exploitation_prefers_high_loss_and_fast_clients():
    ids = list(range(40))
    selector = OortSelector(ids, 8, 10.0, seed=3, exploration=0.0, exploration_min=0.0)
    selector.exploration = 1.0  # round 1: try everyone we can
    for round_number in range(1, 6):
        feed(
            selector,
            selector.select(round_number),
            utility=lambda c: 50.0 if c % 4 == 0 else 5.0,
            duration=lambda c: 40.0 if c % 2 else 2.0,
        )
    picked = selector.select(6)
    assert sum(1 for c in picked if c % 4 == 0) >= 6  # the fast clients with much to learn


def test_exploration_decays_to_its_floor_and_explores_the_faster_first():
    ids = list(range(1000))
    hints = {c: float(c) for c in ids}  # client c takes c seconds
    selector = OortSelector(ids, 10, 20.0, seed=1, duration_hints=hints)
    first = selector.select(1)
    assert max(first) < 50  # from the 5 x 10 fastest unexplored
    assert selector.exploration == pytest.approx(0.9 * 0.98)
    feed(selector, first)
    for round_number in range(2, 70):
        feed(selector, selector.select(round_number))
    assert selector.exploration == pytest.approx(tacc_oort.EXPLORATION_MIN)
    assert len(selector.utility) < 1000


def test_once_everyone_is_tried_only_exploitation_is_left():
    ids = list(range(12))
    selector = OortSelector(ids, 4, 10.0, seed=2)
    for round_number in range(1, 12):
        feed(selector, selector.select(round_number))
    assert len(selector.utility) == 12
    assert selector.exploration == 0.0


def test_the_pacer_relaxes_T_after_a_utility_drop_and_tightens_after_a_jump():
    selector = OortSelector(list(range(10)), 2, 10.0, pacer_window=2, pacer_step_s=5.0)
    selector.exploited_utility = [10.0, 10.0, 4.0, 4.0]  # the last window dropped
    selector.pace(4)
    assert selector.deadline_s == 15.0
    selector.pace(5)  # only at window ends
    assert selector.deadline_s == 15.0
    selector.exploited_utility += [10.0, 10.0]  # grew 2.5x: T stays
    selector.pace(6)
    assert selector.deadline_s == 15.0
    selector.exploited_utility += [100.0, 100.0]  # grew 10x: tighten
    selector.pace(8)
    assert selector.deadline_s == 10.0


def test_the_pacer_runs_inside_select():
    selector = OortSelector(list(range(20)), 4, 10.0, pacer_window=3, pacer_step_s=2.0)
    for round_number in range(1, 7):
        feed(selector, selector.select(round_number), utility=lambda c: 1.0)
    selector.exploited_utility = [9.0, 9.0, 9.0, 1.0, 1.0, 1.0]
    selector.select(6)
    assert selector.deadline_s == 12.0


def test_clients_picked_too_often_are_blacklisted_up_to_a_share():
    ids = list(range(10))
    selector = OortSelector(ids, 3, 10.0, seed=4, blacklist_rounds=2)
    for round_number in range(1, 30):
        picked = selector.select(round_number)
        feed(selector, picked, utility=lambda c: 100.0 if c < 3 else 1.0)
        assert len(set(picked)) == 3
    banned = selector.blacklisted()
    assert len(banned) == 3  # 30 % of 10
    assert not set(selector.select(30)) & banned


def test_the_same_seed_gives_the_same_rounds():
    def rounds(seed: int) -> list[list[int]]:
        selector = OortSelector(
            list(range(50)), 5, 10.0, seed=seed, duration_hints={c: c % 7 + 1.0 for c in range(50)}
        )
        out = []
        for round_number in range(1, 25):
            picked = selector.select(round_number)
            feed(
                selector, picked, utility=lambda c: float(c % 5 + 1), duration=lambda c: c % 7 * 4.0
            )
            out.append(picked)
        return out

    assert rounds(1) == rounds(1)
    assert rounds(1) != rounds(2)
    random_a, random_b = RandomSelector(range(50), 5, 9), RandomSelector(range(50), 5, 9)
    assert [random_a.select(r) for r in range(5)] == [random_b.select(r) for r in range(5)]


@pytest.mark.bad_input
def test_impossible_settings_are_refused():
    with pytest.raises(ValueError, match=r"per_round must be 1..3, got 4"):
        OortSelector([1, 2, 3], 4, 10.0)
    with pytest.raises(ValueError, match=r"round_deadline_s must be > 0"):
        OortSelector([1, 2, 3], 2, 0)
    with pytest.raises(ValueError, match=r"needs a preferred round duration"):
        selector_from_env([1, 2, 3], 2, env={"TACC_PARTICIPANT_SELECTION": "oort"})


# ------------------------------------------------------------------ from the environment
def test_without_the_plugins_env_the_selector_is_random():
    assert isinstance(selector_from_env(list(range(10)), 3, 5.0, env={}), RandomSelector)
    off = {"TACC_PARTICIPANT_SELECTION": "random", "TACC_FL_ROUND_DEADLINE_S": "5"}
    assert selector_from_env(list(range(10)), 3, env=off).name == "random"


def test_the_plugins_env_gives_oort_with_its_settings():
    env = {
        "TACC_PARTICIPANT_SELECTION": "oort",
        "TACC_FL_PER_ROUND": "4",
        "TACC_FL_ROUND_DEADLINE_S": "12.5",
        "TACC_FL_ROUND_PENALTY": "1",
        "TACC_FL_BLACKLIST_ROUNDS": "3",
    }
    selector = selector_from_env(list(range(10)), env=env)
    assert isinstance(selector, OortSelector)
    assert (selector.per_round, selector.deadline_s, selector.alpha) == (4, 12.5, 1.0)
    assert selector.blacklist_rounds == 3
    assert len(selector.select(1)) == 4


# ------------------------------------------------------------------ the example
@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("federated_example", EXAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_the_example_falls_back_to_its_own_random_pick_without_the_library(
    example, monkeypatch, capsys, tmp_path
):
    monkeypatch.setattr(example, "tacc_oort", None)
    monkeypatch.setenv("TACC_JOB_DIR", str(tmp_path))
    assert example.main(["--max-rounds", "3", "--clients", "30", "--target-accuracy", "0.99"]) == 0
    out = capsys.readouterr().out
    assert "tacc_oort not found" in out and "selector random" in out
    assert (tmp_path / "outputs" / "fl.json").exists()


def test_oort_reaches_the_target_sooner_than_random_in_simulated_time(example, monkeypatch):
    monkeypatch.setattr(example, "tacc_oort", tacc_oort)
    for name in ("TACC_PARTICIPANT_SELECTION", "SEED", "DATA_SEED"):
        monkeypatch.delenv(name, raising=False)
    random_run = example.run(example.settings([]), quiet=True)
    monkeypatch.setenv("TACC_PARTICIPANT_SELECTION", "oort")
    oort_run = example.run(example.settings([]), quiet=True)
    assert (random_run["selector"], oort_run["selector"]) == ("random", "oort")
    assert oort_run["seconds_to_target"] is not None
    assert random_run["seconds_to_target"] is not None
    assert oort_run["seconds_to_target"] * 1.5 < random_run["seconds_to_target"]


def test_the_examples_task_file_loads_and_equals_the_programs_defaults(example):
    """Off (`plugins: [-oort]`) the program gets no TACC_FL_*: its defaults must be the task's."""
    task = load_task(EXAMPLE.parent / "tcloud.yaml", [])
    federated = task.extensions["federated"]
    assert {k: federated[k] for k in example.DEFAULTS} == example.DEFAULTS
