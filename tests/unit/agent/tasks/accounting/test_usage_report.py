"""`tacc-agent report usage` (tasks/accounting/usage_report.py,
tasks/accounting/gpu_time_used.py): every user's allocated GPU- and CPU-hours by user
and account from sacct (--allusers), the billing figures, beside the GPUs' utilisation
from a fake Prometheus on 127.0.0.1 (its query API over recorded utilization samples,
closed ranges as Prometheus 2 takes them); the utilisation figures are "n/a" with a
warning when Prometheus is unset, silent or says no, and a forged scrape changes no
billing figure; table, CSV and JSON; root only (exit 4); bad dates exit 2."""

from __future__ import annotations

import csv
import http.server
import io
import json
import os
import re
import socket
import threading
import urllib.parse
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tacc_agent import cli as agent_cli
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.accounting import gpu_time_used, usage_report
from tests.unit.usage_fakes import ME, NOW, install_sacct

METRIC = "tacc_agent_job_gpu_utilization_ratio"
STEP = 300  # seconds between two samples
QUERY = re.compile(rf"(sum|count)_over_time\({METRIC}\[(\d+)ms\]\)")


@pytest.fixture
def fake_sacct(tmp_path: Path, monkeypatch) -> Path:
    return install_sacct(tmp_path, monkeypatch)


def samples(start: datetime, end: datetime, value: float) -> list[tuple[float, float]]:
    first, last = start.timestamp(), end.timestamp()
    return [(first + k * STEP, value) for k in range(int((last - first) // STEP) + 1)]


# 101: 2 GPUs, 4 h (honour_labels off: the Slurm id in exported_job); 105: one GPU, two
# runs of 1 h (honour_labels on: the Slurm id in job); 106: no samples; bob's 201: one
# busy GPU of 8. One series of a job outside the report (999) is never counted.
SERIES = {
    (
        ("exported_job", "101"),
        ("gpu", "0"),
        ("instance", "n2"),
        ("job", "tacc_agent"),
        ("user", ME),
    ): samples(datetime(2025, 10, 31, 22), datetime(2025, 11, 1, 2), 0.5),
    (
        ("exported_job", "101"),
        ("gpu", "1"),
        ("instance", "n2"),
        ("job", "tacc_agent"),
        ("user", ME),
    ): samples(datetime(2025, 10, 31, 22), datetime(2025, 11, 1, 2), 1.0),
    (("gpu", "0"), ("instance", "n3"), ("job", "105"), ("user", ME)): samples(
        datetime(2025, 11, 10, 0), datetime(2025, 11, 10, 1), 0.25
    )
    + samples(datetime(2025, 11, 10, 2), datetime(2025, 11, 10, 3), 0.25),
    (
        ("exported_job", "201"),
        ("gpu", "0"),
        ("instance", "n3"),
        ("job", "tacc_agent"),
        ("user", "bob"),
    ): samples(datetime(2025, 11, 5, 0), datetime(2025, 11, 5, 10), 0.8),
    (
        ("exported_job", "999"),
        ("gpu", "0"),
        ("instance", "n3"),
        ("job", "tacc_agent"),
        ("user", "eve"),
    ): samples(datetime(2025, 11, 5, 0), datetime(2025, 11, 5, 10), 1.0),
}


class Prometheus(http.server.BaseHTTPRequestHandler):
    """/api/v1/query for sum_over_time and count_over_time of METRIC[Nms] at a time."""

    asked: list[dict]
    refuse: str = ""

    def do_GET(self) -> None:
        url = urllib.parse.urlsplit(self.path)
        arguments = dict(urllib.parse.parse_qsl(url.query))
        self.asked.append(arguments)
        found = QUERY.fullmatch(arguments.get("query", ""))
        if url.path != "/api/v1/query" or found is None or self.refuse:
            error = self.refuse or f"cannot parse {arguments.get('query')!r}"
            return self.reply(400, {"status": "error", "errorType": "bad_data", "error": error})
        at = float(arguments["time"])
        start = at - int(found[2]) / 1000
        result = []
        for labels, points in SERIES.items():
            inside = [v for t, v in points if start <= t <= at]
            if inside:
                value = sum(inside) if found[1] == "sum" else len(inside)
                result.append(
                    {
                        "metric": {"__name__": METRIC, **dict(labels)},
                        "value": [at, repr(float(value))],
                    }
                )
        return self.reply(
            200, {"status": "success", "data": {"resultType": "vector", "result": result}}
        )

    def reply(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args) -> None:
        pass


@pytest.fixture
def prometheus() -> Iterator[tuple[str, type[Prometheus]]]:
    handler = type("Handler", (Prometheus,), {"asked": [], "refuse": ""})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()
    server.server_close()


@pytest.fixture
def root(monkeypatch) -> None:
    monkeypatch.setattr(usage_report.os, "geteuid", lambda: 0)


@pytest.fixture
def proxied(monkeypatch) -> None:
    """As on a lab node: a proxy for everything, which must never be used."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9/")
    monkeypatch.setenv("no_proxy", "10.77.6.0/24")


def a_report(url: str, since: str = "2025-10", until: str = "2025-11") -> dict:
    return usage_report.report(AgentConfig(prometheus_url=url), since, until, NOW)


def rows_of(report: dict) -> dict[tuple[str, str], dict]:
    return {(row["user"], row["account"]): row for row in report["rows"]}


def test_allocated_gpu_hours_and_utilisation_by_user_and_account(
    fake_sacct, root, prometheus, proxied
):
    url, handler = prometheus
    report = a_report(url)
    rows = rows_of(report)
    assert sorted(rows) == sorted([(ME, "ml"), (ME, "physics"), ("bob", "physics")])
    mine = rows[ME, "physics"]
    # 101: 2 GPUs x 4 h at 0.5 and 1.0; 105: 1 GPU x 2 h at 0.25; 106: 2 GPUs x 1 h unseen
    assert mine["gpu_hours"] == 8 + 2 + 2
    assert mine["gpu_util_hours"] == pytest.approx(6.0 + 0.5)
    assert mine["gpu_util_unsampled_hours"] == 2
    assert mine["gpu_util_percent"] == pytest.approx(round(100 * 6.5 / 10, 1))
    assert mine["jobs"] == 4 and mine["cpu_hours"] == 32 + 8 + 4 + 1
    running = rows[ME, "ml"]  # 103, from 2025-11-29 12:00 to the window's end: no samples
    assert running["gpu_hours"] == 36 and running["gpu_util_unsampled_hours"] == 36
    assert running["gpu_util_percent"] is None and running["gpu_util_hours"] == 0
    bob = rows["bob", "physics"]
    assert (bob["gpu_hours"], bob["gpu_util_hours"], bob["gpu_util_percent"]) == (80, 8, 10.0)
    total = report["total"]
    assert total["jobs"] == 6 and total["gpu_hours"] == 12 + 36 + 80
    assert total["gpu_util_hours"] == pytest.approx(14.5)
    assert [w for w in report["warnings"] if "38 allocated GPU-hours have no utilization" in w]
    # a day a query (no query loads more), 1 ms short so a boundary sample counts once
    days = (datetime(2025, 12, 1) - datetime(2025, 10, 1)).days
    assert len(handler.asked) == 2 * days
    assert handler.asked[0]["query"] == f"sum_over_time({METRIC}[86399999ms])"


def test_the_sacct_call_asks_for_everyone(fake_sacct, root, prometheus):
    a_report(prometheus[0])
    argv = json.loads(fake_sacct.read_text().splitlines()[0])["argv"]
    assert "--allusers" in argv and not [word for word in argv if word.startswith("--user")]


@pytest.mark.fault
def test_no_prometheus_setting_leaves_the_utilisation_columns_na_with_a_warning(fake_sacct, root):
    report = a_report("")
    assert all(row["gpu_util_hours"] is None for row in report["rows"])
    assert report["total"]["gpu_hours"] == 128 and report["total"]["gpu_util_hours"] is None
    assert report["warnings"] == [
        "prometheus_url is not set in the agent's config (/etc/tacc-agent/config.yaml): "
        "no GPU utilisation to show"
    ]


@pytest.mark.fault
def test_a_silent_prometheus_is_a_warning_not_an_error(fake_sacct, root, proxied):
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    report = a_report(f"http://127.0.0.1:{port}")
    assert report["rows"] and report["total"]["gpu_util_hours"] is None
    [warning] = report["warnings"]
    assert warning.startswith(f"Prometheus at http://127.0.0.1:{port} did not answer (")
    assert "Connection refused" in warning and warning.endswith("no GPU utilisation to show")


@pytest.mark.fault
def test_a_prometheus_that_refuses_the_query_says_why(fake_sacct, root, prometheus):
    url, handler = prometheus
    handler.refuse = "query processing would load too many samples into memory"
    [warning] = a_report(url)["warnings"]
    assert "the query failed: query processing would load too many samples" in warning


@pytest.mark.bad_input
@pytest.mark.parametrize("url", ["127.0.0.1:9090", "file:///etc/passwd", "http://"])
def test_a_prometheus_url_that_is_not_one_is_said(fake_sacct, root, url):
    [warning] = a_report(url)["warnings"]
    assert f"prometheus_url {url!r} is not an http:// or https:// address" in warning


@pytest.mark.security
def test_a_forged_metrics_figure_changes_no_billing_figure(
    fake_sacct, root, prometheus, monkeypatch
):
    """A node's /metrics squatted or forged, and Prometheus scrapes it: bob's job 201
    reported idle, job 106 (never sampled) reported busy. Only the columns labelled
    utilisation (not billing) may move; the billing figures stay Slurm's. On 09a60d9 it
    failed: gpu_hours_used (with gpu_hours_unmeasured and gpu_used_percent) was the
    scraped figure (bob's 8.0 GPU-hours used became 0.0)."""
    url, _ = prometheus
    honest = rows_of(a_report(url))
    bobs = next(key for key in SERIES if ("user", "bob") in key)
    busy = datetime(2025, 11, 12, 0), datetime(2025, 11, 12, 1)
    monkeypatch.setitem(SERIES, bobs, [(t, 0.0) for t, _ in SERIES[bobs]])
    monkeypatch.setitem(SERIES, (("gpu", "0"), ("job", "106"), ("user", ME)), samples(*busy, 1.0))
    report = a_report(url)
    forged = rows_of(report)
    for key, row in honest.items():
        moved = {column for column, value in forged[key].items() if row[column] != value}
        assert all("_util_" in column for column in moved), (key, moved)
        assert "gpu_hours_used" not in forged[key]
    assert {key: row["gpu_util_hours"] for key, row in forged.items()} != {
        key: row["gpu_util_hours"] for key, row in honest.items()
    }  # the forgery did reach the utilisation columns
    sources = report["sources"]
    assert all(
        sources[column].endswith("Slurm accounting (sacct): billing")
        for column in usage_report.BILLING
    )
    assert all(sources[column].endswith("not billing") for column in usage_report.UTILISATION)


def test_the_used_time_of_a_series_is_its_average_times_the_jobs_wall_time(prometheus):
    url, _ = prometheus
    since, until = datetime(2025, 11, 5).timestamp(), datetime(2025, 11, 6).timestamp()
    measured = gpu_time_used.used_gpu_seconds(url, since, until, {"201": 10 * 3600.0})
    assert measured.warnings == [] and measured.used == {"201": pytest.approx(0.8 * 36000)}


# --- formats and the command line -------------------------------------------------------


def run_report(capsys, *words: str) -> tuple[int, str, str]:
    """The agent's main in this process, its umask (077) put back afterwards."""
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        code = agent_cli.main(["report", "usage", *words])
    finally:
        os.umask(umask)
    out, err = capsys.readouterr()
    return code, out, err


def test_csv_has_a_header_and_one_row_per_user_and_account(
    fake_sacct, root, prometheus, capsys, monkeypatch
):
    monkeypatch.setattr(usage_report, "now_here", lambda: NOW)
    config = fake_sacct.parent / "agent.yaml"
    config.write_text(json.dumps({"prometheus_url": prometheus[0]}))
    monkeypatch.setenv("TACC_AGENT_CONFIG", str(config))
    code, out, err = run_report(
        capsys, "--since", "2025-10", "--until", "2025-11", "--format", "csv"
    )
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(usage_report.COLUMNS)
    assert [(r["user"], r["account"]) for r in rows] == sorted(
        [(ME, "ml"), (ME, "physics"), ("bob", "physics")]
    )
    bob = next(r for r in rows if r["user"] == "bob")
    assert (bob["gpu_hours"], bob["gpu_util_hours"], bob["gpu_util_percent"]) == (
        "80.0000",
        "8.0000",
        "10.0",
    )
    assert "warning: 38 allocated GPU-hours have no utilization samples" in err


def test_table_and_json_without_prometheus(fake_sacct, root, capsys, monkeypatch):
    monkeypatch.setattr(usage_report, "now_here", lambda: NOW)
    code, out, err = run_report(capsys, "--since", "2025-10", "--until", "2025-11")
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "GPU and CPU hours from 2025-10-01T00:00:00 to 2025-12-01T00:00:00"
    assert lines[1].split() == [
        "USER",
        "ACCOUNT",
        "JOBS",
        "CPU-HOURS",
        "GPU-HOURS",
        "GPU-UTIL-HOURS",
        "GPU-UTIL-UNSAMPLED-HOURS",
        "GPU-UTIL%",
    ]
    assert lines[-2].split() == ["TOTAL", "6", "829.00", "128.00", "n/a", "n/a", "n/a"]
    assert lines[-1] == (
        "JOBS, CPU-HOURS, GPU-HOURS: Slurm accounting (sacct): billing; "
        "GPU-UTIL-HOURS, GPU-UTIL-UNSAMPLED-HOURS, GPU-UTIL%: Prometheus scrape: utilisation, "
        "not billing"
    )
    assert "tacc-agent: warning: prometheus_url is not set" in err
    code, out, _ = run_report(
        capsys, "--since", "2025-10", "--until", "2025-11", "--format", "json"
    )
    data = json.loads(out)
    assert sorted(data) == ["rows", "since", "sources", "total", "until", "warnings"]
    assert data["sources"]["gpu_util_hours"].endswith("utilisation, not billing")
    assert sorted(data["rows"][0]) == sorted(usage_report.COLUMNS)
    assert data["total"]["gpu_util_hours"] is None and data["warnings"]


@pytest.mark.security
def test_only_root_gets_the_report(fake_sacct, capsys, monkeypatch):
    monkeypatch.setattr(usage_report.os, "geteuid", lambda: 1000)
    code, out, err = run_report(capsys)
    assert code == usage_report.EXIT_NOT_ROOT == 4 and out == ""
    assert err == (
        "tacc-agent: error: report usage: run it as root on the controller (sudo tacc-agent "
        "report usage): it reads every user's jobs from Slurm's accounting\n"
    )
    assert not fake_sacct.exists()  # sacct never asked


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["--since", "October"], "--since: expected a month YYYY-MM or a day YYYY-MM-DD"),
        (["--since", "2025-11", "--until", "2025-10"], "--since 2025-11 comes after --until"),
        (["--until", "2025-00"], "--until: expected a month"),
    ],
)
def test_bad_dates_exit_2_with_a_clear_message(fake_sacct, root, capsys, words, message):
    code, out, err = run_report(capsys, *words)
    assert code == 2 and out == "" and message in err and "Traceback" not in err


@pytest.mark.bad_input
def test_an_unknown_format_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as caught:
        agent_cli.main(["report", "usage", "--format", "xml"])
    assert caught.value.code == 2
    assert "invalid choice: 'xml'" in capsys.readouterr().err
