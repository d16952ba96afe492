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
from tacc_agent.hostlist import expand_hostlist
from tacc_agent.tasks.schedule import constraints, queue_ticks
from tacc_agent.tasks.schedule.constraints import Narrowing
from tacc_contract.errors import AgentError
from tacc_contract.plugins import Node, Queue, QueuedJob
from tacc_plugins import allox, allox_memory
from tacc_plugins.allox import Allox, Device, Settings, estimate, plan
from tacc_plugins.matching import min_cost_assignment


def gpu_node(name: str, kind: str, count: int = 1, state: str = "IDLE") -> Node:
    return Node(
        name, 8, 1000, count, ("batch",), features=(kind,), state=state, gpu_kinds=((kind, count),)
    )


NODES = [gpu_node("g1", "h100"), gpu_node("g2", "l40s")]


def job(
    job_id: str,
    user: str = "alice",
    state: str = "PENDING",
    name: str = "train",
    features: str = "h100|l40s",
    elapsed: int = 0,
    nodes: tuple[str, ...] = (),
    gpus: float = 1,
    limit: int = 600,
) -> QueuedJob:
    return QueuedJob(
        job_id,
        user,
        state,
        0,
        gpus,
        elapsed,
        name=name,
        features=features,
        node_names=nodes,
        time_limit_seconds=limit,
        details=True,
    )


class Ticker:
    """Ticks the plug-in as the agent would, recording the constraints it set."""

    def __init__(
        self, state_dir: Path, settings: dict | None = None, nodes: list[Node] | None = None
    ) -> None:
        self.config = AgentConfig(plugin_settings={"allox": settings or {}})
        self.state_dir = state_dir
        self.nodes = NODES if nodes is None else nodes
        self.set: dict[str, str] = {}

    def __call__(
        self, *jobs: QueuedJob, now: float = 0.0, ended: dict[str, tuple[str, int]] | None = None
    ) -> list[str]:
        def set_features(job_id: str, features: str) -> bool:
            self.set[job_id] = features
            next(j for j in jobs if j.job_id == job_id).features = features
            return True

        queue = Queue(
            list(jobs),
            lambda *_: None,
            now,
            self.state_dir,
            self.config,
            set_features=set_features,
            cluster_nodes=lambda: self.nodes,
            ended=ended or {},
        )
        Allox().tick(queue)
        return queue.notes

    def history(self, runs: dict[str, dict[str, list[float]]]) -> None:
        """Runs already learned: {"alice\\x1ftrain": {"h100": [10], ...}}."""
        kept = {key: {"types": types, "at": 0} for key, types in runs.items()}
        (self.state_dir / "allox.json").write_text(json.dumps({"runs": kept}))

    def runs(self) -> dict:
        found = json.loads((self.state_dir / "allox.json").read_text())["runs"]
        return {key: entry["types"] for key, entry in found.items()}


# --- the matching --------------------------------------------------------------------------


def test_the_assignment_is_the_least_cost_one_of_every_permutation():
    rng = random.Random(7)  # noqa: S311  (test data, not a secret)
    for _ in range(200):
        rows = rng.randint(1, 4)
        columns = rng.randint(rows, 6)
        cost = [
            [rng.choice([rng.randint(0, 40), rng.random() * 9]) for _ in range(columns)]
            for _ in range(rows)
        ]
        given = min_cost_assignment(cost)
        assert len(set(given)) == rows
        best = min(
            sum(cost[r][c[r]] for r in range(rows))
            for c in itertools.permutations(range(columns), rows)
        )
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
    times = {
        "1": {"h100": 10, "l40s": 30},
        "2": {"h100": 10, "l40s": 12},
        "3": {"h100": 5, "l40s": 50},
    }
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


def test_a_completed_job_leaves_slurms_run_time_on_the_type_it_ran_on(tmp_path):
    tick = Ticker(tmp_path)
    tick(job("5", state="RUNNING", elapsed=0, nodes=("g2",)), job("6"))
    tick(job("6"))  # 5 is out of squeue's view, Slurm says nothing yet: wait
    tick(job("6"), ended={"5": ("COMPLETED", 42)})
    assert tick.runs() == {"alice\x1ftrain": {"l40s": [42]}}


@pytest.mark.security
@pytest.mark.parametrize("final", ["CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL"])
def test_a_run_that_did_not_complete_teaches_nothing(tmp_path, final):
    """A user cancelling 1 s runs would make her job look short and win the fast type."""
    tick = Ticker(tmp_path)
    tick(job("5", state="RUNNING", nodes=("g1",)))
    tick(ended={"5": (final, 1)})
    assert tick.runs() == {}


def test_a_job_of_one_type_is_never_moved_but_its_run_is_learned(tmp_path):
    tick = Ticker(tmp_path)
    tick(
        job("5", features="h100"),
        job("6", state="RUNNING", features="h100", elapsed=9, nodes=("g1",)),
    )
    tick(job("5", features="h100"), ended={"6": ("COMPLETED", 9)})
    assert tick.set == {}
    assert tick.runs() == {"alice\x1ftrain": {"h100": [9]}}


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
    tick.history(
        {
            "alice\x1fa": {"h100": [10], "l40s": [30]},
            "alice\x1fb": {"h100": [10], "l40s": [12]},
            "alice\x1fc": {"h100": [5], "l40s": [50]},
        }
    )
    notes = tick(job("1", name="a"), job("2", name="b"), job("3", name="c"))
    assert tick.set == {"1": "h100", "2": "l40s", "3": "h100"}
    assert "allox: job 2 -> l40s (est. 12 s; h100 10 s), 0 s to its device" in notes, notes
    # The next tick, nothing changed: nothing is set again.
    tick.set.clear()
    jobs = [
        job("1", name="a", features="h100"),
        job("2", name="b", features="l40s"),
        job("3", name="c", features="h100"),
    ]
    assert tick(*jobs) == [] and tick.set == {}


def test_jobs_allox_does_not_model_are_left_as_they_are(tmp_path):
    tick = Ticker(tmp_path)
    tick(
        job("1", gpus=2),
        job("2", features="h100"),
        job("3", features="h100&ib"),
        job("4_[1-3]"),
        job("5", gpus=0.25),
    )
    held = job("6")
    held.reason = "JobHeldUser"
    tick(held)
    assert tick.set == {}


def test_a_drained_node_is_no_device(tmp_path):
    nodes = [NODES[0], Node("g2", 8, 1000, 1, ("batch",), features=("l40s",), state="IDLE+DRAIN")]
    tick = Ticker(tmp_path, nodes=nodes)
    tick(job("1"), job("2"))
    assert tick.set == {"1": "h100", "2": "h100"}


def test_a_running_job_holds_its_device_until_its_estimate_ends(tmp_path):
    """g1's h100 is held by a job with 550 s left of its 600 s limit: the new job (3x
    faster on h100, 90 s vs 270 s) goes to the free l40s."""
    tick = Ticker(tmp_path, {"speed": {"h100": 3.0}})
    tick.history({"alice\x1ftrain": {"l40s": [270]}})
    other = job("9", user="bob", state="RUNNING", elapsed=50, nodes=("g1",), features="", limit=600)
    tick(other, job("1"))
    assert tick.set == {"1": "l40s"}


def test_alpha_matches_only_the_least_served_users_and_leaves_the_others_as_they_are(
    tmp_path,
):
    """alice holds a GPU, bob none: with alpha 0.5 only bob's job is matched; alice's
    keeps its constraint (AlloX leaves the others for a later round)."""
    nodes = [*NODES, gpu_node("g3", "h100", state="ALLOCATED")]
    running = job("8", state="RUNNING", elapsed=5, nodes=("g3",), features="")
    fair = Ticker(tmp_path, {"alpha": 0.5}, nodes=nodes)
    fair(running, job("1"), job("2", user="bob"))
    assert set(fair.set) == {"2"}, fair.set
    everyone = Ticker(tmp_path / "all", nodes=nodes)  # alpha 1: both
    everyone(running, job("1"), job("2", user="bob"))
    assert set(everyone.set) == {"1", "2"}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"alpha": 0}, "plugin_settings.allox.alpha: expected a number above 0 and at most 1"),
        ({"window": 0}, "plugin_settings.allox.window: expected an integer from 1 to 100"),
        ({"speed": {"h100": -1}}, "plugin_settings.allox.speed: expected a mapping of GPU type"),
        ({"speed": ["h100"]}, "plugin_settings.allox.speed: expected a mapping"),
        ({"samples": True}, "plugin_settings.allox.samples: expected an integer from 1 to 100"),
        ({"alhpa": 1}, "plugin_settings.allox: unknown key(s) alhpa (known: alpha, window"),
    ],
)
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
    monkeypatch.setattr(constraints.slurm.run, "output", lambda argv, timeout: calls.append(argv))
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
    [
        ("h100|l40s", "a100"),
        ("h100|l40s", "h100|a100"),
        ("h100&ib", "h100"),
        ("h100|l40s", "h100&ib"),
        ("", "h100"),
        ("[h100|l40s]", "h100"),
        ("h100|l40s", "h100,l40s"),
    ],
)
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


@pytest.mark.security
def test_a_name_holding_line_breaks_forges_no_job_and_breaks_no_tick(monkeypatch):
    """bob names his job "x\n9 alice x-1 n[0-99999]x[0-99999] a b\n\xff": on the old
    reading a line of its own (a job of alice's, a time that raised, 10^10 node names, a
    byte that is no UTF-8). Each record starts with a word chosen for that read, so the
    lines of a name stay its own."""
    forged = "9 alice x-1 n[0-99999]x[0-99999] N/A N/A a b"
    calls: list[list[str]] = []

    def squeue(argv, timeout, env=None):
        calls.append(argv)
        start = argv[-1].split()[0]
        return (
            f"{start} 14 bob 1:00  N/A N/A (null) x\n{forged}\n\ufffd\n"
            f"{start} 9 alice 10:00  N/A N/A h100|l40s train\n"
        )

    monkeypatch.setattr(queue_ticks.slurm.run, "output", squeue)
    jobs = [job("9", features=""), job("14", user="bob", features="", name="")]
    queue_ticks.read_details(jobs, AgentConfig())
    assert (jobs[0].features, jobs[0].time_limit_seconds) == ("h100|l40s", 600)
    assert jobs[1].name == f"x\n{forged}\n\ufffd" and jobs[1].node_names == ()
    assert len(calls[0][-1].split()[0]) == 16  # a fresh word for each read


@pytest.mark.security
def test_a_node_list_of_more_names_than_any_cluster_names_nobody():
    assert expand_hostlist("n[0-99999]x[0-99999]") == []
    assert len(expand_hostlist("n[1-4]x[1-2]")) == 8


def test_allox_is_a_policy_off_by_default():
    assert Allox.policy and not Allox.default_on
    assert allox.Allox.layers == ("schedule",)


# --- review cases: what a tick must not believe --------------------------------------------


def test_another_users_constraint_hides_no_gpu_the_node_has(tmp_path):
    """g1 has h100s and an `ib` feature; bob asks `ib|l40s`. The h100 is still an h100
    (typed Gres), so alice's job, 3x faster there, goes to it."""
    nodes = [
        Node(
            "g1",
            8,
            1000,
            1,
            ("batch",),
            features=("h100", "ib"),
            state="IDLE",
            gpu_kinds=(("h100", 1),),
        ),
        gpu_node("g2", "l40s"),
    ]
    tick = Ticker(tmp_path, {"speed": {"h100": 3.0}}, nodes=nodes)
    tick(job("1"), job("2", user="bob", features="ib|l40s"))
    assert tick.set["1"] == "h100"


def test_a_job_past_its_estimate_holds_its_device_for_what_is_left_of_its_limit():
    state = {
        "seen": {"9": ["bob\x1fx", "h100"]},
        "asked": {},
        "runs": {"bob\x1fx": {"types": {"h100": [5]}, "at": 0}},
    }
    late = job("9", user="bob", state="RUNNING", elapsed=7200, limit=86400, nodes=("g1",))
    assert allox_memory.remaining_of(late, state, Settings()) == 86400 - 7200


def test_a_requeued_job_out_of_squeues_view_for_a_tick_keeps_what_its_owner_asked(tmp_path):
    tick = Ticker(tmp_path, nodes=[gpu_node("g1", "h100"), gpu_node("g2", "l40s", state="DOWN")])
    first = job("1")
    tick(first, now=0)
    assert tick.set == {"1": "h100"}
    tick(now=10)  # requeued: REQUEUE_HOLD is neither PENDING nor RUNNING to squeue
    back = job("1", features="h100")
    tick.nodes = NODES
    tick(back, job("2", features="h100|l40s"), now=20)
    state = json.loads((tmp_path / "allox.json").read_text())
    assert state["asked"]["1"]["types"] == ["h100", "l40s"]


def test_an_owners_own_change_of_the_constraint_is_the_new_ask(tmp_path):
    tick = Ticker(tmp_path)
    tick(job("1"))
    assert tick.set == {"1": "h100"}
    tick.set.clear()
    tick(job("1", features="l40s"))  # alice: scontrol update JobId=1 Features=l40s
    assert tick.set == {}
    state = json.loads((tmp_path / "allox.json").read_text())
    assert state["asked"]["1"]["types"] == ["l40s"]


@pytest.mark.security
def test_one_user_with_many_job_names_forgets_only_her_own(monkeypatch):
    monkeypatch.setattr(allox_memory, "MAX_KEYS_PER_USER", 3)
    runs: dict = {}
    allox_memory.add_run(runs, "bob\x1fkeep", "h100", 10, 5, now=0)
    for at in range(1, 10):
        allox_memory.add_run(runs, f"mallory\x1fn{at}", "h100", 1, 5, now=at)
    assert "bob\x1fkeep" in runs
    assert sorted(k for k in runs if k.startswith("mallory")) == [
        "mallory\x1fn7",
        "mallory\x1fn8",
        "mallory\x1fn9",
    ]


def test_devices_are_the_earliest_free_and_only_as_many_as_jobs():
    nodes = [gpu_node("g1", "h100", count=8), gpu_node("g2", "l40s", count=8)]
    busy = job("9", state="RUNNING", nodes=("g1",), gpus=1, features="")
    found = allox.devices(nodes, [busy], ["h100", "l40s"], {"9": 50.0}, {}, wanted=2)
    assert [(d.kind, d.free_in) for d in found] == [
        ("h100", 0.0),
        ("h100", 0.0),
        ("l40s", 0.0),
        ("l40s", 0.0),
    ]


@pytest.mark.security
def test_a_damaged_state_file_is_dropped_entry_by_entry_never_the_tick(tmp_path):
    (tmp_path / "allox.json").write_text(
        json.dumps(
            {
                "asked": {
                    "1": {"types": "h100"},
                    "2": {"types": ["h100", "l40s"], "set": None, "at": 0},
                },
                "seen": {"3": ["x"]},
                "runs": {"k": {"types": {"h100": ["x"]}, "at": 0}},
            }
        )
    )
    Ticker(tmp_path)(job("4"))
    state = json.loads((tmp_path / "allox.json").read_text())
    assert set(state["asked"]) == {"2", "4"} and state["seen"] == {} and state["runs"] == {}


@pytest.mark.security
def test_the_agent_takes_an_owners_own_change_as_the_new_original(tmp_path, scontrol):
    narrowing(tmp_path, scontrol, job("4", features="a100|h100|l40s")).set_features("4", "h100")
    # alice: scontrol update JobId=4 Features=l40s (her own pending job)
    later = narrowing(tmp_path, scontrol, job("4", features="l40s"))
    assert not later.set_features("4", "h100")
    assert "not within what its owner asked for (l40s)" in later.notes[0]


def test_the_agent_keeps_the_original_of_a_job_out_of_view_for_a_moment(tmp_path, scontrol):
    narrowing(tmp_path, scontrol, job("4", features="a100|h100")).set_features("4", "h100")
    # A tick without job 4 (requeued) that narrows another: the file is written again.
    other = Narrowing([job("5", features="a100|h100")], tmp_path, 5.0, print, now=60)
    assert other.set_features("5", "a100")
    back = Narrowing([job("4", features="h100")], tmp_path, 5.0, print, now=120)
    assert back.set_features("4", "a100|h100")
