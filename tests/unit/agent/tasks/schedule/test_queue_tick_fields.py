"""The running jobs' opt-ins the queue tick hands the plug-ins, read from one scontrol
call (tacc_agent/tasks/schedule/queue_ticks.py); its squeue columns (partition, pending
reason) are read by tacc_agent/slurm/queue.py (tests/unit/agent/slurm/test_queue.py)."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.schedule import preempt, queue_ticks
from tacc_contract.plugins import Queue

# squeue --noheader --array --states=PENDING,RUNNING <slurm.queue.QUEUE_FORMAT> as
# Slurm 22.05 prints it: every field whole and ended by "|"; a running job's Reason is
# "None"; a job with a state description shows it there (free text, here with a "|").
SQUEUE = (
    "41|alice|RUNNING|0|2|8|cpu=16,mem=64G,node=2,billing=16,gres/gpu=8|N/A|gres:gpu:4|N/A|"
    "1:02:03|gpu|None|\n"
    "42|bob|PENDING|0|1|1|cpu=1,mem=4G,node=1,billing=1|N/A|gres:gpu:1|N/A|0:00|gpu|"
    "Resources|\n"
    "43_2|carol|PENDING|0|1|1|cpu=1,node=1,billing=1|N/A|N/A|N/A|0:00|cpu|Priority|\n"
    "44|dave|PENDING|0|1|1|cpu=1,node=1,billing=1|N/A|N/A|N/A|0:00|cpu,gpu|"
    "launch failed requeued held | by admin|\n"
)


class Ticker:
    """A plug-in's tick that keeps what it saw and requeues every opted-in job."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, frozenset[str]]] = []
        self.answers: list[bool] = []

    def tick(self, queue: Queue) -> None:
        self.seen = [(job.job_id, job.opted_in) for job in queue.jobs]
        for job in queue.jobs:
            if "preemptible" in job.opted_in:
                self.answers.append(queue.requeue(job.job_id, "preempted by test"))


@pytest.fixture
def ticking(monkeypatch):
    plugin = Ticker()
    shown: list[str] = []
    requeued: list[tuple[str, str]] = []
    monkeypatch.setattr(queue_ticks, "select", lambda words, policy_from: [plugin])
    monkeypatch.setattr(queue_ticks, "in_layer", lambda plugins, layer: plugins)
    monkeypatch.setattr(slurm.run, "output", lambda argv, timeout=0, check=True, env=None: SQUEUE)

    def show(kind, name="", timeout=0, skip=frozenset()):
        shown.append(name)
        return [
            {
                "JobId": "41",
                "UserId": "alice(1001)",
                "JobState": "RUNNING",
                "WorkDir": "/shared/tcloud/alice/jobs/abc-1",
            }
        ]

    def requeue(job_id, reason, config, note):
        requeued.append((job_id, reason))
        note(f"requeued {job_id}")
        return True

    monkeypatch.setattr(slurm.oneliner, "show", show)
    opted = {"plugin_data": {"tiresias": {"opt_in": ["preemptible"]}}}
    monkeypatch.setattr(preempt, "read_submit_record", lambda job: opted)
    monkeypatch.setattr(preempt, "requeue", requeue)
    return plugin, shown, requeued


def test_the_tick_gives_running_jobs_their_opt_ins_from_one_scontrol_call(ticking, tmp_path):
    plugin, shown, requeued = ticking
    notes = queue_ticks.tick(AgentConfig(state_dir=str(tmp_path)))
    assert shown == [""]  # one `scontrol show job` for every job, not one per job
    assert plugin.seen == [
        ("41", frozenset({"preemptible"})),
        ("42", frozenset()),
        ("43_2", frozenset()),
        ("44", frozenset()),
    ]
    assert requeued == [("41", "preempted by test")] and plugin.answers == [True]
    assert notes == ["requeued 41"]


@pytest.mark.fault
def test_a_slurm_that_cannot_show_jobs_leaves_no_opt_in_and_the_tick_goes_on(
    ticking, monkeypatch, tmp_path
):
    plugin, _, requeued = ticking

    def broken(kind, name="", timeout=0, skip=frozenset()):
        raise AgentError("scontrol did not answer within 15 s")

    monkeypatch.setattr(slurm.oneliner, "show", broken)
    notes = queue_ticks.tick(AgentConfig(state_dir=str(tmp_path)))
    assert all(opted == frozenset() for _, opted in plugin.seen) and requeued == []
    assert notes == ["agent: no job opt-ins this tick: scontrol did not answer within 15 s"]


def test_the_daemon_reads_a_running_jobs_record_once_not_at_every_tick(
    ticking, monkeypatch, tmp_path
):
    plugin, _, _ = ticking
    reads: list[str] = []
    answers = [{}, {"plugin_data": {"tiresias": {"opt_in": ["preemptible"]}}}]

    def read(job):
        reads.append(job.job_id)
        return answers[min(len(reads) - 1, 1)]  # the first read fails (NFS): read again

    monkeypatch.setattr(preempt, "read_submit_record", read)
    clock = [1000.0]
    monkeypatch.setattr(queue_ticks.time, "time", lambda: clock[0])
    allowed: queue_ticks.Allowed = {}
    config = AgentConfig(state_dir=str(tmp_path))
    queue_ticks.tick(config, allowed)
    clock[0] += 30  # within EMPTY_REREAD_SECONDS: an empty record is not read again yet
    queue_ticks.tick(config, allowed)
    assert reads == ["41"] and plugin.seen[0] == ("41", frozenset())
    for _ in range(3):
        clock[0] += queue_ticks.EMPTY_REREAD_SECONDS
        queue_ticks.tick(config, allowed)
    assert reads == ["41", "41"]  # read again once, then kept: it allowed something
    assert plugin.seen[-4] == ("41", frozenset({"preemptible"}))
    assert list(allowed) == [("41", 1001, "/shared/tcloud/alice/jobs/abc-1")]


class Broken:
    name = "broken"

    def tick(self, queue: Queue) -> None:
        raise KeyError("a bug of its own")


@pytest.mark.fault
def test_a_plugin_whose_tick_fails_is_a_note_and_the_others_still_run(
    ticking, monkeypatch, tmp_path
):
    plugin, _, requeued = ticking
    plugin.name = "test"
    monkeypatch.setattr(queue_ticks, "select", lambda words, policy_from: [Broken(), plugin])
    notes = queue_ticks.tick(AgentConfig(state_dir=str(tmp_path)))
    assert notes[0] == "broken: tick failed: KeyError: 'a bug of its own'"
    assert requeued == [("41", "preempted by test")]


def test_one_tick_at_a_time(ticking, tmp_path):
    """The daemon's tick and one run by hand take the same lock in the state directory."""
    held = os.open(tmp_path / queue_ticks.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (queue_ticks.tick(AgentConfig(state_dir=str(tmp_path))), done.set()),
        daemon=True,
    )
    thread.start()
    assert not done.wait(0.5)  # waits for the lock
    os.close(held)
    assert done.wait(10)


def test_the_controllers_ticks_share_cluster_state_dir_and_its_lock(ticking, tmp_path):
    """With a backup controller the ticks' records and lock are in cluster_state_dir (on
    storage both controllers mount), not in either daemon's own state_dir."""
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    config = AgentConfig(state_dir=str(own), cluster_state_dir=str(shared))
    queue_ticks.tick(config)
    assert (shared / queue_ticks.LOCK_FILE).exists() and not own.exists()


@pytest.mark.fault
def test_a_missing_cluster_state_dir_is_an_error_not_a_local_stand_in(ticking, tmp_path):
    """Storage not mounted: the tick refuses instead of keeping records on local disk the
    other controller would never see."""
    config = AgentConfig(state_dir=str(tmp_path), cluster_state_dir=str(tmp_path / "absent"))
    with pytest.raises(AgentError, match=r"cluster_state_dir .*absent is missing"):
        queue_ticks.tick(config)
    assert not (tmp_path / "absent").exists()
