"""`tcloud usage` (tcloud/jobs/usage.py, Cluster.usage): the agent's raw sums by month,
account and partition grouped by --by (jobs add up once each), as a table (a TOTAL
line, running jobs said), CSV (a header row, the csv module's quoting) or JSON (stable
keys); dates and group words checked before anything is asked (exit 2); the agent's
refusal is exit 4. The answer of the real agent verb (fake sacct) goes through too."""

from __future__ import annotations

import csv
import io
import json
from collections import defaultdict
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.tasks.accounting import usage as agent_usage
from tcloud.errors import EXIT_CLUSTER, EXIT_USAGE, UsageError
from tcloud.jobs import usage
from tests.unit.interactive_fakes import FakeCluster, cli_run
from tests.unit.usage_fakes import NOW, install_sacct

HOUR = 3600
ANSWER = {
    "user": "alice",
    "since": "2025-10-01T00:00:00",
    "until": "2025-12-01T00:00:00",
    "rows": [
        {
            "month": "2025-10",
            "account": "physics",
            "partition": "gpu",
            "jobs": 1,
            "running": 0,
            "cpu_seconds": 16 * HOUR,
            "gpu_seconds": 4 * HOUR,
        },
        {
            "month": "2025-11",
            "account": "ml",
            "partition": "gpu",
            "jobs": 1,
            "running": 1,
            "cpu_seconds": 144 * HOUR,
            "gpu_seconds": 36 * HOUR,
        },
        {
            "month": "2025-11",
            "account": "physics",
            "partition": "batch",
            "jobs": 1,
            "running": 0,
            "cpu_seconds": HOUR,
            "gpu_seconds": 0,
        },
        {
            "month": "2025-11",
            "account": "physics",
            "partition": "gpu",
            "jobs": 2,
            "running": 0,
            "cpu_seconds": 28 * HOUR,
            "gpu_seconds": 8 * HOUR,
        },
    ],
}


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    cluster = FakeCluster(tmp_path, monkeypatch)
    cluster.session.answers = defaultdict(lambda: (0, ANSWER))
    return cluster


def test_the_default_table_has_every_group_a_total_and_the_running_jobs(fake):
    code, out, err = cli_run("usage")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "alice: CPU and GPU hours from 2025-10-01T00:00:00 to 2025-12-01T00:00:00"
    assert lines[1].split() == ["MONTH", "ACCOUNT", "PARTITION", "JOBS", "CPU-HOURS", "GPU-HOURS"]
    assert lines[2].split() == ["2025-10", "physics", "gpu", "1", "16.00", "4.00"]
    assert lines[3].split() == ["2025-11", "ml", "gpu", "1", "144.00", "36.00"]
    assert lines[6].split() == ["TOTAL", "5", "189.00", "48.00"]
    assert lines[7] == "1 job(s) still running: counted up to 2025-12-01T00:00:00"
    assert fake.session.verbs == [["usage"]]  # the window is the cluster's default


def test_by_account_sums_the_months_and_partitions(fake):
    code, out, _ = cli_run("usage", "--by", "account", "--since", "2025-10", "--until", "2025-11")
    assert code == 0
    lines = out.splitlines()
    assert [line.split() for line in lines[1:-1]] == [
        ["ACCOUNT", "JOBS", "CPU-HOURS", "GPU-HOURS"],
        ["ml", "1", "144.00", "36.00"],
        ["physics", "4", "45.00", "12.00"],
        ["TOTAL", "5", "189.00", "48.00"],
    ]
    assert fake.session.verbs == [["usage", "--since", "2025-10", "--until", "2025-11"]]


def test_csv_has_a_header_row_and_the_groups_in_the_order_asked(fake):
    code, out, _ = cli_run("usage", "--by", "partition,month", "--format", "csv")
    assert code == 0
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["partition", "month", "jobs", "cpu_hours", "gpu_hours"]
    assert rows[1:] == [
        ["batch", "2025-11", "1", "1.0000", "0.0000"],
        ["gpu", "2025-10", "1", "16.0000", "4.0000"],
        ["gpu", "2025-11", "3", "172.0000", "44.0000"],
    ]


def test_csv_quotes_what_needs_quoting(fake):
    fake.session.answers = defaultdict(
        lambda: (0, {**ANSWER, "rows": [{**ANSWER["rows"][0], "account": 'a,"b"'}]})
    )
    rows = list(csv.reader(io.StringIO(cli_run("usage", "--by", "account", "--format", "csv")[1])))
    assert rows[1][0] == 'a,"b"'


@pytest.mark.parametrize("flags", [["--format", "json"], ["--json"]])
def test_json_has_stable_keys_hours_and_seconds(fake, flags):
    code, out, _ = cli_run("usage", "--by", "month", *flags)
    assert code == 0
    data = json.loads(out)
    assert sorted(data) == ["by", "rows", "since", "total", "until", "user"]
    assert data["by"] == ["month"]
    assert data["rows"][1] == {
        "month": "2025-11",
        "jobs": 4,
        "running": 1,
        "cpu_seconds": 173 * HOUR,
        "gpu_seconds": 44 * HOUR,
        "cpu_hours": 173.0,
        "gpu_hours": 44.0,
    }
    assert data["total"]["jobs"] == 5 and data["total"]["gpu_hours"] == 48.0


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--since", "2025-13"],
            "--since: expected a month YYYY-MM or a day YYYY-MM-DD, got '2025-13'",
        ),
        (["--until", "yesterday"], "--until: expected a month YYYY-MM or a day YYYY-MM-DD"),
        (
            ["--since", "2025-11-02", "--until", "2025-11-01"],
            "--since 2025-11-02 comes after --until 2025-11-01",
        ),
        (
            ["--by", "month,user"],
            "--by: unknown group 'user' (expected one or more of month, "
            "account, partition, comma-separated)",
        ),
        (["--by", ""], "--by: unknown group ''"),
    ],
)
def test_bad_dates_and_groups_are_usage_errors_before_anything_is_asked(fake, argv, message):
    code, out, err = cli_run("usage", *argv)
    assert code == EXIT_USAGE and out == "" and "Traceback" not in err
    assert err.startswith(f"tcloud: error: {message}") and err.count("\n") == 1
    assert fake.session.verbs == []


@pytest.mark.bad_input
def test_an_unknown_format_is_a_usage_error(fake, capsys):
    with pytest.raises(SystemExit) as caught:
        cli_run("usage", "--format", "xml")
    assert caught.value.code == EXIT_USAGE


def test_the_clusters_refusal_is_exit_4(fake):
    fake.session.answers = defaultdict(lambda: (3, {"error": "sacct failed: accounting off"}))
    code, out, err = cli_run("usage")
    assert code == EXIT_CLUSTER and out == ""
    assert err == "tcloud: error: sacct failed: accounting off\n"


@pytest.mark.bad_input
def test_an_answer_of_another_shape_is_a_protocol_error(fake):
    fake.session.answers = defaultdict(lambda: (0, {**ANSWER, "rows": [{"month": "2025-10"}]}))
    code, _, err = cli_run("usage")
    assert code == EXIT_CLUSTER and "the key 'account' is missing" in err


def test_the_sdk_returns_the_report_as_data(fake):
    report = fake.cluster().usage(since="2025-10", by=["account", "partition"])
    assert report["by"] == ["account", "partition"]
    assert [(r["account"], r["partition"], r["jobs"]) for r in report["rows"]] == [
        ("ml", "gpu", 1),
        ("physics", "batch", 1),
        ("physics", "gpu", 3),
    ]
    assert fake.session.verbs == [["usage", "--since", "2025-10"]]
    with pytest.raises(UsageError, match="unknown group 'user'"):
        fake.cluster().usage(by="user")


def test_the_real_agents_answer_gives_the_jobs_it_ran(tmp_path: Path, monkeypatch):
    """The agent verb over recorded sacct lines, then tcloud's grouping: the table's jobs
    are the user's started jobs (a requeued one once), bob's never."""
    install_sacct(tmp_path, monkeypatch)
    answer = agent_usage.usage(AgentConfig(), "2025-10", "2025-11", NOW)
    report = usage.build(answer, ("account",))
    assert report["total"]["jobs"] == 5 and report["total"]["running"] == 1
    assert {r["account"]: r["gpu_hours"] for r in report["rows"]} == {"ml": 36.0, "physics": 12.0}
