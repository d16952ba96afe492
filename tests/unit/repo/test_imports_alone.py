"""Every module of the five distributions imports on its own, in a fresh interpreter: an
import cycle that only works when something else was imported first (registry ->
checks -> gpu -> registry, [19]) fails here, whatever order the suite imports in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def module_names() -> list[str]:
    """Dotted names of every module under packages/<dist>/<package>/ (not __main__,
    which runs a program when imported)."""
    names = []
    for init in sorted(ROOT.glob("packages/*/*/__init__.py")):
        base = init.parent.parent
        for path in sorted(init.parent.rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__main__":
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = module_names()


def test_the_walk_finds_every_distribution():
    assert {name.split(".")[0] for name in MODULES} == {
        "tacc_agent",
        "tacc_contract",
        "tacc_lab",
        "tacc_plugins",
        "tcloud",
    }


@pytest.mark.parametrize("module", MODULES)
def test_a_module_imports_alone_in_a_fresh_interpreter(module, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_cycle_this_guards_is_gone():
    """The one [19] named: registry.py imports checks.base, and the checks package
    itself imports nothing (the list of checks is health/catalog.py)."""
    init = ROOT / "packages/agent/tacc_agent/health/checks/__init__.py"
    lines = init.read_text().splitlines()
    assert not [line for line in lines if line.startswith(("import ", "from "))], lines
    assert Path(ROOT / "packages/agent/tacc_agent/health/catalog.py").is_file()
