"""The primary slurmctld's ExecStartPre with a backup controller (roles/slurm,
templates/slurmctld-take-back.sh.j2; issue [21]): run as rendered, against a shared state
folder with Slurm's heartbeat file and stand-ins for `scontrol` and `squeue` that answer
as a backup in control does (REQUEST_SHUTDOWN: it saves job_state and stops answering).

Without it the primary that comes back reads the state of before the takeover (Slurm
24.11's backup saves only after it answered REQUEST_CONTROL): the lab's failover test
saw jobs that had ended under the backup running again."""

from __future__ import annotations

import os
import shlex
import struct
import subprocess
import time
from pathlib import Path

import pytest
from jinja2 import Environment, FileSystemLoader, StrictUndefined

from tests.conftest import ROOT

TIMEOUT = 15  # SlurmctldTimeout

# The backup in control: `scontrol shutdown slurmctld` saves job_state, then it is gone.
SCONTROL = """#!/bin/sh
echo "$*" >> "$STATE/calls"
[ "$*" = "shutdown slurmctld" ] || exit 2
sleep 0.3; touch "$STATE/job_state"; touch "$STATE/stopped"
exit 1
"""
SQUEUE = """#!/bin/sh
[ ! -e "$STATE/stopped" ] || exit 1
echo 42
"""


def render(state: Path) -> str:
    env = Environment(  # noqa: S701 (a shell script, not HTML; as Ansible renders it)
        loader=FileSystemLoader(ROOT / "roles/slurm/templates"),
        undefined=StrictUndefined,
        trim_blocks=True,
    )
    env.filters["quote"] = shlex.quote
    return env.get_template("slurmctld-take-back.sh.j2").render(
        ansible_managed="Ansible managed",
        slurm_state_save_location=str(state),
        slurm_slurmctld_timeout=TIMEOUT,
    )


@pytest.fixture
def node(tmp_path) -> dict:
    """The shared state folder, the script, and a PATH with the stand-ins first."""
    state, bin_dir = tmp_path / "state dir", tmp_path / "bin"
    state.mkdir()
    bin_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("squeue", SQUEUE)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    script = tmp_path / "take-back"
    script.write_text(render(state))
    script.chmod(0o755)
    (state / "job_state").touch()
    old = time.time() - 600
    os.utime(state / "job_state", (old, old))
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    return {"state": state, "script": script, "env": env}


def heartbeat(state: Path, age: float, index: int) -> None:
    """As slurmctld's heartbeat thread writes it: the time, then the writer's index."""
    (state / "heartbeat").write_bytes(struct.pack(">QQ", int(time.time() - age), index))


def take_back(node: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node["script"]], env=node["env"], capture_output=True, text=True, timeout=60
    )


def calls(node: dict) -> list[str]:
    path = node["state"] / "calls"
    return path.read_text().splitlines() if path.exists() else []


def test_a_backup_in_control_saves_and_stops_before_the_primary_starts(node):
    heartbeat(node["state"], age=2, index=1)
    run = take_back(node)
    assert run.returncode == 0, run.stderr
    assert calls(node) == ["shutdown slurmctld"]
    assert "backup controller 1 is in control" in run.stdout
    assert "saved its state and stopped: taking control" in run.stdout
    assert (node["state"] / "stopped").exists()


@pytest.mark.parametrize(
    ("age", "index", "case"),
    [
        (2, 0, "the primary wrote the heartbeat last (a restart of the primary)"),
        (4 * TIMEOUT, 1, "a backup was in control but stopped beating (both were down)"),
    ],
)
def test_nothing_is_asked_when_no_backup_is_in_control(node, age, index, case):
    heartbeat(node["state"], age=age, index=index)
    run = take_back(node)
    assert run.returncode == 0, run.stderr
    assert calls(node) == [], case


def test_a_first_start_with_no_heartbeat_yet_goes_ahead(node):
    run = take_back(node)
    assert run.returncode == 0 and calls(node) == [], run.stderr
