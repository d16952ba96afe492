"""tacc-lab's command line as a person expects it: `tacc-lab ssh NODE 'cmd; cmd'` runs
like ssh (the words after NODE joined with spaces, run by the node's shell), and usage
errors (a bad node name, a bad path argument) exit 2 as argparse does, in one line,
without a traceback and without touching anything.

No lab is booted: a fake `ssh` first on PATH stands in for the node; it runs the command
line it is given with `sh -c`, as sshd hands it to the user's login shell."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tacc_lab.config import LabConfig
from tacc_lab.nodes import ssh_command_argv
from tacc_lab.state import LabState, NodeRecord, save_state
from tests.conftest import run_cli

FAKE_SSH = """#!/bin/sh
# argv as the fake received it, one word a line, then the command line run by a shell.
for word in "$@"; do printf '%s\\n' "$word" >> "$FAKE_SSH_ARGV"; done
while [ "$#" -gt 0 ] && [ "$1" != "--" ]; do shift; done
[ "$#" -gt 0 ] || exit 0
shift
exec sh -c "$1"
"""


@pytest.fixture
def lab(tmp_path) -> LabConfig:
    """A lab whose state says n1 runs (nothing boots)."""
    cfg = LabConfig.create("lab", "10.77.0.0/24", state_root=tmp_path / "state")
    state = LabState(subnet="10.77.0.0/24")
    state.nodes["n1"] = NodeRecord(name="n1", index=1, address="10.77.0.11")
    save_state(cfg.state_file, state)
    return cfg


@pytest.fixture
def fake_ssh(tmp_path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH)
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_SSH_ARGV": str(tmp_path / "argv"),
        "TACC_LAB_STATE_ROOT": str(tmp_path / "state"),
    }


def ssh_argv(env: dict[str, str]) -> list[str]:
    return Path(env["FAKE_SSH_ARGV"]).read_text().splitlines()


def test_ssh_command_line_is_the_words_joined_with_spaces(lab):
    argv = ssh_command_argv(lab, "10.77.0.11", ["sinfo", "-N;", "squeue"], tty=False)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv
    assert argv[-4:] == ["-T", "root@10.77.0.11", "--", "sinfo -N; squeue"]
    assert ssh_command_argv(lab, "10.77.0.11", [], tty=True)[-2:] == ["-t", "root@10.77.0.11"]


@pytest.mark.parametrize(
    ("words", "stdout"),
    [
        (["echo a; echo b"], "a\nb\n"),  # one quoted argument: two commands
        (["sinfo -N >/dev/null 2>&1 || echo ran"], "ran\n"),  # was "command not found"
        (["echo", "x  y"], "x y\n"),  # unquoted words: the shell splits them again, as ssh
        (["echo", "'x  y'"], "x  y\n"),  # quoted by the caller (shlex.join): kept
    ],
)
def test_ssh_runs_the_command_line_like_ssh(lab, fake_ssh, words, stdout):
    proc = run_cli("tacc-lab", "ssh", "n1", *words, env=fake_ssh)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, stdout, "")
    assert ssh_argv(fake_ssh)[-3:] == ["root@10.77.0.11", "--", " ".join(words)]


def test_a_command_line_starting_with_a_dash_is_not_an_ssh_option(lab, fake_ssh):
    run_cli("tacc-lab", "ssh", "n1", "-V", env=fake_ssh)
    assert ssh_argv(fake_ssh)[-2:] == ["--", "-V"]


def test_ssh_without_a_command_opens_a_shell(lab, fake_ssh):
    proc = run_cli("tacc-lab", "ssh", "n1", env=fake_ssh)
    assert proc.returncode == 0, proc.stderr
    assert ssh_argv(fake_ssh)[-1] == "root@10.77.0.11" and "--" not in ssh_argv(fake_ssh)


def test_ssh_exit_status_is_the_commands(lab, fake_ssh):
    assert run_cli("tacc-lab", "ssh", "n1", "exit 7", env=fake_ssh).returncode == 7


def assert_usage_error(proc, message: str, state: Path) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert message in proc.stderr, proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not state.exists() or {p.name for p in state.rglob("*")} <= {"lab", "state.json"}


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["ssh", "node1", "true"], "argument node: 'node1' is not a lab node name"),
        (["ssh", "n0"], "'n0' is not a lab node name; nodes are n1, n2, ... and login1"),
        (["ssh", "n1;reboot"], "'n1;reboot' is not a lab node name"),
        (["poweroff", "login2"], "'login2' is not a lab node name"),
        (["fake-hw", "N1", "--gpus", "2"], "'N1' is not a lab node name"),
        (["ssh", "n7", "true"], "no node 'n7' in lab 'lab'; nodes are: n1"),
        (["poweroff", "login1"], "no node 'login1' in lab 'lab'; nodes are: n1"),
        (["fake-hw", "n2", "--gpus", "2"], "no node 'n2' in lab 'lab'; nodes are: n1"),
        (["reimage", "n-1", "--os", "trixie"], "'n-1' is not a lab node name"),
        (["reimage", "n2", "--os", "trixie"], "no node 'n2' in lab 'lab'; nodes are: n1"),
        (["reimage", "n1", "--os", "sid"], "argument --os:"),
        (["reimage", "n1"], "the following arguments are required: --os"),
    ],
)
def test_bad_node_name_is_a_usage_error(lab, tmp_path, argv, message):
    proc = run_cli("tacc-lab", *argv, env={"TACC_LAB_STATE_ROOT": str(tmp_path / "state")})
    assert_usage_error(proc, message, tmp_path / "state")
    assert not (tmp_path / "state/lab/nodes").exists()  # no FAKE hardware, no power cut


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        ("{tmp}", "is a directory; give the file to write"),
        ("{tmp}/hosts.yml/", "is a directory; give the file to write"),
        ("{tmp}/hosts.ini", "must end in .yml or .yaml"),
        ("{tmp}/hosts", "must end in .yml or .yaml"),
        ("", "argument --inventory: is empty; give the inventory file to write"),
        ("{tmp}/a-file/hosts.yml", "which is a file, not a directory"),
        ("{tmp}/a-file/deeper/hosts.yml", "which is a file, not a directory"),
    ],
)
def test_bad_inventory_path_is_a_usage_error(tmp_path, inventory, message):
    (tmp_path / "hosts.yml").mkdir()
    (tmp_path / "a-file").write_text("")
    path = inventory.format(tmp=tmp_path)
    state = tmp_path / "state"
    proc = run_cli(
        "tacc-lab",
        "up",
        "--nodes",
        "1",
        "--inventory",
        path,
        env={"TACC_LAB_STATE_ROOT": str(state)},
    )
    assert_usage_error(proc, message, state)
    assert "argument --inventory:" in proc.stderr
    assert not state.exists()  # refused before anything, not even the lab's directory


def test_lab_that_is_not_up_is_not_a_usage_error(tmp_path):
    """Not a bad argument but a state to fix (`tacc-lab up`): exit 1, as before."""
    proc = run_cli(
        "tacc-lab", "ssh", "n1", "true", env={"TACC_LAB_STATE_ROOT": str(tmp_path / "state")}
    )
    assert proc.returncode == 1 and "is not up" in proc.stderr
