"""A job's state: its record reconciled with what Slurm says now."""

from __future__ import annotations

import os

import pytest

from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs.verbs import reconcile


def job(tmp_path, events: list[str], ranks: list[dict] | None = None):
    job_dir = tmp_path / "job"
    (job_dir / "status").mkdir(parents=True)
    for state in events:
        records.add_event(job_dir, state)
    for rank in ranks or []:
        records.write_rank(job_dir, **rank)
    return job_dir


EXITED_0 = {"rank": 0, "host": "n2", "state": "EXITED", "exit_code": 0}
EXITED_3 = {"rank": 1, "host": "n3", "state": "EXITED", "exit_code": 3}


@pytest.mark.parametrize(
    ("events", "ranks", "slurm", "expected"),
    [
        (["QUEUED"], [], {"JobState": "PENDING", "Reason": "Resources"}, "QUEUED"),
        (["QUEUED"], [], {"JobState": "CONFIGURING"}, "PROVISIONING"),
        (["QUEUED", "PROVISIONING", "RUNNING"], [], {"JobState": "RUNNING"}, "RUNNING"),
        (
            ["QUEUED", "HALTED"],
            [],
            {"JobState": "PENDING", "Reason": "job_requeued_in_held_state"},
            "HALTED",
        ),
        (["QUEUED", "RUNNING"], [], {"JobState": "PENDING", "Reason": "JobHeldUser"}, "HALTED"),
        (["QUEUED", "RUNNING"], [EXITED_0], {"JobState": "COMPLETED"}, "COMPLETED"),
        (["QUEUED", "RUNNING"], [EXITED_0, EXITED_3], None, "FAILED"),
        (["QUEUED", "RUNNING"], [], {"JobState": "TIMEOUT"}, "FAILED"),
        (["QUEUED", "RUNNING"], [], {"JobState": "CANCELLED"}, "CANCELLED"),
        (["QUEUED", "RUNNING"], [], None, "FAILED"),
        (["QUEUED", "RUNNING", "COMPLETED"], [], {"JobState": "RUNNING"}, "COMPLETED"),
    ],
)
def test_reconcile(tmp_path, events, ranks, slurm, expected):
    job_dir = job(tmp_path, events, ranks)
    state, _ = reconcile(job_dir, slurm)
    assert state == expected
    if expected in records.TERMINAL:
        # Decided once, recorded: later reads do not depend on Slurm any more.
        assert records.last_state(job_dir) == expected
        assert reconcile(job_dir, {"JobState": "RUNNING"})[0] == expected


def test_events_are_separate_files_in_order(tmp_path):
    job_dir = job(tmp_path, ["QUEUED", "PROVISIONING", "RUNNING"])
    assert [e["state"] for e in records.history(job_dir)] == ["QUEUED", "PROVISIONING", "RUNNING"]
    with pytest.raises(ValueError, match="unknown job state"):
        records.add_event(job_dir, "EXPLODED")


def test_a_final_state_stays_final_within_its_run(tmp_path):
    job_dir = job(tmp_path, ["QUEUED", "PROVISIONING", "RUNNING", "COMPLETED", "HALTED"])
    assert reconcile(job_dir, {"JobState": "COMPLETED"})[0] == "COMPLETED"
    # A new run (requeue after halt + resume) starts over.
    rerun = job(tmp_path / "b", ["PROVISIONING", "HALTED", "QUEUED", "PROVISIONING", "RUNNING"])
    assert reconcile(rerun, {"JobState": "RUNNING"})[0] == "RUNNING"


@pytest.mark.parametrize("paused", ["SUSPENDED", "PREEMPTED", "STOPPED"])
def test_paused_jobs_are_not_recorded_as_ended(tmp_path, paused):
    job_dir = job(tmp_path, ["QUEUED", "PROVISIONING", "RUNNING"])
    assert reconcile(job_dir, {"JobState": paused})[0] == "QUEUED"
    assert records.last_state(job_dir) == "RUNNING"


def test_a_job_that_finishes_while_being_halted_is_completed(tmp_path):
    job_dir = job(tmp_path, ["QUEUED", "PROVISIONING", "RUNNING", "HALTED"], [EXITED_0])
    assert reconcile(job_dir, None)[0] == "COMPLETED"


RUNNING_ON_N3 = {"rank": 1, "host": "n3", "state": "RUNNING"}
TERMINATED_ON_N2 = {
    "rank": 0,
    "host": "n2",
    "state": "EXITED",
    "exit_code": 143,
    "terminated": True,
}
N3_DOWN = {
    "NodeName": "n3",
    "State": "DOWN+NOT_RESPONDING",
    "Reason": "Not responding [slurm@2026-11-22T10:00:00]",
}


@pytest.fixture
def slurm_nodes(monkeypatch):
    """scontrol show node, answered from a dict (what a down node looks like)."""
    nodes: dict[str, dict] = {}
    monkeypatch.setattr(
        "tacc_agent.slurm.oneliner.show",
        lambda kind, name="", timeout=0: [nodes[name]] if name in nodes else [],
    )
    return nodes


def test_a_requeued_job_says_which_node_failed(tmp_path, slurm_nodes):
    slurm_nodes["n3"] = N3_DOWN
    job_dir = job(
        tmp_path, ["QUEUED", "PROVISIONING", "RUNNING"], [TERMINATED_ON_N2, RUNNING_ON_N3]
    )
    pending = {"JobState": "PENDING", "Reason": "BeginTime", "Restarts": "1"}
    state, reason = reconcile(job_dir, pending)
    assert (state, reason) == (
        "QUEUED",
        "requeued: node n3 (DOWN+NOT_RESPONDING: Not responding) failed during the run",
    )
    # Without a restart, a pending job's reason is Slurm's.
    assert reconcile(job_dir, {**pending, "Restarts": "0"}) == ("QUEUED", "BeginTime")


def test_a_node_failure_that_ends_the_job_names_the_node(tmp_path, slurm_nodes):
    slurm_nodes["n3"] = N3_DOWN
    job_dir = job(
        tmp_path, ["QUEUED", "PROVISIONING", "RUNNING"], [TERMINATED_ON_N2, RUNNING_ON_N3]
    )
    state, reason = reconcile(job_dir, {"JobState": "NODE_FAIL"})
    assert state == "FAILED"
    assert (
        reason
        == "Slurm: NODE_FAIL: node n3 (DOWN+NOT_RESPONDING: Not responding) failed during the run"
    )


def test_a_lost_node_that_is_back_is_still_named(tmp_path, slurm_nodes):
    from tacc_agent.tasks.execute import lost_nodes

    slurm_nodes["n3"] = {"NodeName": "n3", "State": "IDLE", "Reason": ""}
    assert (
        lost_nodes.describe([TERMINATED_ON_N2, RUNNING_ON_N3], 1) == "node n3 failed during the run"
    )
    assert lost_nodes.describe([TERMINATED_ON_N2, EXITED_0], 1) == ""
    # Told to stop (halt, preemption) and SIGKILLed before it wrote its exit: not lost.
    stopped = {"rank": 1, "host": "n3", "state": "RUNNING", "terminated": True}
    assert lost_nodes.describe([TERMINATED_ON_N2, stopped], 1) == ""


@pytest.fixture
def running_job(tmp_path, monkeypatch):
    """A running job of the caller's, with Slurm answered: what `halt` asks and does."""
    from tacc_agent.tasks.jobs import verbs as jobs
    from tacc_agent.tasks.store import workspace

    user_dir = tmp_path / "alice"
    job_dir = job(user_dir / "jobs", ["QUEUED", "PROVISIONING", "RUNNING"])
    workspace.register(user_dir, "41", job_dir)
    calls: list[list[str]] = []
    # Slurm's job 41 is this one: the caller's, run in its directory
    # (tacc_agent.tasks.jobs.job_tags).
    running = {"JobState": "RUNNING", "UserId": f"alice({os.getuid()})", "WorkDir": str(job_dir)}
    monkeypatch.setattr(jobs, "slurm_info", lambda job_id, config: running)
    monkeypatch.setattr(jobs.slurm.run, "output", lambda argv, timeout, **kw: calls.append(argv))
    return user_dir, job_dir, calls


def test_halt_says_whether_the_program_exited_within_its_grace_period(running_job):
    from tacc_agent.config import AgentConfig
    from tacc_agent.tasks.jobs import verbs as jobs

    user_dir, job_dir, calls = running_job
    records.write_rank(job_dir, 0, host="n2", state="RUNNING")
    late = jobs.halt(user_dir, "41", AgentConfig(), grace=0.3)
    assert late["exited_in_grace"] is False and late["grace_seconds"] == 0.3
    assert calls == [["scancel", "--signal=USR1", "41"], ["scontrol", "requeuehold", "41"]]
    records.add_event(job_dir, "RUNNING")  # a new run, halted again: this time it exits
    records.write_rank(job_dir, 0, state="EXITED", exit_code=0)
    assert jobs.halt(user_dir, "41", AgentConfig(), grace=30)["exited_in_grace"] is True


@pytest.mark.bad_input
@pytest.mark.parametrize("grace", [-1, 3601])
def test_a_halt_grace_outside_0_to_3600_seconds_is_refused_before_any_signal(running_job, grace):
    from tacc_agent.config import AgentConfig
    from tacc_agent.errors import Rejected
    from tacc_agent.tasks.jobs import verbs as jobs

    user_dir, _, calls = running_job
    with pytest.raises(Rejected, match=r"grace period is 0 to 3600 seconds"):
        jobs.halt(user_dir, "41", AgentConfig(), grace=grace)
    assert calls == []
