"""The elastic plug-in's resizing of running jobs (issue [16]): grown while nodes of its
partition idle and nothing waits, shrunk while jobs wait for nodes, within the task's
range, after a stretch of each, with a cooldown, through Queue.resize."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_contract.errors import AgentError
from tacc_contract.plugins import Node, Queue, QueuedJob
from tacc_plugins.elastic import Elastic

SETTINGS = {
    "resize": True,
    "grow_after_seconds": 10,
    "shrink_after_seconds": 10,
    "min_run_seconds": 20,
    "cooldown_seconds": 60,
}
RESIZE = frozenset({"resize"})


def node(name: str, state: str = "ALLOCATED") -> Node:
    return Node(name, 4, 1000, 0, ("batch",), state=state)


def job(
    job_id: str,
    state: str = "RUNNING",
    nodes: int = 1,
    elapsed: int = 100,
    node_range: tuple[int, int] | None = (1, 3),
    opted_in: frozenset[str] = RESIZE,
    reason: str = "",
) -> QueuedJob:
    return QueuedJob(
        job_id,
        "alice",
        state,
        0,
        0,
        elapsed,
        nodes,
        "batch",
        reason if state == "PENDING" else "",
        opted_in,
        node_range=node_range,
    )


class Ticker:
    def __init__(self, state_dir: Path, settings: dict | None = None, answer: bool = True) -> None:
        self.config = AgentConfig(
            plugin_settings={"elastic": SETTINGS if settings is None else settings}
        )
        self.state_dir = state_dir
        self.resized: list[tuple[str, int, str]] = []
        self.answer = answer

    def resize(self, job_id: str, nodes: int, reason: str) -> bool:
        self.resized.append((job_id, nodes, reason))
        return self.answer

    def __call__(self, now: float, nodes: list[Node], *jobs: QueuedJob) -> list[str]:
        queue = Queue(
            list(jobs),
            lambda *_: None,
            now,
            self.state_dir,
            self.config,
            resize=self.resize,
            cluster_nodes=lambda: nodes,
        )
        Elastic().tick(queue)
        return queue.notes


IDLE_ONE = [node("n1"), node("n2", "IDLE"), node("n3", "IDLE")]


def test_a_job_grows_once_nodes_have_idled_for_grow_after_seconds(tmp_path):
    tick = Ticker(tmp_path)
    assert tick(0, IDLE_ONE, job("7")) == [] and tick.resized == []  # idle for 0 s
    notes = tick(10, IDLE_ONE, job("7"))
    assert tick.resized == [("7", 3, "resized by elastic: grow 1 -> 3 nodes (2 idle for 10 s)")]
    assert notes == ["elastic: job 7 grow 1 -> 3 nodes (2 idle for 10 s)"]


def test_a_job_never_grows_past_its_maximum(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, IDLE_ONE, job("7", node_range=(1, 2)))
    tick(10, IDLE_ONE, job("7", node_range=(1, 2)))
    assert tick.resized[0][1] == 2
    tick.resized.clear()
    tick(100, IDLE_ONE, job("8", nodes=2, node_range=(1, 2)))
    tick(110, IDLE_ONE, job("8", nodes=2, node_range=(1, 2)))
    assert tick.resized == []


def test_a_job_shrinks_for_one_that_waits_but_never_below_its_minimum(tmp_path):
    busy = [node("n1"), node("n2"), node("n3")]
    waiting = job(
        "9", state="PENDING", nodes=2, opted_in=frozenset(), node_range=None, reason="Resources"
    )
    tick = Ticker(tmp_path)
    tick(0, busy, job("7", nodes=3), waiting)
    tick(10, busy, job("7", nodes=3), waiting)
    assert tick.resized == [("7", 1, "resized by elastic: shrink 3 -> 1 nodes (job 9 waits 10 s)")]
    one = job(
        "9", state="PENDING", nodes=1, opted_in=frozenset(), node_range=None, reason="Resources"
    )
    tick2 = Ticker(tmp_path / "b")
    tick2(0, busy, job("7", nodes=3, node_range=(2, 3)), one)
    tick2(10, busy, job("7", nodes=3, node_range=(2, 3)), one)
    assert tick2.resized[0][1] == 2
    # 2 nodes lacking, 1 above the minimum: shrinking could not make it fit.
    tick3 = Ticker(tmp_path / "c")
    tick3(0, busy, job("7", nodes=3, node_range=(2, 3)), waiting)
    tick3(10, busy, job("7", nodes=3, node_range=(2, 3)), waiting)
    assert tick3.resized == []


@pytest.mark.security
def test_only_a_job_pending_for_nodes_shrinks_another(tmp_path):
    """A job held, on a dependency, or over its own QOS limit (any user can make one)
    waits for nothing a shrink could give: no job is shrunk for it."""
    busy = [node("n1"), node("n2"), node("n3")]
    tick = Ticker(tmp_path)
    for reason in (
        "JobHeldUser",
        "Dependency",
        "BeginTime",
        "QOSMaxJobsPerUserLimit",
        "AssocGrpNodeLimit",
        "ReqNodeNotAvail",
        "PartitionTimeLimit",
    ):
        pending = job("9", state="PENDING", opted_in=frozenset(), reason=reason)
        tick(0, busy, job("7", nodes=3), pending)
        tick(50, busy, job("7", nodes=3), pending)
    assert tick.resized == []


@pytest.mark.parametrize(
    "running",
    [
        job("7", opted_in=frozenset()),  # its task did not say resize
        job("7", node_range=None),  # no range read
        job("7", elapsed=5),  # started 5 s ago (min_run_seconds 20)
        job("7", state="PENDING"),
    ],
)
def test_jobs_that_may_not_be_resized_now_are_left_alone(tmp_path, running):
    tick = Ticker(tmp_path)
    tick(0, IDLE_ONE, running)
    tick(30, IDLE_ONE, running)
    assert tick.resized == []


def test_a_resized_job_waits_out_its_cooldown(tmp_path):
    tick = Ticker(tmp_path, answer=False)  # a failed resize counts too: no retry storm
    tick(0, IDLE_ONE, job("7"))
    tick(10, IDLE_ONE, job("7"))
    tick(40, IDLE_ONE, job("7"))
    assert len(tick.resized) == 1
    tick(71, IDLE_ONE, job("7"))
    assert len(tick.resized) == 2


def test_resizing_is_off_unless_ops_turn_it_on(tmp_path):
    tick = Ticker(tmp_path, settings={})
    tick(0, IDLE_ONE, job("7"))
    tick(100, IDLE_ONE, job("7"))
    assert tick.resized == [] and not (tmp_path / "elastic.json").exists()


def test_a_drained_idle_node_is_not_idle(tmp_path):
    tick = Ticker(tmp_path)
    drained = [node("n1"), node("n2", "IDLE+DRAIN"), node("n3", "IDLE+DRAIN")]
    tick(0, drained, job("7"))
    tick(20, drained, job("7"))
    assert tick.resized == []


def test_a_gap_between_ticks_starts_the_stretch_again(tmp_path):
    tick = Ticker(tmp_path)
    tick(0, IDLE_ONE, job("7"))
    tick(1000, IDLE_ONE, job("7"))  # the daemon was down: idle for 0 s, not 1000
    assert tick.resized == []
    state = json.loads((tmp_path / "elastic.json").read_text())
    assert state["since"] == {"idle:batch": 1000}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"resize": "yes"}, "plugin_settings.elastic.resize: expected true or false"),
        (
            {"resize": True, "grow_after_seconds": -1},
            "plugin_settings.elastic.grow_after_seconds: expected a number of seconds >= 0",
        ),
        ({"resize": True, "shrink": 1}, "plugin_settings.elastic: unknown key(s) shrink"),
    ],
)
def test_bad_settings_stop_the_tick_naming_the_key(tmp_path, settings, message):
    with pytest.raises(AgentError) as caught:
        Ticker(tmp_path, settings)(0, IDLE_ONE, job("7"))
    assert message in str(caught.value)


def test_no_shrink_when_the_idle_nodes_would_do(tmp_path):
    """The waiting job needs one node and one idles: it waits for something else."""
    waiting = job(
        "9", state="PENDING", nodes=1, opted_in=frozenset(), node_range=None, reason="Resources"
    )
    tick = Ticker(tmp_path)
    tick(0, IDLE_ONE[:2], job("7", nodes=3), waiting)
    tick(20, IDLE_ONE[:2], job("7", nodes=3), waiting)
    assert tick.resized == []


def test_a_resize_in_flight_holds_its_nodes_until_the_job_runs_again(tmp_path):
    """7 grows 1 -> 3 onto the idle nodes. While it waits out its requeue (BeginTime), the
    nodes it left idle are not given to 8; once it runs, the stretches start again."""
    tick = Ticker(tmp_path)
    eight = job("8", elapsed=100)
    tick(0, IDLE_ONE, job("7"), eight)
    tick(10, IDLE_ONE, job("7"), eight)
    assert [r[:2] for r in tick.resized] == [("7", 3)]
    all_idle = [node("n1", "IDLE"), node("n2", "IDLE"), node("n3", "IDLE")]
    requeued = job("7", state="PENDING", nodes=3, reason="BeginTime")
    for now in (12, 30, 60):
        tick(now, all_idle, requeued, eight)
    assert len(tick.resized) == 1
    state = json.loads((tmp_path / "elastic.json").read_text())
    assert state["in_flight"]["7"] == {"partition": "batch", "size": 3, "old": 1, "at": 10}
    tick(70, [node("n1"), node("n2"), node("n3")], job("7", nodes=3, elapsed=5), eight)
    assert json.loads((tmp_path / "elastic.json").read_text())["in_flight"] == {}


def test_a_resized_job_that_never_gets_its_nodes_goes_back_to_its_old_size(tmp_path):
    tick = Ticker(tmp_path, {**SETTINGS, "revert_after_seconds": 60})
    tick(0, IDLE_ONE, job("7"))
    tick(10, IDLE_ONE, job("7"))
    taken = [node("n1"), node("n2"), node("n3", "IDLE")]  # someone took n2
    stuck = job("7", state="PENDING", nodes=3, reason="Resources")
    tick(40, taken, stuck)
    assert len(tick.resized) == 1
    notes = tick(71, taken, stuck)
    assert tick.resized[-1] == ("7", 1, "resized by elastic: back to 1 nodes (3 not free in 61 s)")
    assert notes == ["elastic: job 7 back to 1 nodes (3 not free in 61 s)"]


def test_a_job_of_two_partitions_counts_in_the_first_and_ids_compare_as_numbers(tmp_path):
    tick = Ticker(tmp_path)
    nine, ten = job("9"), job("10")
    pending = job("11", state="PENDING", opted_in=frozenset(), node_range=None, reason="Resources")
    pending.partition = "other,batch"  # it waits in "other": shrinks nothing in batch
    tick(0, IDLE_ONE, nine, ten, pending)
    tick(10, IDLE_ONE, nine, ten, pending)
    assert [r[0] for r in tick.resized] == ["9"]  # the older job, by number ("9" < "10")


@pytest.mark.fault
def test_a_damaged_state_file_is_dropped_entry_by_entry(tmp_path):
    (tmp_path / "elastic.json").write_text(
        json.dumps(
            {
                "since": {"idle:batch": "yesterday"},
                "ticked_at": "x",
                "in_flight": {"7": {"partition": "batch"}},
                "resized": {"7": None},
            }
        )
    )
    tick = Ticker(tmp_path)
    tick(0, IDLE_ONE, job("7"))
    tick(10, IDLE_ONE, job("7"))
    assert [r[:2] for r in tick.resized] == [("7", 3)]
