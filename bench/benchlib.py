"""Shared by the bench scripts: run a tool from the venv, drive the bench lab, and write
the numbers as JSON (`--json PATH`) for bench/report.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
NAME = "bench"
SUBNET = "10.77.7.0/24"


def compile_packages() -> None:
    """Bytecode for the project's packages, as a pip install of them has: the venv's
    packages are the source tree (editable), and where PYTHONDONTWRITEBYTECODE is set (this
    machine's environment sets it) every tcloud start would compile what it imports from
    source again, about 30 ms that no installed tcloud pays. compileall writes them
    whatever that variable says."""
    sh([sys.executable, "-m", "compileall", "-q", str(ROOT / "packages")])


def agent_metrics_port() -> int:
    """The node agent's /metrics port, as roles/tacc_agent declares it."""
    defaults = yaml.safe_load((ROOT / "roles/tacc_agent/defaults/main.yml").read_text())
    return int(defaults["tacc_agent_metrics_port"])


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
    # One command line for the node's shell, as with ssh: the script quoted for sh -c.
    command = shlex.join(["sh", "-c", script])
    return sh([str(BIN / "tacc-lab"), "--name", NAME, "ssh", node, command]).stdout


def children_cpu_seconds() -> float:
    """User + system CPU of every child this process has waited for (ansible-playbook and
    the processes it waited for: its workers and their SSH clients)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def node_cpu_seconds(name: str | None = None) -> float:
    """CPU the lab's nodes have used so far: every process under their systemd-nspawn, with
    what each has reaped (/proc/PID/stat utime, stime, cutime, cstime)."""
    marker = f"/tacc-lab/{name or NAME}/nodes/"
    parent, used, roots = {}, {}, []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        used[pid] = sum(int(value) for value in fields[11:15])
        if cmdline.startswith(b"systemd-nspawn\0") and marker.encode() in cmdline:
            roots.append(pid)
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, list(roots)
    while stack:
        pid = stack.pop()
        total += used[pid]
        stack += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


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


def summary(values: list[float]) -> dict:
    """mean / median / min / max / stdev (0 for fewer than 2 values) and the values."""
    return {
        "n": len(values),
        "mean": statistics.mean(values),
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": [round(v, 4) for v in values],
    }


def add_json_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", metavar="PATH", help="also write the numbers (and this command) as JSON"
    )


def command_line(argv: list[str] | None = None) -> str:
    """The command that reproduces this run, from the repository root (without --json)."""
    args, rest = [], list(sys.argv[1:] if argv is None else argv)
    while rest:
        arg = rest.pop(0)
        if arg == "--json":
            rest[:1] = []
        elif not arg.startswith("--json="):
            args.append(arg)
    script, python = Path(os.path.abspath(sys.argv[0])), Path(os.path.abspath(sys.executable))
    with_root = [p.relative_to(ROOT) if p.is_relative_to(ROOT) else p for p in (script, python)]
    return shlex.join([str(with_root[1]), "-u", str(with_root[0]), *args])


def short_reason(exc: BaseException) -> str:
    """One or two lines on why a bench run stopped: the first line of the message and, for
    a failed tool, the last line of its output that names the error."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    text = exc.code if isinstance(exc, SystemExit) else f"{type(exc).__name__}: {exc}"
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first = lines[0].removeprefix("bench: ")
    named = re.compile(r"fatal|error|failed|refused|timed? ?out", re.I)
    detail = [line for line in lines[1:] if named.search(line)]
    last = (detail or lines[1:] or [""])[-1]
    return " / ".join(part[:300] for part in (first, last) if part)


class Record(dict):
    """A bench script's numbers. With a path, every top-level assignment rewrites the JSON
    file (atomically), so a run that fails part-way still leaves what it measured; leaving
    the `with` block marks it complete, or records the short reason it stopped."""

    def __init__(self, path: str | None, **fields) -> None:
        super().__init__(command=command_line(), complete=False, **fields)
        self.path = Path(path) if path else None

    def __setitem__(self, key: str, value) -> None:
        super().__setitem__(key, value)
        self.save()

    def update(self, *args, **fields) -> None:
        super().update(*args, **fields)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(self, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)

    def __enter__(self) -> Record:
        self.save()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self["complete"] = True
        else:
            self["error"] = short_reason(exc)
        return False


def ticker(stop: threading.Event, log: dict, config: str = "/root/las.yaml") -> None:
    """The daemon's queue tick (the same `tick` function), every 2 s, as root on n1. A
    failed tick (ssh under load) is counted, never the end of the loop."""
    argv = [
        str(BIN / "tacc-lab"),
        "--name",
        NAME,
        "ssh",
        "n1",
        "tacc-agent",
        "--config",
        config,
        "queue-tick",
    ]
    while not stop.wait(2):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        try:
            log["changes"] += json.loads(proc.stdout)["changes"]
            log["ticks"] += 1
        except (ValueError, KeyError):
            log["failed_ticks"] += 1
