"""plugins/callback/jinja_plugins_preload.py: every run through ansible.cfg loads the
Jinja filter and test plug-ins once in the controller, so the worker forked for each
task and host inherits them instead of importing every plug-in again (the largest cost
of an idempotent site.yml re-run; bench/converge.py, docs/provisioning.md).

A role's filter plug-in here notes the process that imports it. The role's directory is
added when the play loads, which empties the loader's cache, as site.yml's roles do."""

from __future__ import annotations

import configparser
import subprocess
import sys
from pathlib import Path

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

FILTER = """
import os

with open({log!r}, "a") as log:
    log.write(f"{{os.getpid()}}\\n")


class FilterModule:
    def filters(self):
        return {{"twice": lambda value: value * 2}}
"""

PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles: [noting]
"""

TASKS = """
- name: One
  ansible.builtin.debug:
    msg: "{{ 1 | twice }}"
- name: Two
  ansible.builtin.debug:
    msg: "{{ 2 | twice }}"
- name: Three
  ansible.builtin.debug:
    msg: "{{ 3 | twice }}"
"""


def importers(tmp_path: Path, **env: str) -> set[str]:
    """The processes that imported the role's filter plug-in in one run of the play."""
    log = tmp_path / "imports.log"
    log.unlink(missing_ok=True)
    role = tmp_path / "roles" / "noting"
    (role / "filter_plugins").mkdir(parents=True, exist_ok=True)
    (role / "tasks").mkdir(exist_ok=True)
    (role / "filter_plugins" / "noting.py").write_text(FILTER.format(log=str(log)))
    (role / "tasks" / "main.yml").write_text(TASKS)
    (tmp_path / "play.yml").write_text(PLAY)
    argv = [str(BIN / "ansible-playbook"), "-i", "localhost,", str(tmp_path / "play.yml")]
    argv += ["-e", f"ansible_python_interpreter={sys.executable}"]
    run_env = ansible_env(
        tmp_path / "facts",
        ANSIBLE_ROLES_PATH=str(tmp_path / "roles"),
        ANSIBLE_INVENTORY_UNPARSED_WARNING="false",
        **env,
    )
    done = subprocess.run(argv, capture_output=True, text=True, env=run_env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("msg: 6") == 1  # the filter ran (ansible.cfg's YAML results)
    return set(log.read_text().split())


def test_ansible_cfg_puts_the_preload_on_every_runs_path() -> None:
    config = configparser.ConfigParser()
    config.read(ROOT / "ansible.cfg")
    paths = config["defaults"]["callback_plugins"].split(":")
    assert "plugins/callback" in paths
    assert (ROOT / "plugins/callback/jinja_plugins_preload.py").is_file()


def test_the_filter_plugins_are_imported_once_in_the_controller_not_in_each_worker(
    tmp_path: Path,
) -> None:
    assert len(importers(tmp_path)) == 1
    # Without it (an empty callback path) each task's worker imported them itself:
    # what this test would see on the old code.
    empty = tmp_path / "no-callbacks"
    empty.mkdir()
    assert len(importers(tmp_path, ANSIBLE_CALLBACK_PLUGINS=str(empty))) == 3
