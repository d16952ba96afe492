"""The tiresias plug-in (issue [16]): per-job 2D attained service, discretized queues as
nice values, promotion of starved jobs with Tiresias' reset, and preemption of opted-in
jobs of lower queues (through Queue.requeue)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent.config import AgentConfig, load_config
from tacc_contract.errors import AgentError
from tacc_contract.plugins import Node, Queue, QueuedJob, Submission
from tacc_plugins import tiresias
from tacc_plugins.tiresias import Tiresias

SETTINGS = {"thresholds": [100], "promote_knob": 2, "nice_step": 500, "min_run_seconds": 10}
PREEMPTIBLE = frozenset({"preemptible"})


class Ticker:
    """Ticks the plug-in as the agent would, recording what it did to Slurm."""

    def __init__(
        self,
        state_dir: Path,
        settings: dict | None = None,
        requeue_ok: bool = True,
        nodes: list[Node] | None = None,
    ):
        self.config = AgentConfig(plugin_settings={"tiresias": settings or SETTINGS})
        self.nodes = nodes or []
        self.state_dir = state_dir
        self.nices: dict[str, int] = {}
        self.requeued: list[tuple[str, str]] = []
        self.requeue_ok = requeue_ok

    def requeue(self, job_id: str, reason: str) -> bool:
        self.requeued.append((job_id, reason))
        return self.requeue_ok

    def __call__(self, now: float, *jobs: QueuedJob) -> list[str]:
        queue = Queue(
            list(jobs),
            self.nices.__setitem__,
            now,
            self.state_dir,
            self.config,
            requeue=self.requeue,
            cluster_nodes=lambda: self.nodes,
        )
        Tiresias().tick(queue)
        return queue.notes

    def state(self) -> dict:
        return json.loads((self.state_dir / "tiresias.json").read_text())["jobs"]


def job(
    job_id: str,
    user: str,
    state: str,
    elapsed: int = 0,
    gpus: float = 0,
    nodes: int = 1,
    nice: int = 0,
    reason: str = "",
    opted_in: frozenset[str] = frozenset(),
    partition: str = "batch",
) -> QueuedJob:
    return QueuedJob(
        job_id,
        user,
        state,
        nice,
        gpus,
        elapsed,
        nodes,
        partition,
        reason if state == "PENDING" else "",
        opted_in,
    )


def test_service_is_per_job_so_one_users_short_job_goes_before_her_long_one(tmp_path):
    """Per-user LAS (the las plug-in) cannot tell alice's two jobs apart; per job, her
    long job that ran past the threshold sits in queue 1 and her new one in queue 0."""
    tick = Ticker(tmp_path)
    tick(0, job("1", "alice", "RUNNING", 0, gpus=2))
    notes = tick(60, job("1", "alice", "RUNNING", 60, gpus=2))  # 120 GPU-s > 100
    assert notes == ["tiresias: job 1 of alice demoted to queue 1 (120 GPU-s)"]
    # Requeued (its elapsed time starts again): still queue 1, service kept; the new job
    # of the same user waits in queue 0, with nice_step more priority.
    tick(
        70,
        job("1", "alice", "PENDING", 0, gpus=2, reason="Priority"),
        job("2", "alice", "PENDING", 0, gpus=2, reason="Priority"),
    )
    assert tick.nices == {"2": -500}
    state = tick.state()
    assert state["1"]["queue"] == 1 and state["1"]["attained"] == 120.0
    assert state["2"]["queue"] == 0 and state["2"]["attained"] == 0.0


def test_node_seconds_stand_in_for_gpu_seconds_on_cpu_jobs(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, job("1", "bob", "RUNNING", 0, nodes=2))
    tick(30, job("1", "bob", "RUNNING", 30, nodes=2))
    assert tick.state()["1"]["attained"] == 60.0 and tick.state()["1"]["queue"] == 0
    tick(60, job("1", "bob", "RUNNING", 60, nodes=2))
    assert tick.state()["1"]["queue"] == 1


def test_a_starved_job_is_promoted_and_both_its_figures_start_again(tmp_path):
    """Tiresias' PROMOTEKNOB: waiting knob x its run since it entered queue 0 promotes it
    to queue 0, with its run and wait set back to 0 (it is not demoted at once)."""
    tick = Ticker(tmp_path)
    tick(0, job("1", "alice", "RUNNING", 0, gpus=1))
    tick(150, job("1", "alice", "RUNNING", 150, gpus=1))  # queue 1 after 150 s
    waiting = job("1", "alice", "PENDING", 0, gpus=1, reason="Priority")
    tick(200, waiting)
    # Waiting counts from the last tick that saw it run: 290 s < 2 x 150 s, then 350 s.
    assert tick(440, waiting) == []
    notes = tick(500, waiting)
    said = "promoted to queue 0 (waited 350 s >= 2 x 150 s run)"
    assert notes[0] == f"tiresias: job 1 of alice {said}"
    assert tick.nices["1"] == -500
    state = tick.state()["1"]
    assert (state["queue"], state["executed"], state["waited"], state["total"]) == (0, 0, 0, 150)


def test_a_job_that_never_ran_is_not_promoted_nor_demoted(tmp_path):
    tick = Ticker(tmp_path)
    for now in (0, 1000, 5000):
        tick(now, job("9", "bob", "PENDING", 0, gpus=4, reason="Resources"))
    assert tick.state()["9"]["queue"] == 0 and tick.state()["9"]["waited"] == 0


def test_promotion_off_with_knob_zero(tmp_path):
    tick = Ticker(tmp_path, {**SETTINGS, "promote_knob": 0})
    tick(0, job("1", "alice", "RUNNING", 0, gpus=1))
    tick(150, job("1", "alice", "RUNNING", 150, gpus=1))
    for now in (200, 10000, 100000):
        tick(now, job("1", "alice", "PENDING", 0, gpus=1, reason="Priority"))
    assert tick.state()["1"]["queue"] == 1


def test_the_jobs_own_nice_is_kept_under_the_queue_adjustment(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, job("3", "carol", "PENDING", nice=100, reason="Priority"))
    assert tick.nices == {"3": -400}  # its own 100, queue 0's -500
    tick.nices.clear()
    tick(5, job("3", "carol", "PENDING", nice=-400, reason="Priority"))
    assert tick.nices == {}  # already right: nothing is set twice


def long_job(elapsed: int, opted_in: frozenset[str] = PREEMPTIBLE) -> QueuedJob:
    return job("1", "alice", "RUNNING", elapsed, nodes=2, opted_in=opted_in)


def test_a_preemptible_job_of_a_lower_queue_is_requeued_for_a_waiting_one(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, long_job(0))
    tick(60, long_job(60))  # 120 node-s: queue 1
    short = job("2", "bob", "PENDING", nodes=2, reason="Resources")
    notes = tick(61, long_job(61), short)
    why = "preempted by tiresias: queue 1, for job 2 of queue 0"
    assert tick.requeued == [("1", why)]
    assert f"tiresias: job 1 of alice requeued: {why}" in notes


def test_only_opted_in_jobs_are_preempted(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, long_job(0, frozenset()))
    tick(60, long_job(60, frozenset()))
    tick(61, long_job(61, frozenset()), job("2", "bob", "PENDING", nodes=2, reason="Resources"))
    assert tick.requeued == []


@pytest.mark.parametrize(
    ("waiting", "why"),
    [
        (job("2", "bob", "PENDING", nodes=3, reason="Resources"), "needs more than it holds"),
        (job("2", "bob", "PENDING", nodes=1, reason="Dependency"), "waits for a dependency"),
        (job("2", "bob", "PENDING", nodes=1, reason="JobHeldUser"), "held by its owner"),
        (
            job("2", "bob", "PENDING", nodes=1, reason="Resources", partition="gpu"),
            "another partition",
        ),
    ],
)
def test_no_preemption_that_cannot_start_the_waiting_job(tmp_path, waiting, why):
    tick = Ticker(tmp_path)
    tick(0, long_job(0))
    tick(60, long_job(60))
    tick(61, long_job(61), waiting)
    assert tick.requeued == [], why


def test_a_job_is_not_preempted_before_min_run_seconds_since_its_start(tmp_path):
    """No thrashing: requeued, it starts again at elapsed 0 and is safe for 10 s."""
    tick = Ticker(tmp_path)
    tick(0, long_job(0))
    tick(60, long_job(60))
    tick(61, long_job(61), job("2", "bob", "PENDING", reason="Resources"))
    assert len(tick.requeued) == 1
    tick(90, long_job(5), job("3", "bob", "PENDING", reason="Resources"))
    assert len(tick.requeued) == 1


def test_the_lowest_queue_and_latest_arrival_go_first_and_only_as_many_as_needed(tmp_path):
    tick = Ticker(tmp_path, {**SETTINGS, "thresholds": [100, 1000], "max_preempt_per_tick": 2})
    jobs = [
        job("5", "alice", "RUNNING", 0, opted_in=PREEMPTIBLE),
        job("6", "alice", "RUNNING", 0, opted_in=PREEMPTIBLE),
        job("7", "carol", "RUNNING", 0, opted_in=PREEMPTIBLE),
    ]
    tick(0, *jobs)
    # 5 and 6 run 1500 s (queue 2), 7 runs 150 s (queue 1, started later).
    later = [
        job("5", "alice", "RUNNING", 1500, opted_in=PREEMPTIBLE),
        job("6", "alice", "RUNNING", 1500, opted_in=PREEMPTIBLE),
        job("7", "carol", "RUNNING", 150, opted_in=PREEMPTIBLE),
    ]
    tick(1500, *later)
    tick(1501, *later, job("8", "bob", "PENDING", nodes=2, reason="Resources"))
    assert [j for j, _ in tick.requeued] == ["6", "5"]


def test_a_failed_requeue_is_said_and_the_tick_goes_on(tmp_path):
    tick = Ticker(tmp_path, requeue_ok=False)
    tick(0, long_job(0))
    tick(60, long_job(60))
    notes = tick(61, long_job(61), job("2", "bob", "PENDING", nodes=2, reason="Resources"))
    assert any(n.startswith("tiresias: job 1 of alice not requeued") for n in notes)
    assert (tmp_path / "tiresias.json").exists()


def test_an_idle_node_counts_so_only_as_many_jobs_as_lacking_are_preempted(tmp_path):
    """bob's 2-node job waits; one node idles (held back for it, as Slurm does) and two
    1-node jobs of queue 1 run: one is requeued, not both."""
    nodes = [
        Node("n1", 4, 1000, 0, ("batch",), state="IDLE"),
        Node("n2", 4, 1000, 0, ("batch",), state="ALLOCATED"),
        Node("n3", 4, 1000, 0, ("other",), state="IDLE"),
    ]
    tick = Ticker(tmp_path, {**SETTINGS, "max_preempt_per_tick": 2}, nodes=nodes)
    two = [
        job("5", "alice", "RUNNING", 0, opted_in=PREEMPTIBLE),
        job("6", "alice", "RUNNING", 0, opted_in=PREEMPTIBLE),
    ]
    tick(0, *two)
    later = [
        job("5", "alice", "RUNNING", 200, opted_in=PREEMPTIBLE),
        job("6", "alice", "RUNNING", 200, opted_in=PREEMPTIBLE),
    ]
    tick(200, *later)
    tick(201, *later, job("8", "bob", "PENDING", nodes=2, reason="Resources"))
    assert [j for j, _ in tick.requeued] == ["6"]


@pytest.mark.fault
def test_a_job_whose_requeue_failed_is_not_tried_again_at_every_tick(tmp_path):
    tick = Ticker(tmp_path, requeue_ok=False)
    tick(0, long_job(0))
    tick(60, long_job(60))
    waiting = job("2", "bob", "PENDING", nodes=2, reason="Resources")
    for now in (61, 63, 65, 150):
        tick(now, long_job(now), waiting)
    assert len(tick.requeued) == 1  # 120 s before the next try
    tick(181, long_job(181), waiting)
    assert len(tick.requeued) == 2


def test_preempt_false_only_orders(tmp_path):
    tick = Ticker(tmp_path, {**SETTINGS, "preempt": False})
    tick(0, long_job(0))
    tick(60, long_job(60))
    tick(61, long_job(61), job("2", "bob", "PENDING", nodes=2, reason="Resources"))
    assert tick.requeued == [] and tick.nices == {"2": -500}


@pytest.mark.security
def test_one_users_jobs_never_change_anothers_service(tmp_path):
    """Service is per job id from Slurm's queue: alice's many jobs leave bob's at 0."""
    tick = Ticker(tmp_path)
    alice = [job(str(i), "alice", "RUNNING", 0, gpus=8) for i in range(1, 6)]
    tick(0, *alice, job("9", "bob", "PENDING", gpus=1, reason="Resources"))
    later = [job(str(i), "alice", "RUNNING", 500, gpus=8) for i in range(1, 6)]
    tick(500, *later, job("9", "bob", "PENDING", gpus=1, reason="Resources"))
    assert tick.state()["9"]["attained"] == 0 and tick.state()["9"]["queue"] == 0


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"thresholds": []}, "plugin_settings.tiresias.thresholds: expected a list of GPU-seconds"),
        ({"thresholds": [0]}, "plugin_settings.tiresias.thresholds: expected a list"),
        ({"promote_knob": -1}, "plugin_settings.tiresias.promote_knob: expected a number >= 0"),
        ({"nice_step": "big"}, "plugin_settings.tiresias.nice_step: expected an integer"),
        ({"preempt": "yes"}, "plugin_settings.tiresias.preempt: expected true or false"),
        ({"max_preempt_per_tick": 1.5}, "plugin_settings.tiresias.max_preempt_per_tick"),
        ({"thresold": [10]}, "plugin_settings.tiresias: unknown key(s) thresold"),
    ],
)
def test_bad_settings_name_the_key_and_what_is_expected(tmp_path, settings, message):
    tick = Ticker(tmp_path, settings)
    with pytest.raises(AgentError, match=re.escape(message)):
        tick(0, job("1", "alice", "RUNNING", 0))
    assert not (tmp_path / "tiresias.json").exists()


def test_a_preemptible_task_records_its_opt_in_for_the_tick():
    def submission(preemptible: bool) -> Submission:
        task = SimpleNamespace(resources={"preemptible": preemptible})
        return Submission(task, {}, "batch", ["batch"], [], Path("."), "digest")

    given = submission(True)
    Tiresias().schedule(given)
    assert given.data == {"tiresias": {"opt_in": ["preemptible"]}} and "tiresias" in given.notes
    plain = submission(False)
    Tiresias().schedule(plain)
    assert plain.data == {} and plain.notes == {}


def test_settings_default_to_two_queues():
    found = tiresias.settings_from(AgentConfig())
    assert found.thresholds == (3600.0,) and found.promote_knob == 8.0 and found.preempt


@pytest.mark.bad_input
@pytest.mark.parametrize("value", [["tiresias"], {"tiresias": [1, 2]}, {"tiresias": "on"}])
def test_plugin_settings_of_the_wrong_shape_are_refused_by_the_agent_config(tmp_path, value):
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"plugin_settings": value}))
    with pytest.raises(AgentError, match="plugin_settings: expected a mapping of plug-in name"):
        load_config(path)


def test_plugin_settings_reach_the_plug_in_through_the_agent_config(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(json.dumps({"plugin_settings": {"tiresias": {"promote_knob": 3}}}))
    assert tiresias.settings_from(load_config(path)).promote_knob == 3.0


@pytest.mark.fault
def test_a_job_gone_before_its_nice_is_set_leaves_the_rest_of_the_tick(tmp_path):
    tick = Ticker(tmp_path)

    def set_nice(job_id: str, nice: int) -> None:
        if job_id == "2":
            raise AgentError("scontrol: Invalid job id specified", 2)
        tick.nices[job_id] = nice

    tick.nices = {}
    queue = Queue(
        [
            job("2", "bob", "PENDING", reason="Priority"),
            job("3", "carol", "PENDING", reason="Priority"),
        ],
        set_nice,
        0.0,
        tmp_path,
        tick.config,
        requeue=tick.requeue,
    )
    Tiresias().tick(queue)
    assert tick.nices == {"3": -500}
    assert any(n.startswith("tiresias: job 2: nice not set") for n in queue.notes)
    assert (tmp_path / "tiresias.json").exists()


def test_a_long_gap_between_ticks_counts_as_a_few_minutes_of_waiting(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, job("1", "alice", "RUNNING", 0, gpus=1))
    tick(1000, job("1", "alice", "RUNNING", 1000, gpus=1))  # promoted after 2 x 1000 s
    tick(100000, job("1", "alice", "PENDING", 0, gpus=1, reason="Priority"))  # daemon was down
    assert tick.state()["1"]["waited"] == tiresias.MAX_GAP_SECONDS
    assert tick.state()["1"]["queue"] == 1  # not promoted by the outage


def test_a_job_submitted_to_several_partitions_can_preempt_in_any(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, long_job(0))
    tick(60, long_job(60))
    tick(
        61,
        long_job(61),
        job("2", "bob", "PENDING", nodes=2, reason="Resources", partition="gpu,batch"),
    )
    assert [j for j, _ in tick.requeued] == ["1"]
