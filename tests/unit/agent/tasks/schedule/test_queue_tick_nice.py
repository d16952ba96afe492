"""The nice values the scheduling plug-ins set in one queue tick go to Slurm grouped:
one `scontrol update JobId=a,b,... Nice=N` per value and NICE_BATCH jobs
(tacc_agent/tasks/schedule/queue_ticks.py NiceChanges, tacc_agent/slurm/jobs.py
set_nice), not one process per job; a job that ended since squeue is a note."""

from __future__ import annotations

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.slurm.run import Finished
from tacc_agent.tasks.schedule import queue_ticks
from tacc_contract.plugins import Queue, QueuedJob
from tacc_plugins import las


def pending(count: int) -> str:
    """squeue's QUEUE_FORMAT lines of `count` pending jobs of bob, ids 1..count."""
    return "".join(
        f"{i}|bob|PENDING|0|1|1|cpu=1,node=1,billing=1|N/A|N/A|N/A|0:00|cpu|Priority|\n"
        for i in range(1, count + 1)
    )


class Nicer:
    """A plug-in that gives odd jobs nice 100, even ones nice -5, then fails when told to."""

    name = "nicer"

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail

    def tick(self, queue: Queue) -> None:
        for job in queue.jobs:
            queue.set_nice(job.job_id, 100 if int(job.job_id) % 2 else -5)
        if self.fail:
            raise RuntimeError("broken plug-in")


@pytest.fixture
def cluster(monkeypatch):
    """squeue answers `jobs[0]` pending jobs; every scontrol update is kept, and job 3
    has ended (scontrol's own words for it, exit 1, the others updated)."""
    calls: list[list[str]] = []
    jobs = [1200]

    def output(argv, timeout=0, check=True, env=None, hint=""):
        return pending(jobs[0]) if argv[0] == "squeue" else ""

    def command(argv, timeout=0, env=None, **kwargs):
        calls.append(argv)
        ids = argv[2].removeprefix("JobId=").split(",")
        if "3" in ids:
            return Finished(1, "", "Invalid job id specified for job 3\n")
        return Finished(0, "", "")

    monkeypatch.setattr(slurm.run, "output", output)
    monkeypatch.setattr(slurm.run, "command", command)
    return calls, jobs


def tick_with(monkeypatch, plugin, tmp_path) -> list[str]:
    monkeypatch.setattr(queue_ticks, "select", lambda words, policy_from: [plugin])
    monkeypatch.setattr(queue_ticks, "in_layer", lambda plugins, layer: plugins)
    return queue_ticks.tick(AgentConfig(state_dir=str(tmp_path), plugins=("nicer",)))


def test_a_tick_sets_many_jobs_nice_in_one_scontrol_per_value_and_batch(
    cluster, monkeypatch, tmp_path
):
    calls, _ = cluster
    notes = tick_with(monkeypatch, Nicer(), tmp_path)
    # 600 jobs of each value: 2 batches each (NICE_BATCH 500), the lower value first.
    assert [call[3] for call in calls] == ["Nice=-5"] * 2 + ["Nice=100"] * 2
    assert [len(call[2].split(",")) for call in calls] == [500, 100, 500, 100]
    sent = {job for call in calls for job in call[2].removeprefix("JobId=").split(",")}
    assert sent == {str(i) for i in range(1, 1201)}
    assert notes == [
        "agent: nice 100 not set on every job: scontrol failed: Invalid job id specified for job 3"
    ]


def test_one_job_is_one_update_as_before(cluster, monkeypatch, tmp_path):
    calls, jobs = cluster
    jobs[0] = 2
    tick_with(monkeypatch, Nicer(), tmp_path)
    assert calls == [
        ["scontrol", "update", "JobId=2", "Nice=-5"],
        ["scontrol", "update", "JobId=1", "Nice=100"],
    ]


@pytest.mark.fault
def test_what_a_failing_plugin_set_before_it_failed_is_still_sent(cluster, monkeypatch, tmp_path):
    calls, jobs = cluster
    jobs[0] = 4
    notes = tick_with(monkeypatch, Nicer(fail=True), tmp_path)
    assert [call[2] for call in calls] == ["JobId=2,4", "JobId=1,3"]
    assert notes[0] == "nicer: tick failed: RuntimeError: broken plug-in"
    assert notes[1].startswith("agent: nice 100 not set on every job:")


@pytest.mark.fault
def test_a_slurm_that_does_not_answer_one_batch_leaves_the_others_sent(monkeypatch):
    calls: list[str] = []

    def command(argv, timeout=0, env=None, **kwargs):
        calls.append(argv[2])
        if len(calls) == 1:
            raise AgentError("scontrol did not answer within 15 s")
        return Finished(0, "", "")

    monkeypatch.setattr(slurm.run, "command", command)
    ids = [str(i) for i in range(1, 1002)]
    problems = slurm.jobs.set_nice(ids, 7, 15)
    assert problems == ["scontrol did not answer within 15 s"]
    assert [len(call.split(",")) for call in calls] == [500, 500, 1]


@pytest.mark.security
def test_an_id_of_another_shape_goes_in_no_list_and_each_call_has_time_for_its_jobs(monkeypatch):
    """scontrol refuses a whole JobId= list with one id it cannot read: such an id (none
    of squeue's shape) is a problem of its own, the others are set; a call of N updates
    gets the timeout plus NICE_SECONDS_PER_JOB each."""
    calls: list[tuple[str, float]] = []

    def command(argv, timeout=0, env=None, **kwargs):
        calls.append((argv[2], timeout))
        return Finished(0, "", "")

    monkeypatch.setattr(slurm.run, "command", command)
    problems = slurm.jobs.set_nice(["7", "8_2", "9+1", "1,2", "x"], -5, 15)
    assert calls == [("JobId=7,8_2,9+1", 15 + 3 * slurm.jobs.NICE_SECONDS_PER_JOB)]
    assert problems == ["not a job id: '1,2'", "not a job id: 'x'"]


@pytest.mark.fault
def test_a_nice_that_did_not_reach_slurm_is_set_again_never_counted_as_the_owners(tmp_path):
    """LAS (and tiresias, with the same own_nice) record the nice they set and the one
    the job had: when the agent's update failed, the job still shows the old value, and
    the next tick sets the wanted nice again, not the old one taken for the owner's."""
    config = AgentConfig(las_thresholds=(100.0,), las_nice_step=1000)

    def tick(*jobs: QueuedJob) -> dict[str, int]:
        wanted: dict[str, int] = {}
        las.LeastAttainedService().tick(
            Queue(list(jobs), wanted.__setitem__, 0.0, tmp_path, config)
        )
        return wanted

    # bob (nice 300 of his own, no service yet) is favoured: 300 - 1000; Slurm takes it.
    assert tick(QueuedJob("2", "bob", "PENDING", 300, 1, 0)) == {"2": -700}
    # His running job passes the threshold: back to his own 300, an update that fails...
    running = QueuedJob("1", "bob", "RUNNING", 0, 1, 500)
    assert tick(running, QueuedJob("2", "bob", "PENDING", -700, 1, 0)) == {"2": 300}
    # ...so Slurm still says -700: that is LAS's old value, not bob's, and 300 goes again.
    assert tick(running, QueuedJob("2", "bob", "PENDING", -700, 1, 0)) == {"2": 300}
    assert tick(running, QueuedJob("2", "bob", "PENDING", 300, 1, 0)) == {}
