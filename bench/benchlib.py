"""Shared by the bench scripts: run a tool from the venv, drive the bench lab."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NAME = "bench"
SUBNET = "10.77.7.0/24"


def sh(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run argv from the repo root with the venv on PATH; exit with its output on failure."""
    full_env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", **(env or {})}
    proc = subprocess.run(argv, capture_output=True, text=True, env=full_env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        sys.exit(f"bench: `{' '.join(argv)}` failed:\n{proc.stdout[-4000:]}{proc.stderr}")
    return proc


def lab_up(nodes: int, inventory: Path, env: dict[str, str] | None = None) -> None:
    argv = ["--name", NAME, "up", "--nodes", str(nodes), "--subnet", SUBNET]
    sh([str(BIN / "tacc-lab"), *argv, "--inventory", str(inventory)], env)


def lab_down(env: dict[str, str] | None = None) -> None:
    sh([str(BIN / "tacc-lab"), "--name", NAME, "down"], env)


def node_sh(node: str, script: str) -> str:
    return sh([str(BIN / "tacc-lab"), "--name", NAME, "ssh", node, "sh", "-c", script]).stdout


def playbook(inventory: Path, playbook_path: str, *extra: str) -> tuple[float, dict[str, int]]:
    """Seconds an ansible-playbook run took, and changed= per host from its recap."""
    env = {
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(inventory.parent / "facts"),
    }
    start = time.monotonic()
    proc = sh([str(BIN / "ansible-playbook"), "-i", str(inventory), playbook_path, *extra], env)
    seconds = time.monotonic() - start
    changed = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)
    }
    return seconds, changed
