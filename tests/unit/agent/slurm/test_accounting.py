"""Slurm's accounting (tacc_agent/slurm/accounting.py): --parsable2 lines of sacct,
sacctmgr and sshare; a job's allocations, its submit line, where ended jobs ran, the
caller's jobs since a moment."""

from __future__ import annotations

import os
from datetime import datetime

import pytest

from tacc_agent.slurm import accounting
from tacc_contract.sbatch import SCRIPT
from tests.unit.fake_slurm import FakeSlurm, answer
from tests.unit.usage_fakes import ME, RECORDED

SUBMITTED = f"sbatch --parsable --job-name=grower --nodes=1-2 --ntasks-per-node=1 {SCRIPT}"
# sacctmgr --noheader --parsable2 show assoc format=Account,ParentName,User,MaxTRES,GrpTRES
ASSOC_TREE = "root||||\ndept|root|||\nlab|dept|||gres/gpu=16\nlab||alice|node=4|\n"


def test_parsable_rows_and_named_columns():
    rows = accounting.parsable(ASSOC_TREE + "\n")
    assert rows[2] == ["lab", "dept", "", "", "gres/gpu=16"] and len(rows) == 4
    columns = ("Account", "ParentName", "User", "MaxTRES", "GrpTRES")
    assert accounting.named(rows, columns)[3] == {
        "Account": "lab",
        "ParentName": "",
        "User": "alice",
        "MaxTRES": "node=4",
        "GrpTRES": "",
    }
    assert accounting.named([["short"]], columns) == []


def test_sacctmgr_and_sshare_are_asked_for_their_columns(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.when("sacctmgr", answer(0, "normal|10|2-00:00:00\n"))
    fake.when("sshare", answer(0, "vision|alice|10|0.5|100|0.25|0.5\n"))
    rows = accounting.sacctmgr_show(["qos"], ("Name", "Priority", "MaxWall"), 5)
    assert rows == [["normal", "10", "2-00:00:00"]]
    assert fake.calls[-1] == [
        "sacctmgr",
        "--noheader",
        "--parsable2",
        "show",
        "qos",
        "format=Name,Priority,MaxWall",
    ]
    assert accounting.shares("alice", ("Account", "User"), 5)[0][:2] == ["vision", "alice"]
    assert fake.calls[-1][-1] == "--format=Account,User"


# --- allocations ------------------------------------------------------------------------


def test_recorded_lines_become_runs_and_jobs_that_never_started_are_left_out():
    runs = [accounting.parse_allocation(line) for line in RECORDED.splitlines()]
    started = [run for run in runs if run is not None]
    assert [run.job_id for run in started] == ["101", "102", "103", "105", "105", "106"]
    first = started[0]
    assert (first.account, first.partition, first.cpus, first.gpus) == ("physics", "gpu", 8, 2)
    assert first.end == datetime(2025, 11, 1, 2)
    assert started[1].state == "CANCELLED" and started[1].gpus == 0
    assert started[2].end is None and started[2].gpus == 1  # running; typed GPUs not twice
    assert started[5].gpus == 2  # typed GPUs only


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "line",
    [
        "",
        "garbage",
        "1|2|3",
        "x|me|a|p|COMPLETED|2025-11-01T00:00:00|Unknown|1|cpu=1",
        "1|me|a|p|COMPLETED|yesterday|Unknown|1|cpu=1",
        "1|me|a|p|S|2025-11-01T00:00:00|E|1|c|extra",
    ],
)
def test_a_line_that_is_not_a_run_is_skipped_not_a_crash(line):
    assert accounting.parse_allocation(line) is None


def test_cpus_fall_back_to_alloc_cpus_without_tres():
    line = f"9|{ME}|a|p|COMPLETED|2025-11-01T00:00:00|2025-11-01T01:00:00|3|"
    run = accounting.parse_allocation(line)
    assert run is not None and run.cpus == 3 and run.gpus == 0


def test_a_runs_span_is_clipped_to_the_window():
    run = accounting.parse_allocation(RECORDED.splitlines()[0])  # 10-31 22:00 to 11-01 02:00
    assert run.span(datetime(2025, 11, 1), datetime(2025, 12, 1)) == (
        datetime(2025, 11, 1),
        datetime(2025, 11, 1, 2),
    )
    assert run.span(datetime(2025, 12, 1), datetime(2026, 1, 1)) is None


# --- submit lines, where jobs ran, the caller's jobs since a moment ----------------------


@pytest.mark.security
@pytest.mark.parametrize(
    ("line", "nodes"),
    [
        (SUBMITTED, (1, 2)),
        (f"sbatch --nodes=3 {SCRIPT}", (3, 3)),
        (f"sbatch --nodes 2-4 {SCRIPT}", None),  # a value apart from its option
        (f"sbatch -N2-4 {SCRIPT}", None),  # short options: never the agent's
        (f"sbatch {SCRIPT}", None),  # asked for no range
        (f"sbatch --job-name=x --nodes=1-99 --nodes=1-2 {SCRIPT}", None),  # two
        (f"sbatch --comment=tacc:a {SCRIPT} --nodes=1-64", None),  # the script's argument
        (f"sbatch -vN1 --job-name=a --nodes=1-64 {SCRIPT}", None),  # a bundle with -N
        (f"sbatch --nodes=1-2,4 {SCRIPT}", None),  # not a plain range
        ("sbatch --nodes=1-2 /other/job.sh", None),  # not this job's script
    ],
)
def test_the_submitted_range_is_read_only_from_the_agents_own_layout(line, nodes):
    """A user who runs sbatch herself (her job's tag and directory are hers to give)
    cannot make the submit line say a range Slurm did not keep."""
    assert accounting.parse_submitted_nodes(line, SCRIPT) == nodes


def test_the_submitted_range_of_one_job_from_sacct(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.when("sacct --format=JobID,SubmitLine", answer(0, f"41|{SUBMITTED}\n40|sbatch x\n"))
    assert accounting.submitted_nodes("41", SCRIPT, 5) == (1, 2)
    assert "--jobs=41" in fake.calls[-1]
    assert accounting.submitted_nodes("40", SCRIPT, 5) is None
    fake.when("sacct --format=JobID,SubmitLine", answer(1, "", "accounting storage is disabled"))
    assert accounting.submitted_nodes("41", SCRIPT, 5) is None


def test_where_ended_jobs_ran_the_latest_run_that_ran_somewhere():
    out = "41|n[2-3]\n41|None assigned\n42|n4\n43|n5\n44|(null)\n"
    assert accounting.parse_job_nodes(out, ["41", "42", "44"]) == {"41": "n[2-3]", "42": "n4"}


def test_where_the_callers_ended_jobs_ran(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.add_job("41", uid=os.getuid(), user="alice", state="COMPLETED", nodes="n[2-3]")
    fake.accounting = True
    assert accounting.own_job_nodes(["41"], 5) == {"41": "n[2-3]"}
    assert f"--user={os.getuid()}" in fake.calls[-1] and "--jobs=41" in fake.calls[-1]


def test_the_callers_jobs_since_a_moment_the_comment_kept_whole(monkeypatch):
    out = "41|/shared/tcloud/alice/jobs/a-1|tacc:a-1:00\n42|/home/alice|my|comment\n"
    assert accounting.parse_job_places(out) == [
        ("41", "/shared/tcloud/alice/jobs/a-1", "tacc:a-1:00"),
        ("42", "/home/alice", "my|comment"),
    ]
    fake = FakeSlurm().install(monkeypatch)
    fake.when("sacct --format=JobID,WorkDir,Comment", answer(1, "", "sacct: error: disabled"))
    assert accounting.own_jobs_since("2026-11-24T20:00:00", 5) == []  # no accounting: none
    assert "--starttime=2026-11-24T20:00:00" in fake.calls[-1]
