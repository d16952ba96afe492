"""The queue tick's squeue columns (partition, pending reason) and the running jobs'
opt-ins it hands the plug-ins (tacc_agent/tasks/schedule/queue_ticks.py)."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.schedule import preempt, queue_ticks
from tacc_contract.plugins import Queue

# squeue --noheader --array --states=PENDING,RUNNING --Format=<queue_ticks.FORMAT> as
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


def test_the_format_asks_for_partition_and_reason_last():
    assert queue_ticks.FORMAT.endswith(",Partition:0|,Reason:0|")


def test_squeue_lines_give_partition_and_pending_reason():
    jobs = queue_ticks.parse_queue(SQUEUE)
    assert [(j.job_id, j.partition, j.reason) for j in jobs] == [
        ("41", "gpu", ""),  # running: Slurm's "None"
        ("42", "gpu", "Resources"),
        ("43_2", "cpu", "Priority"),
        ("44", "cpu,gpu", "launch failed requeued held | by admin"),
    ]
    assert (jobs[0].gpus, jobs[0].elapsed_seconds, jobs[0].nodes) == (8, 3723, 2)
    assert all(job.opted_in == frozenset() for job in jobs)  # parse reads no file


def test_a_line_without_the_later_columns_still_counts():
    """A squeue that prints only the first eleven columns (older fakes, a cut line)."""
    (job,) = queue_ticks.parse_queue("12|alice|RUNNING|0|2|2|N/A|N/A|gres/gpu:4|N/A|1:02:03|\n")
    assert (job.gpus, job.partition, job.reason) == (8, "", "")


@pytest.mark.bad_input
@pytest.mark.parametrize("line", ["", "garbage", "1|a|RUNNING|0|x|1|N/A|N/A|N/A|N/A|0:00|p|r|"])
def test_lines_that_are_not_jobs_are_skipped(line):
    assert queue_ticks.parse_queue(line) == []


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
    monkeypatch.setattr(slurm, "slurm", lambda argv, timeout=0, check=True, env=None: SQUEUE)

    def show(kind, name="", timeout=0):
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

    monkeypatch.setattr(slurm, "show", show)
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

    def broken(kind, name="", timeout=0):
        raise slurm.AgentError("scontrol did not answer within 15 s")

    monkeypatch.setattr(slurm, "show", broken)
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
    allowed: queue_ticks.Allowed = {}
    config = AgentConfig(state_dir=str(tmp_path))
    for _ in range(3):
        queue_ticks.tick(config, allowed)
    assert reads == ["41", "41"]
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
