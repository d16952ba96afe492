"""Fixture trees, fake tools and readers for the agent's health checks and daemon: the
unit tests of tacc-agent (test_agent_checks.py, test_agent_serve.py,
test_security_serve_logs.py) and tests/playbook/test_health_registry.py share them."""

from __future__ import annotations

import contextlib
import re
import stat
from collections.abc import Iterator
from pathlib import Path

from tacc_agent import serve
from tacc_agent.config import AgentConfig


def tool(path: Path, script: str) -> str:
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def rdma_tree(root: Path, ports: dict[str, tuple[str, str, int]]) -> str:
    for name, (state, rate, symbol_errors) in ports.items():
        port = root / "class/infiniband" / name.replace("/", "/ports/")
        (port / "counters").mkdir(parents=True)
        (port / "state").write_text(f"{state}\n")
        (port / "phys_state").write_text("5: LinkUp\n" if "ACTIVE" in state else "3: Disabled\n")
        (port / "rate").write_text(f"{rate}\n")
        (port / "counters/symbol_error").write_text(f"{symbol_errors}\n")
    return str(root)


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
    for pid, argv in (
        ("41", ["python3", "-I", "-m", "tacc_agent", "exec", "/w/j1"]),
        ("42", ["sshd", "-D"]),
    ):
        (root / pid).mkdir()
        (root / pid / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    return str(root)


def daemon_settings(config: AgentConfig) -> dict:
    """The agent.yaml keys of fixture_config that a `tacc-agent serve` process needs."""
    return {
        key: getattr(config, key)
        for key in (
            "rdma_sysfs_root",
            "nvidia_smi",
            "expected_gpus",
            "state_dir",
            "facts_file",
            "kernel_log",
            "drain",
        )
    }


def fixture_config(tmp_path: Path) -> AgentConfig:
    hdr = "200 Gb/sec (4X HDR)"
    sysfs = rdma_tree(
        tmp_path / "sys", {"mlx5_0/1": ("4: ACTIVE", hdr, 3), "mlx5_1/1": ("4: ACTIVE", hdr, 0)}
    )
    smi = tool(
        tmp_path / "smi",
        'case "$1" in --query-gpu=index,pci.bus_id) printf '
        '"0, 00000000:3B:00.0\\n1, 00000000:5E:00.0\\n";; *) exit 2;; esac\n',
    )
    return AgentConfig(
        rdma_sysfs_root=sysfs,
        nvidia_smi=smi,
        expected_gpus=2,
        expected_rdma_ports=2,
        proc_root=proc_tree(tmp_path / "proc"),
        state_dir=str(tmp_path / "state"),
        facts_file=str(tmp_path / "run/facts.json"),
        kernel_log=str(tmp_path / "kern.log"),
        services=(),
        drain=False,
        real_memory_mb=15000,
    )


@contextlib.contextmanager
def metrics_server(config: AgentConfig) -> Iterator[int]:
    """The daemon's metrics server on a free loopback port, after one check cycle."""
    daemon = serve.Daemon(config)
    daemon.cycle()
    server = serve.listen(daemon, "127.0.0.1", 0)
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
