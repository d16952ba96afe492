"""The ops report's PromQL on a real Prometheus (Debian's 2.42, the one roles/monitoring
installs; the Makefile installs it on the build machine too): utilization samples
backfilled with `promtool tsdb create-blocks-from openmetrics`, Prometheus started on
127.0.0.1 over them (no scrape targets), and tasks/accounting/gpu_time_used.py asked through its
HTTP API. Chunks of any length count every sample once (a range 1 ms short of the chunk:
Prometheus 2 takes both ends of a range), the Slurm id is read from `exported_job` or
`job`, and used time is the series' average times the job's wall time."""

from __future__ import annotations

import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tacc_agent.prometheus import DIRECT
from tacc_agent.tasks.accounting import gpu_time_used

METRIC = "tacc_agent_job_gpu_utilization_ratio"
SCRAPE = 15
START = (int(time.time()) - 6 * 3600) // SCRAPE * SCRAPE  # within any retention
SERIES = {  # labels -> (first sample, last sample, value)
    'exported_job="101",gpu="0",instance="n2",job="tacc_agent",user="alice"': (
        START,
        START + 4 * 3600,
        0.5,
    ),
    'exported_job="101",gpu="1",instance="n2",job="tacc_agent",user="alice"': (
        START,
        START + 4 * 3600,
        1.0,
    ),
    'gpu="0",instance="n3",job="105",user="bob"': (START + 3600, START + 2 * 3600, 0.25),
    'exported_job="7",gpu="0",instance="n3",job="tacc_agent",user="eve"': (
        START,
        START + 3600,
        1.0,
    ),
}


def openmetrics() -> str:
    lines = [f"# TYPE {METRIC} gauge"]
    for labels, (first, last, value) in SERIES.items():
        lines += [f"{METRIC}{{{labels}}} {value} {t}" for t in range(first, last + 1, SCRAPE)]
    return "\n".join([*lines, "# EOF"]) + "\n"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ready(url: str) -> bool:
    try:
        with DIRECT.open(f"{url}/-/ready", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[str]:
    home: Path = tmp_path_factory.mktemp("prometheus")
    (home / "samples.om").write_text(openmetrics())
    subprocess.run(
        ["promtool", "tsdb", "create-blocks-from", "openmetrics", "samples.om", "data"],
        cwd=home,
        check=True,
        capture_output=True,
        timeout=120,
    )
    (home / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\nscrape_configs: []\n")
    url = f"http://127.0.0.1:{free_port()}"
    server = subprocess.Popen(
        [
            "prometheus",
            "--config.file=prometheus.yml",
            "--storage.tsdb.path=data",
            "--storage.tsdb.retention.time=3650d",
            f"--web.listen-address={url[7:]}",
        ],
        cwd=home,
        stdout=subprocess.DEVNULL,
        stderr=(home / "log").open("w"),
    )
    try:
        deadline = time.monotonic() + 60
        while not ready(url):
            assert server.poll() is None, (home / "log").read_text()[-2000:]
            assert time.monotonic() < deadline, "Prometheus was not ready within 60 s"
            time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("chunk", [86400, 900, SCRAPE])
def test_every_sample_counts_once_however_the_window_is_cut(prometheus, monkeypatch, chunk):
    monkeypatch.setattr(gpu_time_used, "CHUNK_SECONDS", chunk)
    sums = gpu_time_used.series_sums(
        prometheus, START - SCRAPE, START + 4 * 3600, time.monotonic() + 60
    )
    found = {(e.job_id, e.samples, e.total) for e in sums.values()}
    samples = 4 * 3600 // SCRAPE + 1
    assert found == {
        ("101", samples, samples * 0.5),
        ("101", samples, samples * 1.0),
        ("105", 241, 241 * 0.25),
        ("7", 241, 241.0),
    }


def test_used_time_is_the_average_times_the_wall_time(prometheus):
    wall = {"101": 4 * 3600.0, "105": 3600.0}
    measured = gpu_time_used.used_gpu_seconds(prometheus, START - 60, START + 5 * 3600, wall)
    assert measured.warnings == []
    assert measured.used == {"101": pytest.approx(1.5 * 4 * 3600), "105": pytest.approx(900)}


def test_a_window_inside_a_run_averages_its_own_samples(prometheus):
    measured = gpu_time_used.used_gpu_seconds(
        prometheus, START + 3600, START + 2 * 3600, {"101": 3600.0}
    )
    assert measured.used == {"101": pytest.approx(1.5 * 3600)}


def test_the_query_api_answers_without_a_proxy(prometheus, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9/")
    monkeypatch.setenv("no_proxy", "10.0.0.0/8")
    assert urllib.request.getproxies()["http"] == "http://127.0.0.1:9/"
    measured = gpu_time_used.used_gpu_seconds(prometheus, START, START + 60, {"7": 60.0})
    assert measured.used == {"7": pytest.approx(60.0)}
