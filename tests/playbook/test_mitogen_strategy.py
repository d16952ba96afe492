"""plugins/strategy/mitogen_linear.py (make demo's strategy; `make venv` installs Mitogen):
ansible.cfg finds it, and a play under it runs modules, check mode and handlers as linear does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import MITOGEN, ansible_env

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: true
  gather_subset: [min]
  tasks:
    - name: Write a file
      ansible.builtin.copy:
        content: "one\\n"
        dest: "{{ target }}"
        mode: "0644"
      notify: Say it changed
    - name: Read the facts the roles use
      ansible.builtin.assert:
        that:
          - ansible_facts['os_family'] | length > 0
          - ansible_facts['architecture'] | length > 0
  handlers:
    - name: Say it changed
      ansible.builtin.debug:
        msg: handler ran
"""


def run_play(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    # The strategy named here too: this module is its proof, whatever the default.
    env = ansible_env(
        tmp_path / "facts", ANSIBLE_STRATEGY=MITOGEN, ANSIBLE_INVENTORY_UNPARSED_WARNING="false"
    )
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", str(play)]
    # As the lab inventory does (ansible_python_interpreter): under a local connection
    # Mitogen could not start the interpreter that auto discovery picked (EOF on stream).
    argv += ["-e", f"ansible_python_interpreter={sys.executable}"]
    argv += ["-e", f"target={tmp_path / 'out.txt'}", *extra]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, check=False)


def test_play_runs_under_mitogen_then_changes_nothing(tmp_path: Path) -> None:
    check = run_play(tmp_path, "--check")
    assert check.returncode == 0, check.stdout + check.stderr
    assert not (tmp_path / "out.txt").exists()
    first = run_play(tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "handler ran" in first.stdout
    assert (tmp_path / "out.txt").read_text() == "one\n"
    again = run_play(tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "changed=0" in again.stdout
    assert "handler ran" not in again.stdout
