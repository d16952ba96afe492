"""squeue's output shapes (tacc_agent/slurm/queue.py), one reader each: --Format lines
(the queue tick's jobs, the running jobs Slurm's limits count), the tick's details, the
caller's own jobs, tags, pending reasons, jobs per partition, the uids on a node."""

from __future__ import annotations

from collections import Counter

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import queue
from tests.unit.fake_slurm import FakeSlurm, answer

# squeue --noheader --array --states=PENDING,RUNNING <queue.QUEUE_FORMAT> as Slurm 22.05
# prints it: every field whole and ended by "|"; a running job's Reason is "None"; a job
# with a state description shows it there (free text, here with a "|").
SQUEUE = (
    "41|alice|RUNNING|0|2|8|cpu=16,mem=64G,node=2,billing=16,gres/gpu=8|N/A|gres:gpu:4|N/A|"
    "1:02:03|gpu|None|\n"
    "42|bob|PENDING|0|1|1|cpu=1,mem=4G,node=1,billing=1|N/A|gres:gpu:1|N/A|0:00|gpu|"
    "Resources|\n"
    "43_2|carol|PENDING|0|1|1|cpu=1,node=1,billing=1|N/A|N/A|N/A|0:00|cpu|Priority|\n"
    "44|dave|PENDING|0|1|1|cpu=1,node=1,billing=1|N/A|N/A|N/A|0:00|cpu,gpu|"
    "launch failed requeued held | by admin|\n"
)


def test_format_fields_end_with_a_bar_and_the_last_keeps_its_own():
    assert queue.format_option(("JobArrayID", "Reason")) == "--Format=JobArrayID:0|,Reason:0|"
    assert queue.format_fields("44|dave|held | by admin|\n", 3) == ["44", "dave", "held | by admin"]
    assert queue.format_fields("44|dave|", 3) == ["44", "dave"]


# --- the queue tick's jobs ------------------------------------------------------------------


def test_the_format_asks_for_partition_and_reason_last():
    assert queue.QUEUE_FORMAT.endswith(",Partition:0|,Reason:0|")


def test_squeue_lines_give_partition_and_pending_reason():
    jobs = queue.parse_queue(SQUEUE)
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
    (job,) = queue.parse_queue("12|alice|RUNNING|0|2|2|N/A|N/A|gres/gpu:4|N/A|1:02:03|\n")
    assert (job.gpus, job.partition, job.reason) == (8, "", "")


@pytest.mark.bad_input
@pytest.mark.parametrize("line", ["", "garbage", "1|a|RUNNING|0|x|1|N/A|N/A|N/A|N/A|0:00|p|r|"])
def test_lines_that_are_not_jobs_are_skipped(line):
    assert queue.parse_queue(line) == []


def test_the_queue_is_everybodys_or_one_users(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.when("squeue", answer(0, SQUEUE))
    assert [job.user for job in queue.queued_jobs(5, "alice")][:1] == ["alice"]
    assert fake.calls[-1] == [
        "squeue",
        "--noheader",
        "--array",
        "--states=PENDING,RUNNING",
        "--user=alice",
        queue.QUEUE_FORMAT,
    ]


# --- the tick's details -----------------------------------------------------------------------


def test_squeue_details_keep_a_constraint_whole_and_a_name_with_spaces():
    out = (
        "S 12 alice 10:00 n[2-3] 1795587794 1795587799 h100|l40s my job | name\n"
        "S 13 bob UNLIMITED  1795587795 N/A (null) x\n"
    )
    found = queue.parse_details(out, "S")
    at = 1795587794.0
    assert found["12"] == ("alice", "my job | name", "h100|l40s", 600, ("n2", "n3"), at, at + 5)
    assert found["13"] == ("bob", "x", "", 0, (), at + 1, 0.0)


@pytest.mark.security
def test_a_detail_line_without_the_reads_start_word_continues_the_name():
    out = (
        "S 14 bob 1:00  N/A N/A (null) x\n"
        "9 alice x-1 n[0-9] N/A N/A a b\n"  # a line of bob's job name
        "S 9 alice 10:00  N/A N/A (null) t\n"
    )
    found = queue.parse_details(out, "S")
    assert found["14"].name == "x\n9 alice x-1 n[0-9] N/A N/A a b"
    assert found["9"].user == "alice" and found["9"].limit == 600


# --- running jobs, for Slurm's limits ---------------------------------------------------------


def test_running_jobs_one_by_one():
    out = (
        "40|alice|lab|normal|batch|cpu=2,mem=4G,node=1,billing=2,gres/gpu=1|\n"
        "41_3|bob||(null)|gpu|cpu=8,node=2|\n"
        "45+1|carol|lab|normal|batch|cpu=1,node=1|\n"
    )
    assert queue.parse_running(out) == [
        queue.RunningJob(
            "40", "alice", "lab", "normal", "batch", "cpu=2,mem=4G,node=1,billing=2,gres/gpu=1"
        ),
        queue.RunningJob("41_3", "bob", "", "(null)", "gpu", "cpu=8,node=2"),
        queue.RunningJob("45+1", "carol", "lab", "normal", "batch", "cpu=1,node=1"),
    ]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "line",
    [
        "40|alice|lab|normal|batch|cpu=1,node=1",  # no closing "|"
        "40|alice|lab|normal|batch|",  # a field short
        "x UserId=alice|alice|lab|normal|batch|cpu=1|",
        "40|alice|lab|normal|batch|cpu=1|more|",
    ],
)
def test_a_squeue_line_not_understood_is_an_error(line):
    with pytest.raises(AgentError, match="squeue: a running job's line not understood"):
        queue.parse_running("40|alice|lab|normal|batch|cpu=1|\n" + line + "\n")


# --- the caller's own jobs, their tags ----------------------------------------------------------


def test_the_callers_own_jobs_by_id_the_comment_kept_whole():
    out = (
        "41|RUNNING|None|1:02|n[2-3]|/shared/tcloud/alice/jobs/a-1|tacc:a-1:00\n"
        "42_1|PENDING|Resources|0:00||/shared/tcloud/alice/jobs/b-1|my|comment\n"
        "garbage\n"
    )
    found = queue.parse_own(out)
    assert found["41"] == {
        "JobState": "RUNNING",
        "Reason": "None",
        "RunTime": "1:02",
        "NodeList": "n[2-3]",
        "WorkDir": "/shared/tcloud/alice/jobs/a-1",
        "Comment": "tacc:a-1:00",
    }
    assert found["42_1"]["Comment"] == "my|comment" and list(found) == ["41", "42_1"]


def test_tags_name_the_arrays_id():
    assert queue.parse_tags("41|tacc:a-1:00\n42|tacc:b-1:01\nno bar\n") == {
        "tacc:a-1:00": "41",
        "tacc:b-1:01": "42",
    }


# --- pending reasons, jobs per partition, uids on a node ----------------------------------------


def test_pending_jobs_reasons():
    assert queue.parse_reasons("31|Resources\n32|JobHeldUser\n\n") == ["Resources", "JobHeldUser"]


def test_jobs_per_partition_and_state():
    out = "batch RUNNING\ngpu RUNNING\ngpu PENDING\nbatch,gpu PENDING\n\n"
    assert queue.parse_partition_states(out) == Counter(
        {
            ("batch", "RUNNING"): 1,
            ("gpu", "RUNNING"): 1,
            ("gpu", "PENDING"): 2,
            ("batch", "PENDING"): 1,
        }
    )


@pytest.mark.bad_input
@pytest.mark.parametrize("line", ["garbage", "batch COMPLETING", "a b c"])
def test_a_partition_line_not_understood_is_an_error(line):
    with pytest.raises(AgentError, match="squeue: unexpected line"):
        queue.parse_partition_states(f"batch RUNNING\n{line}\n")


def test_the_uids_with_a_job_on_a_node(monkeypatch):
    assert queue.parse_uids("2001\n2002\n\n") == {2001, 2002}
    fake = FakeSlurm().install(monkeypatch)
    fake.when("squeue --format=%U", answer(0, "2001\n"))
    assert queue.uids_on_node("n2", "RUNNING", 5) == {2001}
    assert fake.calls[-1][2:4] == ["--nodelist=n2", "--states=RUNNING"]
    fake.when("squeue --format=%U", answer(1, "", "slurm_load_jobs error: Unable to contact"))
    assert queue.uids_on_node("n2", "RUNNING", 5) is None
