"""`scontrol show job` (tacc_agent/slurm/jobs.py): one job, every job, a job read alone
(one line or none), and the node groups of `scontrol show job -d --oneliner`."""

from __future__ import annotations

import pytest

from tacc_agent.slurm import jobs
from tacc_agent.slurm.jobs import tres_of
from tacc_agent.slurm.oneliner import parse_oneliner
from tests.unit.fake_slurm import FakeSlurm, answer, hung

# As Slurm 22.05 printed `scontrol show job -d --oneliner 29` on the lab (sbatch -N2 -n3
# --mem=100M), cut to the keys around the node groups.
DETAILED = (
    "JobId=29 JobName=wrap UserId=alice(2001) GroupId=alice(2001) MCS_label=N/A "
    "JobState=RUNNING NodeList=n[2-3] BatchHost=n2 NumNodes=2 NumCPUs=3 NumTasks=3 "
    "CPUs/Task=1 TRES=cpu=3,mem=200M,node=2,billing=3 CoreSpec=* JOB_GRES=(null)  "
    " Nodes=n2 CPU_IDs=0-1 Mem=100 GRES=   Nodes=n3 CPU_IDs=0 Mem=100 GRES="
    " MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) "
    "Command=(null) WorkDir=/home/alice StdOut=/home/alice/slurm-29.out Power= "
)


def test_a_jobs_tres_as_each_slurm_prints_it():
    """22.05: one TRES= (held when running, asked for when pending); 23.02 and later:
    ReqTRES= and AllocTRES=, the latter (null) until the job has nodes."""
    assert tres_of(parse_oneliner(DETAILED)) == "cpu=3,mem=200M,node=2,billing=3"
    running = {"ReqTRES": "cpu=2,mem=2G,node=2,billing=2", "AllocTRES": "cpu=4,mem=2G,node=2"}
    assert tres_of(running) == "cpu=4,mem=2G,node=2"
    assert tres_of({"ReqTRES": "cpu=1,node=1", "AllocTRES": "(null)"}) == "cpu=1,node=1"
    assert tres_of({"JobId": "3"}) == ""
    assert tres_of({"TRES": "(null)"}) == ""


@pytest.mark.security
@pytest.mark.parametrize(
    "record",
    [
        {"TRES": "cpu=8,gres/gpu=4", "AllocTRES": "cpu=1"},  # 22.05 + a forged name
        {"TRES": "cpu=8,gres/gpu=4", "ReqTRES": "cpu=1", "AllocTRES": "cpu=1"},
        {"ReqTRES": "cpu=8", "AllocTRES": "(null)", "TRES": "cpu=1"},  # 24.11 + forged
        {"AllocTRES": "cpu=1"},  # one of the pair alone
    ],
)
def test_a_record_mixing_the_spellings_has_no_tres(record):
    """A key a user wrote (job name, comment) reads as a field Slurm did not print: with
    the spellings mixed the record's TRES is unknown, never the forged one."""
    assert tres_of(record) == ""


@pytest.fixture
def slurm(monkeypatch) -> FakeSlurm:
    fake = FakeSlurm().install(monkeypatch)
    fake.add_job("41", uid=1001, user="alice", workdir="/shared/tcloud/alice/jobs/41")
    fake.add_job("42", state="PENDING", name="x UserId=alice(1001)")  # forges a key
    return fake


def test_one_job_and_every_job(slurm):
    record = jobs.job_record("41")
    assert record is not None
    assert (record["UserId"], record["WorkDir"]) == ("alice(1001)", "/shared/tcloud/alice/jobs/41")
    assert jobs.job_record("7") is None
    assert [r["JobId"] for r in jobs.job_records()] == ["41"]  # 42 names UserId twice


@pytest.mark.security
def test_a_job_read_alone_is_one_line_or_nothing(slurm):
    assert jobs.job_alone("41")["JobState"] == "RUNNING"
    slurm.when("scontrol show job", answer(0, "JobId=9 JobName=x\nJobId=9 JobName=y\n"))
    assert jobs.job_alone("9") is None  # a name with a line break, or an array: several


def test_a_job_read_alone_with_epoch_times_passes_the_setting(monkeypatch):
    seen = []

    def output(argv, timeout, env=None):
        seen.append(env)
        return "JobId=7 SubmitTime=1795587794\n"

    monkeypatch.setattr(jobs.run, "output", output)
    assert jobs.job_alone("7", 5, env=jobs.run.EPOCH_TIMES) == {
        "JobId": "7",
        "SubmitTime": "1795587794",
    }
    assert seen == [{"SLURM_TIME_FORMAT": "%s"}]


@pytest.mark.parametrize(
    ("num_nodes", "state", "counts"),
    [
        ("2-4", "PENDING", (2, 4)),
        ("2", "PENDING", (2, 2)),
        ("2", "REQUEUE_HOLD", (2, 2)),
        ("2", "RUNNING", (2, 0)),
        ("", "RUNNING", (0, 0)),
        ("x-4", "PENDING", (0, 0)),
    ],
)
def test_numnodes_gives_the_count_and_a_waiting_jobs_maximum(num_nodes, state, counts):
    assert jobs.node_counts(num_nodes, state) == counts


def test_partitions_of_a_pending_job_are_each_read():
    assert jobs.partitions_of("a,b") == ("a", "b")
    assert jobs.partitions_of("a,") == ()
    assert jobs.known("(null)") == "" and jobs.known("normal") == "normal"


def test_the_node_groups_of_a_detailed_record():
    assert jobs.node_groups(DETAILED) == [("n2", "0-1", ""), ("n3", "0", "")]
    gpus = DETAILED.replace(" GRES=   Nodes=n3", " GRES=gpu:2(IDX:0-1)   Nodes=n3")
    assert jobs.node_groups(gpus)[0] == ("n2", "0-1", "gpu:2(IDX:0-1)")


@pytest.mark.security
def test_groups_a_job_name_forges_are_none():
    forged = "x JOB_GRES=a  Nodes=n2 CPU_IDs=0-9 Mem=1 GRES=gpu:8(IDX:0-7) MinCPUsNode=1"
    assert jobs.node_groups(DETAILED.replace("JobName=wrap", f"JobName={forged}")) == []


def test_the_detailed_line_is_the_jobs_own(slurm):
    slurm.when("scontrol show job -d", answer(0, "JobId=290 x\n" + DETAILED + "\n"))
    assert jobs.detailed_line("29", 2) == DETAILED
    assert slurm.calls[-1] == ["scontrol", "show", "job", "-d", "-o", "29"]
    slurm.when("scontrol show job -d", hung("scontrol"))
    assert jobs.detailed_line("29", 2) is None
    slurm.when("scontrol show job -d", answer(1, DETAILED, "slurm_load_jobs error"))
    assert jobs.detailed_line("29", 2) is None


@pytest.mark.security
def test_records_skipped_by_id_are_not_read_and_a_skipped_jobs_name_forges_nothing(slurm):
    """The queue tick skips the records of the jobs squeue showed pending, by the JobId
    each record starts with. A pending job whose name holds a line break and a record
    claiming running job 41 is skipped by its own id; its forged line, which starts with
    JobId=41, is read as without the skip (here refused: the real fields after the name
    name UserId twice), never taken for 41's record."""
    slurm.add_job("43", state="PENDING")
    assert [r["JobId"] for r in jobs.job_records(skip={"43"})] == ["41"]
    assert [r["JobId"] for r in jobs.job_records(skip={"41", "43"})] == []
    forged = "x\nJobId=41 JobName=y UserId=bob(4242) JobState=RUNNING WorkDir=/home/bob"
    slurm.add_job("44", state="PENDING", name=forged)
    skipped = jobs.job_records(skip={"43", "44"})
    assert skipped == [r for r in jobs.job_records() if r["JobId"] not in ("43", "44")]
    assert [(r["JobId"], r["WorkDir"]) for r in skipped] == [("41", "/shared/tcloud/alice/jobs/41")]
