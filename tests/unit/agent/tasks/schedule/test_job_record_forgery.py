"""A job's name forges nothing in what the agent reads of Slurm's job records.

`scontrol show job --oneliner` prints the name second, before UserId, JobState,
Restarts, the times and WorkDir, and Slurm allows any text in a name, line breaks too.
The old reader kept the first copy of each key, so a name such as `x UserId=bob(1002)`
was the record's owner; a name with a line break could print a whole record of its own
for another job's id."""

from __future__ import annotations

from pathlib import Path

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.jobs import verbs as jobs
from tacc_agent.tasks.schedule import preempt, queue_ticks
from tacc_contract.plugins import Queue, QueuedJob


def line(
    job_id: str,
    name: str,
    user: str,
    uid: int,
    state: str = "RUNNING",
    work_dir: str = "",
    comment: str = "",
) -> str:
    """One record as scontrol 22.05 prints it (the keys the agent reads, in its order)."""
    work_dir = work_dir or f"/shared/tcloud/{user}/jobs/{job_id}"
    return (
        f"JobId={job_id} JobName={name} UserId={user}({uid}) GroupId={user}({uid}) "
        f"MCS_label=N/A Priority=1 Nice=0 Account=(null) QOS=normal JobState={state} "
        f"Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 "
        f"RunTime=00:01:00 TimeLimit=01:00:00 SubmitTime=1795587794 "
        f"EligibleTime=1795587794 NodeList=n2 NumNodes=1 NumCPUs=1 NumTasks=1 "
        f"CPUs/Task=1 NtasksPerN:B:S:C=1:0:*:* Features=(null) Command=(null) "
        f"WorkDir={work_dir} Comment={comment or 'tacc:' + job_id + ':00'} "
        f"StdOut={work_dir}/out"
    )


def scontrol_prints(monkeypatch, by_name: dict[str, str]) -> list[list[str]]:
    """`scontrol show job [ID] --oneliner` prints by_name[ID] ("" for every job)."""
    calls: list[list[str]] = []

    def fake(argv: list[str], timeout: float = 0, check: bool = True, env=None) -> str:
        calls.append(argv)
        return by_name.get(argv[-1] if argv[-1] != "--oneliner" else "", "")

    monkeypatch.setattr(slurm.run, "output", fake)
    return calls


@pytest.mark.security
@pytest.mark.parametrize(
    "name",
    [
        "x UserId=bob(1002)",
        "x JobState=PENDING Restarts=0",
        "x WorkDir=/shared/tcloud/bob/jobs/7 Comment=tacc:7:00",
    ],
)
def test_a_name_that_spells_a_field_makes_no_record(monkeypatch, name):
    scontrol_prints(monkeypatch, {"12": line("12", name, "alice", 1001) + "\n"})
    assert slurm.oneliner.show("job", "12") == []
    assert preempt.job_record("12", AgentConfig()) is None
    assert jobs.slurm_info("12", AgentConfig()) is None


def test_names_with_spaces_and_lowercase_equals_signs_still_read(monkeypatch):
    scontrol_prints(monkeypatch, {"12": line("12", "lr=0.1 two words", "alice", 1001) + "\n"})
    [record] = slurm.oneliner.show("job", "12")
    assert (record["JobName"], record["UserId"]) == ("lr=0.1 two words", "alice(1001)")


def test_node_records_are_read_as_before(monkeypatch):
    scontrol_prints(monkeypatch, {"n2": "NodeName=n2 State=IDLE Reason=disk swap [root@x]\n"})
    assert slurm.oneliner.show("node", "n2") == [
        {"NodeName": "n2", "State": "IDLE", "Reason": "disk swap [root@x]"}
    ]


@pytest.mark.security
def test_a_record_printed_by_a_name_with_a_line_break_never_stands_for_another_job(
    monkeypatch,
):
    """alice's job 12 is named so that a line of its own claims bob's job 7, with alice as
    its owner and her directory (where she opted in to everything)."""
    bobs = line("7", "train", "bob", 1002)
    forged = line("7", "y", "alice", 1001, work_dir="/shared/tcloud/alice/jobs/12")
    alices = line("12", f"x\n{forged}\nJobId=12 JobName=z", "alice", 1001)
    calls = scontrol_prints(monkeypatch, {"": f"{bobs}\n{alices}\n", "7": f"{bobs}\n"})
    known = preempt.job_records(AgentConfig())
    assert known["7"].user == "bob" and known["7"].job_dir == Path("/shared/tcloud/bob/jobs/7")
    assert ["scontrol", "show", "job", "--oneliner", "7"] in calls  # read again alone
    assert known["12"].user == "alice"  # what her name's last line says is her own job


@pytest.mark.security
def test_ids_claimed_twice_are_read_again_at_most_a_few_a_tick(monkeypatch):
    lines = [line(str(n), "a", "bob", 1002) for n in range(100, 130)]
    twice = "\n".join(lines + lines) + "\n"
    calls = scontrol_prints(monkeypatch, {"": twice})
    assert preempt.job_records(AgentConfig()) == {}
    assert len(calls) == 1 + preempt.MAX_REREADS


@pytest.mark.security
def test_a_running_jobs_record_counts_only_when_its_owner_is_squeues(monkeypatch):
    """The tick's squeue read (no name in it) says who owns a job; a record that says
    otherwise lends the job nobody's opt-ins."""
    forged = preempt.JobRecord(
        "7", 1001, "alice", "RUNNING", Path("/shared/tcloud/alice/jobs/12"), False
    )
    monkeypatch.setattr(preempt, "job_records", lambda config, skip=(): {"7": forged})
    asked: list[preempt.JobRecord] = []

    def allowed_job(record: preempt.JobRecord) -> tuple[frozenset[str], tuple[int, int]]:
        asked.append(record)
        return frozenset({"resize"}), (1, 4)

    monkeypatch.setattr(preempt, "allowed_job", allowed_job)
    job = QueuedJob("7", "bob", "RUNNING", 0, 1, 60)
    queue = Queue([job], lambda job_id, nice: None)
    queue_ticks.read_records(queue, AgentConfig(), {})
    assert asked == [] and job.opted_in == frozenset() and job.node_range is None
