"""A plug-in that refuses a task with the contract's `Rejected` in a layer that runs on
the laptop (schema check, compile pass) gives a task problem (exit 3) naming its field,
not an internal error (exit 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

PLUGIN = textwrap.dedent(
    """
    from tacc_contract.errors import Rejected
    from tacc_contract.plugins import Plugin


    class RefusesAtCompile(Plugin):
        name = "refuses_compile"
        layers = ("compile",)

        def compile(self, document):
            raise Rejected("expected fewer nodes for this lab", "resources.nodes")


    class RefusesAtCheck(Plugin):
        name = "refuses_check"
        layers = ("schema",)
        default_on = False

        def check(self, task, problem):
            raise Rejected("expected a name without 'x'", "name")
    """
)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("words", "field"),
    [
        ("refusing.mod,-refuses_check", "resources.nodes"),
        ("refusing.mod,+refuses_check,-refuses_compile", "name"),
    ],
)
def test_a_plugins_refusal_is_a_task_problem(tmp_path, words, field):
    (tmp_path / "refusing").mkdir()
    (tmp_path / "refusing" / "__init__.py").write_text("")
    (tmp_path / "refusing" / "mod.py").write_text(PLUGIN)
    project = tmp_path / "project"
    project.mkdir()
    (project / "tcloud.yaml").write_text('name: x\nrun: ["true"]\n')
    env = {"PYTHONPATH": str(tmp_path), "TACC_PLUGINS": words, "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "tcloud.cli", "submit", "--dry-run", str(project)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert f": {field}: expected" in proc.stderr
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
