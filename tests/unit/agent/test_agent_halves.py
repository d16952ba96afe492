"""The agent's two jobs apart (issue [11]): node health (tacc_agent.health) and the task
backend (tacc_agent.tasks) import nothing of each other; what both need sits beside them
(config, errors, slurm, rdma_sysfs) and the CLI composes them (it hands the
controller's daemon, serve.py, its queue round; serve.py imports the health half only)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

AGENT = Path(__file__).resolve().parents[3] / "packages" / "agent" / "tacc_agent"
HALVES = {"health": "tacc_agent.tasks", "tasks": "tacc_agent.health"}


def imported(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)]
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


@pytest.mark.parametrize("half", sorted(HALVES))
def test_a_half_of_the_agent_does_not_import_the_other(half):
    other = HALVES[half]
    crossings = [
        f"{path.relative_to(AGENT.parent)}:{line}: {name}"
        for path in sorted((AGENT / half).rglob("*.py"))
        for line, name in imported(path)
        if name == other or name.startswith(f"{other}.")
    ]
    assert crossings == []


def test_the_scan_sees_a_crossing(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from tacc_agent.tasks.jobs import records\n")
    assert (2, "tacc_agent.tasks.jobs.records") in imported(probe)
