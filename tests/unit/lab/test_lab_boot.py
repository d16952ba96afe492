"""How `tacc-lab up` reads a node's boot: only this run's console output counts.

A node's console log is appended to across power cuts; the CI failure this pins was an
old run's last line ("Attempted to remove disk file system ...") read as the reason a
new boot ended, which turned a silent early exit (retried once) into an error."""

import subprocess
import sys
from pathlib import Path

import pytest

from tacc_lab import nodes
from tacc_lab.errors import LabError
from tacc_lab.nodes import Boot, wait_for_ssh
from tacc_lab.state import NodeRecord

NODE = NodeRecord(name="n3", index=3, address="10.77.99.13")


def boot_of(log: Path, script: str) -> Boot:
    with log.open("ab") as out:
        offset = out.tell()
        proc = subprocess.Popen([sys.executable, "-c", script], stdout=out, stderr=out)
    return Boot(proc, log, offset)


@pytest.fixture
def console(tmp_path, monkeypatch):
    monkeypatch.setattr(nodes, "_port_open", lambda address: True)
    monkeypatch.setattr(nodes, "_ssh_ok", lambda cfg, node: True)
    log = tmp_path / "console.log"
    log.write_text("n3 login: Attempted to remove disk file system, and we can't allow that.\n")
    return log


def test_a_silent_exit_after_an_older_runs_words_is_booted_again(console, capsys):
    first = boot_of(console, "pass")
    first.process.wait()
    again = []

    def boot_again(node):
        again.append(node.name)
        return boot_of(console, "import time; time.sleep(30)")

    boots = {"n3": first}
    wait_for_ssh(None, boots, [NODE], timeout=10, boot_again=boot_again)
    assert again == ["n3"]
    assert "ended while booting (exit status 0) without a word" in capsys.readouterr().out
    boots["n3"].process.kill()


def test_an_exit_with_words_names_its_status_and_only_this_runs_words(console, monkeypatch):
    monkeypatch.setattr(nodes, "_port_open", lambda address: False)  # it never answers
    boot = boot_of(console, "import sys; print('Failed to add veth: File exists'); sys.exit(1)")
    with pytest.raises(LabError) as error:
        wait_for_ssh(None, {"n3": boot}, [NODE], timeout=10, boot_again=lambda n: 1 / 0)
    text = str(error.value)
    assert "exit status 1" in text and "Failed to add veth: File exists" in text
    assert "Attempted to remove" not in text


def test_a_second_silent_exit_is_an_error(console, monkeypatch):
    monkeypatch.setattr(nodes, "_port_open", lambda address: False)

    def silent(node=None):
        return boot_of(console, "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")

    with pytest.raises(LabError, match=r"killed by signal 9\): nothing in its console log"):
        wait_for_ssh(None, {"n3": silent()}, [NODE], timeout=10, boot_again=silent)
