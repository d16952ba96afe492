"""Helpers for tests that boot real lab nodes."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import BIN, ROOT, run_cli


def lab_cli(name: str, *argv: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run_cli("tacc-lab", "--name", name, *argv, timeout=timeout)


def lab_status(name: str) -> dict:
    proc = lab_cli(name, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ansible(inventory: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    return subprocess.run(
        [str(BIN / "ansible"), "-i", str(inventory), *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def node_sh(name: str, node: str, script: str) -> subprocess.CompletedProcess:
    return lab_cli(name, "ssh", node, "sh", "-c", script, timeout=120)


def host_leftovers(name: str, state_dir: Path) -> list[str]:
    """Everything a lab could leave on the host; empty when down was complete."""
    found = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    for line in links.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0]
        if ifname == f"tacc-{name}" or ifname.startswith(f"vb-{name}-"):
            found.append(f"interface {ifname}")
    mounts = Path("/proc/self/mounts").read_text()
    found += [f"mount {m}" for m in mounts.split() if m.startswith(str(state_dir))]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(state_dir) in cmdline:
                found.append(f"process {proc.name}: {cmdline[:80]}")
    if state_dir.exists():
        found.append(f"directory {state_dir}")
    return found
