"""`tacc-agent serve` (issue [6]): one check run writes the facts file the execution layer
reads and a valid Prometheus exposition; the daemon keeps answering /metrics while a
mount hangs, and SIGTERM ends it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tacc_agent.health.cycle import SlurmOutcome
from tacc_agent.serve import Daemon
from tacc_agent.tasks.schedule import transport
from tests.unit.agent_fixtures import daemon_settings, fixture_config, parse_exposition
from tests.unit.blocking_fuse import FSTYPE, blocking_fuse


def test_one_run_writes_the_facts_file_and_a_valid_exposition(tmp_path):
    config = fixture_config(tmp_path)
    daemon = Daemon(config)
    daemon.cycle()
    facts = json.loads(Path(config.facts_file).read_text())
    assert facts["healthy"] and facts["running_tasks"] == 1
    assert facts["rdma"] == {"active_ports": 2} and facts["gpu"] == {"count": 2}
    assert oct(Path(config.facts_file).stat().st_mode & 0o777) == "0o644"
    assert oct(Path(config.facts_file).parent.stat().st_mode & 0o777) == "0o755"
    # the execution layer's fail-safe switching reads these facts
    assert transport.local_rdma(config) == {
        "active_ports": 2,
        "source": "agent facts",
        "declared": False,
    }
    families = parse_exposition(daemon.exposition().decode())
    assert families["tacc_agent_healthy"] == ["tacc_agent_healthy 1.0"]
    assert (
        'tacc_agent_check_status{check="rdma",status="ok"} 1.0'
        in families["tacc_agent_check_status"]
    )
    # prometheus_client's format: labels sorted, values as floats (2.5e+10 or, in the
    # 0.16 that Debian 12 ships, 2.5e+010)
    assert (
        'tacc_agent_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1"} 3.0'
        in families["tacc_agent_rdma_port_errors_total"]
    )
    rate = 'tacc_agent_rdma_port_rate_bytes_per_second{device="mlx5_1",port="1"} '
    rates = families["tacc_agent_rdma_port_rate_bytes_per_second"]
    assert [float(line.removeprefix(rate)) for line in rates if line.startswith(rate)] == [25e9]
    assert families["tacc_agent_gpus"] == ["tacc_agent_gpus 2.0"]
    assert families["tacc_agent_running_tasks"] == ["tacc_agent_running_tasks 1.0"]
    assert families["tacc_agent_check_runs_total"] == ["tacc_agent_check_runs_total 1.0"]
    assert "process_resident_memory_bytes" in families
    # a GPU goes missing: the next run says so, and stale facts are not trusted
    degraded = replace(config, expected_gpus=4)
    daemon.config = degraded
    daemon.cycle()
    families = parse_exposition(daemon.exposition().decode())
    assert families["tacc_agent_healthy"] == ["tacc_agent_healthy 0.0"]
    assert (
        'tacc_agent_check_status{check="gpu",status="fail"} 1.0'
        in families["tacc_agent_check_status"]
    )
    facts = json.loads(Path(config.facts_file).read_text())
    assert facts["checks"]["gpu"] == {"status": "fail", "detail": "2 GPU(s), expected 4"}
    os.utime(config.facts_file, (0, 0))
    Path(config.facts_file).write_text(json.dumps(facts | {"time": 0}))
    assert transport.local_rdma(config)["source"] == "sysfs"


def scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


def test_serve_answers_while_a_mount_hangs_and_stops_on_sigterm(tmp_path):
    point = tmp_path / "hung"
    point.mkdir()
    config = fixture_config(tmp_path)
    settings = daemon_settings(config) | {
        "services": [],
        "check_timeout_seconds": 0.3,
        "mounts": [{"path": str(point), "fstype": FSTYPE}],
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    with blocking_fuse(point):
        daemon = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tacc_agent",
                "serve",
                "--port",
                "0",
                "--interval",
                "0.5",
                "--config",
                str(tmp_path / "agent.yaml"),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            first = daemon.stdout.readline()
            port = int(re.search(r":(\d+)/metrics", first).group(1))
            deadline = time.monotonic() + 10
            runs = 0
            while time.monotonic() < deadline and runs < 3:
                code, text = scrape(port)
                assert code == 200  # answered while the probe is stuck
                runs = int(re.search(r"check_runs_total (\d+)", text).group(1))
                time.sleep(0.2)
            assert runs >= 3  # the daemon keeps running checks, one stuck probe or not
            assert 'check_status{check="mounts",status="stuck"} 1.0' in text
            assert scrape(port, "/nope")[0] == 404
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=10)  # the stuck probe outlives it until the mount goes
    out = daemon.stdout.read()
    assert daemon.returncode == 0 and "tacc-agent: stopped" in out
    assert "mounts: " in out and "stuck" in out  # the journal says what changed


@pytest.mark.fault
def test_the_drain_gauge_stays_at_one_while_the_agent_keeps_the_node_drained(tmp_path, monkeypatch):
    """Every run after the one that drains finds it "already drained": the gauge (which
    the TaccNodeDrainedByCheck alert reads) stayed at 1 for one run only before."""
    config = replace(fixture_config(tmp_path), drain=True, expected_gpus=4)
    daemon = Daemon(config)
    said = iter(
        [
            SlurmOutcome(f"slurm: drained {daemon.node}: tacc: gpu: 2 GPU(s)", True),
            SlurmOutcome(f"slurm: {daemon.node} already drained: tacc: gpu: 2", True),
            SlurmOutcome(f"slurm: {daemon.node} idle, nothing to do"),
        ]
    )
    monkeypatch.setattr("tacc_agent.health.cycle.apply_to_slurm", lambda *_: next(said))
    gauges = []
    for _ in range(3):
        daemon.cycle()
        gauges += parse_exposition(daemon.exposition().decode())[
            "tacc_agent_slurm_drained_by_agent"
        ]
    assert gauges == [f"tacc_agent_slurm_drained_by_agent {v}" for v in ("1.0", "1.0", "0.0")]
