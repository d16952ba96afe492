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

from tacc_agent.config import AgentConfig
from tacc_agent.health.cycle import SlurmOutcome
from tacc_agent.serve import Daemon
from tacc_agent.tasks import transport
from tests.unit.blocking_fuse import FSTYPE, blocking_fuse
from tests.unit.test_agent_checks import rdma_tree, tool

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(rf'^({NAME})(\{{({NAME}="(\\.|[^"\\])*",?)*\}})? (-?[0-9.e+]+|NaN)$')


def parse_exposition(text: str) -> dict[str, list[str]]:
    """Strict enough for Prometheus' text format 0.0.4: HELP and TYPE once per family,
    before its samples, every sample of the family just announced."""
    families: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("# HELP "):
            current = line.split()[2]
            assert current not in families, f"family {current} twice"
            families[current] = []
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current and kind in ("gauge", "counter")
            assert name.endswith("_total") == (kind == "counter"), name
        else:
            match = SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            assert match.group(1) == current, f"{line!r} outside its family"
            families[current].append(line)
    return families


def proc_tree(root: Path) -> str:
    (root / "self").mkdir(parents=True)
    (root / "self/mountinfo").write_text("22 1 0:21 / / rw - ext4 /dev/sda1 rw\n")
    (root / "meminfo").write_text("MemTotal:       16384000 kB\n")
    (root / "sys/kernel/random").mkdir(parents=True)
    (root / "sys/kernel/random/boot_id").write_text("b00t\n")
    for pid, argv in (("41", ["python3", "-I", "-m", "tacc_agent", "exec", "/w/j1"]),
                      ("42", ["sshd", "-D"])):  # fmt: skip
        (root / pid).mkdir()
        (root / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return str(root)


def daemon_settings(config: AgentConfig) -> dict:
    """The agent.yaml keys of fixture_config that a `tacc-agent serve` process needs."""
    return {key: getattr(config, key) for key in (
        "rdma_sysfs_root", "nvidia_smi", "expected_gpus", "state_dir", "facts_file",
        "kernel_log", "drain")}  # fmt: skip


def fixture_config(tmp_path: Path) -> AgentConfig:
    hdr = "200 Gb/sec (4X HDR)"
    sysfs = rdma_tree(tmp_path / "sys", {"mlx5_0/1": ("4: ACTIVE", hdr, 3),
                                         "mlx5_1/1": ("4: ACTIVE", hdr, 0)})  # fmt: skip
    smi = tool(tmp_path / "smi", 'case "$1" in --query-gpu=index,pci.bus_id) printf '
               '"0, 00000000:3B:00.0\\n1, 00000000:5E:00.0\\n";; *) exit 2;; esac\n')  # fmt: skip
    return AgentConfig(
        rdma_sysfs_root=sysfs, nvidia_smi=smi, expected_gpus=2, expected_rdma_ports=2,
        proc_root=proc_tree(tmp_path / "proc"), state_dir=str(tmp_path / "state"),
        facts_file=str(tmp_path / "run/facts.json"), kernel_log=str(tmp_path / "kern.log"),
        services=(), drain=False, real_memory_mb=15000,
    )  # fmt: skip


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
    assert transport.local_rdma(config) == {"active_ports": 2, "source": "agent facts"}
    families = parse_exposition(daemon.exposition().decode())
    assert families["tacc_agent_healthy"] == ["tacc_agent_healthy 1.0"]
    assert 'tacc_agent_check_status{check="rdma",status="ok"} 1.0' in families[
        "tacc_agent_check_status"]  # fmt: skip
    # prometheus_client's format: labels sorted, values as floats (2.5e+10 or, in the
    # 0.16 that Debian 12 ships, 2.5e+010)
    assert ('tacc_agent_rdma_port_errors_total{counter="symbol_error",device="mlx5_0",port="1"} 3.0'
            in families["tacc_agent_rdma_port_errors_total"])  # fmt: skip
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
    assert 'tacc_agent_check_status{check="gpu",status="fail"} 1.0' in families[
        "tacc_agent_check_status"]  # fmt: skip
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
    settings = daemon_settings(config) | {"services": [], "check_timeout_seconds": 0.3,
                 "mounts": [{"path": str(point), "fstype": FSTYPE}]}  # fmt: skip
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    with blocking_fuse(point):
        daemon = subprocess.Popen(
            [sys.executable, "-m", "tacc_agent", "serve", "--port", "0", "--interval", "0.5",
             "--config", str(tmp_path / "agent.yaml")],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            first = daemon.stdout.readline()
            port = int(re.search(r":(\d+)/metrics", first).group(1))
            deadline = time.monotonic() + 10
            runs = 0
            while time.monotonic() < deadline and runs < 3:
                start = time.monotonic()
                code, text = scrape(port)
                assert code == 200 and time.monotonic() - start < 1.0  # never waits on a check
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
    said = iter([SlurmOutcome(f"slurm: drained {daemon.node}: tacc: gpu: 2 GPU(s)", True),
                 SlurmOutcome(f"slurm: {daemon.node} already drained: tacc: gpu: 2", True),
                 SlurmOutcome(f"slurm: {daemon.node} idle, nothing to do")])  # fmt: skip
    monkeypatch.setattr("tacc_agent.health.cycle.apply_to_slurm", lambda *_: next(said))
    gauges = []
    for _ in range(3):
        daemon.cycle()
        gauges += parse_exposition(daemon.exposition().decode())[
            "tacc_agent_slurm_drained_by_agent"]  # fmt: skip
    assert gauges == [f"tacc_agent_slurm_drained_by_agent {v}" for v in ("1.0", "1.0", "0.0")]
