"""The allox plug-in (issue [16]): AlloX's min-cost matching of jobs that accept several
GPU types onto the devices, estimates per owner and job name per type, the fairness knob,
and the agent's side: the only constraint change it makes is a narrowing within what
the owner asked for."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.tasks import constraints, queue_ticks
from tacc_agent.tasks.constraints import Narrowing
from tacc_contract.errors import AgentError
from tacc_contract.plugins import Node, Queue, QueuedJob
from tacc_plugins import allox
from tacc_plugins.allox import Allox, Device, Settings, estimate, plan
from tacc_plugins.matching import min_cost_assignment

NODES = [Node("g1", 8, 1000, 1, ("batch",), features=("h100",), state="IDLE"),
         Node("g2", 8, 1000, 1, ("batch",), features=("l40s",), state="IDLE")]  # fmt: skip


def job(job_id: str, user: str = "alice", state: str = "PENDING", name: str = "train",
        features: str = "h100|l40s", elapsed: int = 0, nodes: tuple[str, ...] = (),
        gpus: float = 1, limit: int = 600) -> QueuedJob:  # fmt: skip
    return QueuedJob(job_id, user, state, 0, gpus, elapsed, name=name, features=features,
                     node_names=nodes, time_limit_seconds=limit)  # fmt: skip


class Ticker:
    """Ticks the plug-in as the agent would, recording the constraints it set."""

    def __init__(self, state_dir: Path, settings: dict | None = None,
                 nodes: list[Node] | None = None) -> None:  # fmt: skip
        self.config = AgentConfig(plugin_settings={"allox": settings or {}})
        self.state_dir = state_dir
        self.nodes = NODES if nodes is None else nodes
        self.set: dict[str, str] = {}

    def __call__(self, *jobs: QueuedJob) -> list[str]:
        def set_features(job_id: str, features: str) -> bool:
            self.set[job_id] = features
            next(j for j in jobs if j.job_id == job_id).features = features
            return True

        queue = Queue(list(jobs), lambda *_: None, 0.0, self.state_dir, self.config,
                      set_features=set_features, cluster_nodes=lambda: self.nodes)  # fmt: skip
        Allox().tick(queue)
        return queue.notes

    def history(self, runs: dict[str, dict[str, list[float]]]) -> None:
        """Runs already watched: {"alice\\x1ftrain": {"h100": [10], ...}}."""
        (self.state_dir / "allox.json").write_text(json.dumps({"runs": runs}))


# --- the matching --------------------------------------------------------------------------


def test_the_assignment_is_the_least_cost_one_of_every_permutation():
    rng = random.Random(7)  # noqa: S311  (test data, not a secret)
    for _ in range(200):
        rows = rng.randint(1, 4)
        columns = rng.randint(rows, 6)
        cost = [[rng.choice([rng.randint(0, 40), rng.random() * 9]) for _ in range(columns)]
                for _ in range(rows)]  # fmt: skip
        given = min_cost_assignment(cost)
        assert len(set(given)) == rows
        best = min(sum(cost[r][c[r]] for r in range(rows))
                   for c in itertools.permutations(range(columns), rows))  # fmt: skip
        assert sum(cost[r][given[r]] for r in range(rows)) == pytest.approx(best)


def test_more_rows_than_columns_is_refused():
    with pytest.raises(ValueError, match="3 rows cannot each get one of 2 columns"):
        min_cost_assignment([[1, 2], [3, 4], [5, 6]])


def test_allox_spreads_jobs_where_the_fastest_type_for_each_would_pile_them_up():
    """Worked by hand: h100 and l40s each free. A takes 10 s on h100 and 30 s on l40s, B
    10 and 12, C 5 and 50. Every job on its fastest type (h100) completes at 5, 15, 25
    (sum 45); AlloX puts B, the job the l40s slows least, there: C, A on h100 (5, 15) and B
    on l40s (12), sum 32, the least of all 8 placements."""
    devices = [Device("g1", "h100", 0.0), Device("g2", "l40s", 0.0)]
    jobs = [job("1"), job("2"), job("3")]
    times = {"1": {"h100": 10, "l40s": 30}, "2": {"h100": 10, "l40s": 12},
             "3": {"h100": 5, "l40s": 50}}  # fmt: skip
    placed = plan(jobs, times, devices)
    assert {j: d.kind for j, d in placed.items()} == {"1": "h100", "2": "l40s", "3": "h100"}


def test_a_busy_device_counts_the_wait_for_it():
    """The h100 is busy for 100 s: a job 3x faster there still goes to the free l40s."""
    devices = [Device("g1", "h100", 100.0), Device("g2", "l40s", 0.0)]
    placed = plan([job("1")], {"1": {"h100": 10, "l40s": 30}}, devices)
    assert placed["1"].kind == "l40s"


def test_a_type_the_job_did_not_ask_for_is_never_planned():
    devices = [Device("g1", "h100", 0.0), Device("g2", "l40s", 0.0)]
    placed = plan([job("1"), job("2")], {"1": {"l40s": 50}, "2": {"l40s": 40}}, devices)
    assert {d.kind for d in placed.values()} == {"l40s"}


# --- estimates -----------------------------------------------------------------------------


def test_an_estimate_is_the_median_run_on_that_type_else_converted_by_the_prior_speeds():
    found = Settings(speed={"h100": 3.0, "l40s": 1.0})
    runs = {"h100": [10, 12, 50]}
    assert estimate(runs, "h100", ["h100", "l40s"], 600, found) == 12
    assert estimate(runs, "l40s", ["h100", "l40s"], 600, found) == 36  # 12 x 3 / 1
    # Never seen: its time limit, as on the slowest type it accepts.
    assert estimate({}, "l40s", ["h100", "l40s"], 600, found) == 600
    assert estimate({}, "h100", ["h100", "l40s"], 600, found) == 200
    assert estimate({}, "h100", ["h100", "l40s"], 0, Settings()) == 3600


def test_a_job_gone_from_the_queue_leaves_its_run_on_the_type_it_ran_on(tmp_path):
    tick = Ticker(tmp_path)
    tick(job("5", state="RUNNING", elapsed=0, nodes=("g2",)), job("6"))
    tick(job("5", state="RUNNING", elapsed=42, nodes=("g2",)), job("6"))
    tick(job("6"))  # 5 ended
    runs = json.loads((tmp_path / "allox.json").read_text())["runs"]
    assert runs == {"alice\x1ftrain": {"l40s": [42]}}


def test_a_job_of_one_type_is_never_moved_but_its_run_is_learned(tmp_path):
    tick = Ticker(tmp_path)
    tick(job("5", features="h100"), job("6", state="RUNNING", features="h100", elapsed=9,
                                          nodes=("g1",)))  # fmt: skip
    tick(job("5", features="h100"))
    assert tick.set == {}
    runs = json.loads((tmp_path / "allox.json").read_text())["runs"]
    assert runs == {"alice\x1ftrain": {"h100": [9]}}


@pytest.mark.security
def test_another_users_runs_of_the_same_name_do_not_change_your_estimate(tmp_path):
    """bob's "train" is 10 s on l40s; alice's has never run: hers is estimated from her
    own time limit alone, and bob's history moves no job of hers."""
    tick = Ticker(tmp_path, {"speed": {"h100": 3.0}})
    tick.history({"bob\x1ftrain": {"l40s": [10], "h100": [9]}})
    notes = tick(job("7", limit=900))
    assert tick.set == {"7": "h100"}
    assert "est. 300 s; l40s 900 s" in notes[0], notes


# --- the tick ------------------------------------------------------------------------------


def test_the_tick_narrows_each_job_to_its_planned_type_and_says_why(tmp_path):
    tick = Ticker(tmp_path)
    tick.history({"alice\x1fa": {"h100": [10], "l40s": [30]},
                  "alice\x1fb": {"h100": [10], "l40s": [12]},
                  "alice\x1fc": {"h100": [5], "l40s": [50]}})  # fmt: skip
    notes = tick(job("1", name="a"), job("2", name="b"), job("3", name="c"))
    assert tick.set == {"1": "h100", "2": "l40s", "3": "h100"}
    assert "allox: job 2 -> l40s (est. 12 s; h100 10 s), 0 s to its device" in notes, notes
    # The next tick, nothing changed: nothing is set again.
    tick.set.clear()
    jobs = [job("1", name="a", features="h100"), job("2", name="b", features="l40s"),
            job("3", name="c", features="h100")]  # fmt: skip
    assert tick(*jobs) == [] and tick.set == {}


def test_jobs_allox_does_not_model_are_left_as_they_are(tmp_path):
    tick = Ticker(tmp_path)
    tick(job("1", gpus=2), job("2", features="h100"), job("3", features="h100&ib"),
         job("4_[1-3]"), job("5", gpus=0.25))  # fmt: skip
    held = job("6")
    held.reason = "JobHeldUser"
    tick(held)
    assert tick.set == {}


def test_a_drained_node_is_no_device(tmp_path):
    nodes = [NODES[0], Node("g2", 8, 1000, 1, ("batch",), features=("l40s",),
                            state="IDLE+DRAIN")]  # fmt: skip
    tick = Ticker(tmp_path, nodes=nodes)
    tick(job("1"), job("2"))
    assert tick.set == {"1": "h100", "2": "h100"}


def test_a_running_job_holds_its_device_until_its_estimate_ends(tmp_path):
    """g1's h100 is held by a job with 550 s left of its 600 s limit: the new job (3x
    faster on h100, 90 s vs 270 s) goes to the free l40s."""
    tick = Ticker(tmp_path, {"speed": {"h100": 3.0}})
    tick.history({"alice\x1ftrain": {"l40s": [270]}})
    other = job("9", user="bob", state="RUNNING", elapsed=50, nodes=("g1",), features="",
                limit=600)  # fmt: skip
    tick(other, job("1"))
    assert tick.set == {"1": "l40s"}


def test_alpha_matches_only_the_least_served_users_and_gives_the_others_back(tmp_path):
    """alice holds a GPU, bob none: with alpha 0.5 only bob's job is matched; alice's,
    narrowed in an earlier tick, gets back what she asked for."""
    nodes = [*NODES, Node("g3", 8, 1000, 1, ("batch",), features=("h100",), state="ALLOCATED")]
    running = job("8", state="RUNNING", elapsed=5, nodes=("g3",), features="")
    unfair = Ticker(tmp_path, nodes=nodes)  # alpha 1: both matched
    unfair(running, job("1"), job("2", user="bob"))
    assert set(unfair.set) == {"1", "2"}
    fair = Ticker(tmp_path, {"alpha": 0.5}, nodes=nodes)
    notes = fair(running, job("1", features=unfair.set["1"]),
                 job("2", user="bob", features=unfair.set["2"]))  # fmt: skip
    assert fair.set["1"] == "h100|l40s" and fair.set.get("2", "h100") != "h100|l40s", fair.set
    assert "allox: job 1 -> h100|l40s as asked" in notes


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("settings", "message"),
    [({"alpha": 0}, "plugin_settings.allox.alpha: expected a number above 0 and at most 1"),
     ({"window": 0}, "plugin_settings.allox.window: expected an integer from 1 to 200"),
     ({"speed": {"h100": -1}}, "plugin_settings.allox.speed: expected a mapping of GPU type"),
     ({"speed": ["h100"]}, "plugin_settings.allox.speed: expected a mapping"),
     ({"samples": True}, "plugin_settings.allox.samples: expected an integer from 1 to 100"),
     ({"alhpa": 1}, "plugin_settings.allox: unknown key(s) alhpa (known: alpha, window")],
)  # fmt: skip
def test_bad_settings_stop_the_tick_naming_the_key(tmp_path, settings, message):
    with pytest.raises(AgentError) as caught:
        Ticker(tmp_path, settings)(job("1"))
    assert message in str(caught.value)


# --- the agent's side ----------------------------------------------------------------------


def narrowing(tmp_path: Path, calls: list, *jobs: QueuedJob) -> Narrowing:
    notes: list[str] = []
    found = Narrowing(list(jobs), tmp_path, 5.0, notes.append)
    found.notes = notes  # type: ignore[attr-defined]
    return found


@pytest.fixture
def scontrol(monkeypatch) -> list[list[str]]:
    calls: list[list[str]] = []
    monkeypatch.setattr(constraints.slurm, "slurm", lambda argv, timeout: calls.append(argv))
    return calls


def test_the_agent_narrows_then_gives_back_what_the_owner_asked_for(tmp_path, scontrol):
    one = job("4", features="a100|h100|l40s")
    assert narrowing(tmp_path, scontrol, one).set_features("4", "h100")
    assert scontrol == [["scontrol", "update", "JobId=4", "Features=h100"]]
    # A later tick: Slurm has "h100"; the original was kept.
    later = narrowing(tmp_path, scontrol, job("4", features="h100"))
    assert later.set_features("4", "a100|l40s")
    assert later.set_features("4", "a100|h100|l40s")
    assert scontrol[-1] == ["scontrol", "update", "JobId=4", "Features=a100|h100|l40s"]


@pytest.mark.security
@pytest.mark.parametrize(
    ("features", "wanted"),
    [("h100|l40s", "a100"), ("h100|l40s", "h100|a100"), ("h100&ib", "h100"),
     ("h100|l40s", "h100&ib"), ("", "h100"), ("[h100|l40s]", "h100"),
     ("h100|l40s", "h100,l40s")],
)  # fmt: skip
def test_the_agent_never_widens_a_constraint_beyond_what_its_owner_asked(
    tmp_path, scontrol, features, wanted
):
    found = narrowing(tmp_path, scontrol, job("4", features=features))
    assert not found.set_features("4", wanted)
    assert scontrol == []
    assert "refused: not within what its owner asked for" in found.notes[0]


@pytest.mark.security
def test_the_agent_changes_no_running_job_and_no_job_it_did_not_read(tmp_path, scontrol):
    found = narrowing(tmp_path, scontrol, job("4", state="RUNNING"))
    assert not found.set_features("4", "h100") and not found.set_features("5", "h100")
    assert scontrol == []


def test_squeue_details_keep_a_constraint_whole_and_a_name_with_spaces():
    out = ("12 alice 10:00 n[2-3] h100|l40s my job | name\n"
           "13 bob UNLIMITED  (null) x\n")  # fmt: skip
    found = queue_ticks.parse_details(out)
    assert found["12"] == ("alice", "my job | name", "h100|l40s", 600, ("n2", "n3"))
    assert found["13"] == ("bob", "x", "", 0, ())


@pytest.mark.security
def test_a_name_holding_a_line_break_forges_no_other_job(monkeypatch):
    """bob names his job "x\\n12 alice 1:00 n9 a100 y": job 12 shows up twice, and a job
    id read twice is not trusted at all."""
    out = "12 alice 10:00 n2 h100|l40s train\n14 bob 1:00  (null) x\n12 alice 1:00 n9 a100 y\n"
    assert "12" not in queue_ticks.parse_details(out)
    jobs = [job("12", features=""), job("14", user="alice", features="", name="")]
    monkeypatch.setattr(queue_ticks.slurm, "slurm", lambda argv, timeout: out)
    queue_ticks.read_details(jobs, AgentConfig())
    assert jobs[0].features == "" and jobs[0].node_names == ()
    assert jobs[1].name == ""  # 14 is bob's, not alice's: nothing read for her


def test_allox_is_a_policy_off_by_default():
    assert Allox.policy and not Allox.default_on
    assert allox.Allox.layers == ("schedule",)
