"""`tacc-agent usage` (tasks/accounting/usage.py): a researcher's own CPU and GPU seconds from
Slurm's accounting. Recorded sacct lines (--parsable2, tacc_agent/slurm/accounting.py's
ALLOCATION_FIELDS; their parsing: tests/unit/agent/slurm/test_accounting.py); a run crossing
a month is split by its time in each; a running job counts up to now; the window is the
dates given (both ends included) or this month and the two before it. The agent asks
sacct for its own uid and keeps only its own rows, whatever a request or Slurm says."""

from __future__ import annotations

import io
import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from tacc_agent import cli as agent_cli
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AGENT_REJECTED, AgentError, Rejected
from tacc_agent.slurm.accounting import ALLOCATION_FIELDS, parse_allocation
from tacc_agent.tasks.accounting import usage
from tacc_contract import protocol, verbs
from tests.unit.agent_jobs import agent, agent_env
from tests.unit.usage_fakes import ME, NOW, RECORDED, install_sacct

HOUR = 3600


@pytest.fixture
def fake_sacct(tmp_path: Path, monkeypatch) -> Path:
    return install_sacct(tmp_path, monkeypatch)


def window(since="2025-10", until="2025-11", now=NOW) -> usage.Window:
    return usage.window(since, until, now)


# --- parsing ----------------------------------------------------------------------------


# --- months and the window --------------------------------------------------------------


def test_a_run_crossing_months_is_split_by_its_time_in_each():
    pieces = usage.month_pieces(datetime(2025, 10, 31, 22), datetime(2025, 11, 1, 2))
    assert pieces == [("2025-10", 2 * HOUR), ("2025-11", 2 * HOUR)]
    year_end = usage.month_pieces(datetime(2025, 12, 31, 23), datetime(2026, 2, 1, 1))
    assert year_end == [("2025-12", HOUR), ("2026-01", 31 * 24 * HOUR), ("2026-02", HOUR)]
    assert usage.month_pieces(datetime(2025, 5, 1), datetime(2025, 5, 1)) == [("2025-05", 0)]


def test_the_window_takes_both_ends_whole_and_never_passes_now():
    span = window("2025-10", "2025-11-15")
    assert (span.since, span.until) == (datetime(2025, 10, 1), datetime(2025, 11, 16))
    assert window("2025-11", "2025-12").until == NOW  # the rest of December has not come
    default = usage.window(None, None, datetime(2026, 2, 10, 9, 30))
    assert (default.since, default.until) == (datetime(2025, 12, 1), datetime(2026, 2, 10, 9, 30))
    assert usage.window(None, None, datetime(2026, 3, 1)).since == datetime(2026, 1, 1)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        ("2025-13", None, "--since: expected a month YYYY-MM or a day YYYY-MM-DD, got '2025-13'"),
        (None, "last week", "--until: expected a month YYYY-MM or a day YYYY-MM-DD"),
        ("2025-02-30", None, "got '2025-02-30'"),
        ("2025-11", "2025-10", "--since 2025-11 comes after --until 2025-10"),
    ],
)
def test_a_bad_window_is_refused_with_exit_2(since, until, message):
    with pytest.raises(Rejected) as caught:
        usage.window(since, until, NOW)
    assert message in str(caught.value) and caught.value.exit_code == AGENT_REJECTED


def test_rows_are_sums_by_month_account_partition_and_each_job_counts_once():
    runs = [r for r in map(parse_allocation, RECORDED.splitlines()) if r is not None]
    rows = usage.month_rows(runs, window())
    by_key = {(r["month"], r["account"], r["partition"]): r for r in rows}
    assert [(r["month"], r["account"], r["partition"]) for r in rows] == sorted(by_key)
    october = by_key["2025-10", "physics", "gpu"]
    assert october == {
        "month": "2025-10",
        "account": "physics",
        "partition": "gpu",
        "jobs": 1,
        "running": 0,
        "cpu_seconds": 8 * 2 * HOUR,
        "gpu_seconds": 2 * 2 * HOUR,
    }
    november = by_key["2025-11", "physics", "gpu"]
    # 101's second half (no new job), 105's two runs (one job), 106's typed GPUs
    assert november["jobs"] == 2
    assert november["gpu_seconds"] == 2 * 2 * HOUR + 1 * 2 * HOUR + 2 * HOUR * 1
    assert november["cpu_seconds"] == 8 * 2 * HOUR + 4 * 2 * HOUR + 4 * HOUR
    running = by_key["2025-11", "ml", "gpu"]  # 2025-11-29 12:00 up to the window's end
    assert running["running"] == 1 and running["gpu_seconds"] == 36 * HOUR
    assert by_key["2025-11", "physics", "batch"]["cpu_seconds"] == 2 * 30 * 60
    assert sum(r["jobs"] for r in rows) == 5


def test_only_the_part_of_a_run_inside_the_window_counts():
    runs = [r for r in map(parse_allocation, RECORDED.splitlines()) if r is not None]
    rows = usage.month_rows(runs, window("2025-11-01", "2025-11-10"))
    assert {r["month"] for r in rows} == {"2025-11"}
    gpu = next(r for r in rows if (r["account"], r["partition"]) == ("physics", "gpu"))
    assert gpu["gpu_seconds"] == 2 * 2 * HOUR + 2 * HOUR  # 101's November, 105's two runs
    assert gpu["jobs"] == 2  # 101 counted where its run in the window begins
    assert not any(r["account"] == "ml" for r in rows)  # 103 starts after the window


# --- the verb, with a fake sacct on PATH ------------------------------------------------


def calls(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_the_answer_has_the_protocols_shape_and_asks_for_the_callers_own_jobs(fake_sacct):
    answer = usage.usage(AgentConfig(), "2025-10", "2025-11", NOW)
    assert verbs.USAGE.answer.check(answer) is answer
    assert (answer["user"], answer["since"], answer["until"]) == (
        ME,
        "2025-10-01T00:00:00",
        "2025-12-01T00:00:00",
    )
    [call] = calls(fake_sacct)
    assert call["time_format"] == "standard"  # never the user's own SLURM_TIME_FORMAT
    argv = call["argv"]
    assert f"--user={os.getuid()}" in argv and "--allusers" not in argv
    assert {"--allocations", "--duplicates", "--parsable2", "--noheader"} <= set(argv)
    assert "--starttime=2025-10-01T00:00:00" in argv and "--endtime=2025-12-01T00:00:00" in argv
    assert "--format=" + ",".join(ALLOCATION_FIELDS) in argv


@pytest.mark.security
def test_another_users_rows_never_reach_the_answer_even_when_slurm_prints_them(fake_sacct):
    """The fake sacct prints bob's job too (PrivateData off, or a Slurm that ignores
    --user): the agent drops every row that is not the caller's."""
    answer = usage.usage(AgentConfig(), "2025-10", "2025-11", NOW)
    assert sum(row["jobs"] for row in answer["rows"]) == 5
    assert all(row["gpu_seconds"] < 8 * 10 * HOUR for row in answer["rows"])
    assert "bob" not in json.dumps(answer)


def test_a_row_naming_the_callers_uid_is_the_callers(fake_sacct, tmp_path):
    (tmp_path / "sacct.out").write_text(
        f"9|{os.getuid()}|a|p|COMPLETED|2025-11-01T00:00:00|2025-11-01T01:00:00|1|cpu=1\n"
        "8|1|a|p|COMPLETED|2025-11-01T00:00:00|2025-11-01T01:00:00|1|cpu=1\n"
    )
    answer = usage.usage(AgentConfig(), "2025-11", "2025-11", NOW)
    assert [(row["jobs"], row["cpu_seconds"]) for row in answer["rows"]] == [(1, HOUR)]


@pytest.mark.security
@pytest.mark.parametrize(
    "words",
    [
        ["usage", "--user", "bob"],
        ["usage", "-a"],
        ["usage", "--allusers"],
        ["usage", "-u", "bob"],
        ["usage", "--since", "--user=bob"],
        ["usage", "--since", "2025-10 --allusers"],
        ["usage", "--until", "-a"],
        ["usage", "--since=2025-10", "--", "--allusers"],
    ],
    ids=["user", "a", "allusers", "u", "since-option", "since-words", "until-a", "after-dashes"],
)
def test_no_request_can_widen_the_report_to_other_users(fake_sacct, words):
    """Every spelling of "someone else" a request might carry is refused (exit 2) and
    sacct is never asked; the builder has no such argument either."""
    session_verbs = agent_cli.SessionVerbs(agent_cli.parse_command_line(["session"]))
    rc, answer = session_verbs(words, b"", io.BytesIO())
    assert rc == AGENT_REJECTED, answer
    assert protocol.ERROR.check(answer) and not fake_sacct.exists()


def test_a_session_answers_usage_like_the_one_shot_command(fake_sacct, tmp_path):
    session_verbs = agent_cli.SessionVerbs(agent_cli.parse_command_line(["session"]))
    rc, answer = session_verbs(
        verbs.USAGE.request(since="2025-01", until="2025-02"), b"", io.BytesIO()
    )
    assert rc == 0 and answer["rows"] == [] and answer["since"] == "2025-01-01T00:00:00"
    env = agent_env(tmp_path)
    one_shot = agent(*verbs.USAGE.request(since="2025-10", until="2025-11"), env=env)
    assert one_shot.returncode == 0, one_shot.stdout + one_shot.stderr
    rows = json.loads(one_shot.stdout)["rows"]
    assert sum(row["jobs"] for row in rows) == 5 and "bob" not in one_shot.stdout


@pytest.mark.security
def test_the_ops_report_is_not_a_session_request(fake_sacct):
    session_verbs = agent_cli.SessionVerbs(agent_cli.parse_command_line(["session"]))
    rc, answer = session_verbs(["report", "usage"], b"", io.BytesIO())
    assert rc == AGENT_REJECTED and "not a session request" in answer["error"]
    assert not fake_sacct.exists()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["usage", "--since", "2025-1"], "--since: expected a month YYYY-MM"),
        (["usage", "--until", "soon"], "--until: expected a month YYYY-MM"),
        (["usage", "--since", "2025-11", "--until", "2025-10"], "comes after --until 2025-10"),
    ],
)
def test_the_command_refuses_bad_dates_with_exit_2_and_one_error_line(
    fake_sacct, tmp_path, words, message
):
    proc = agent(*words, env=agent_env(tmp_path))
    assert proc.returncode == AGENT_REJECTED and "Traceback" not in proc.stderr
    assert message in protocol.ERROR.check(json.loads(proc.stdout))["error"]


@pytest.mark.fault
def test_no_accounting_is_a_clear_error_exit_3(fake_sacct, monkeypatch):
    monkeypatch.setenv("FAKE_SACCT_FAIL", "Slurm accounting storage is disabled")
    with pytest.raises(AgentError) as caught:
        usage.usage(AgentConfig(), "2025-10", "2025-11", NOW)
    assert caught.value.exit_code == AGENT_CLUSTER
    assert str(caught.value) == (
        "sacct failed: Slurm accounting storage is disabled (usage reports need Slurm "
        "accounting (slurmdbd))"
    )


@pytest.mark.fault
def test_no_sacct_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AgentError, match="sacct not found: usage reports need Slurm"):
        usage.usage(AgentConfig(), "2025-10", "2025-11", NOW)


def test_a_window_after_now_asks_nothing(fake_sacct):
    answer = usage.usage(AgentConfig(), "2026-01", None, NOW)
    assert answer["rows"] == [] and not fake_sacct.exists()
