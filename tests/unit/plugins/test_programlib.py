"""tacc_plugins.programlib: the libraries plug-ins hand to the user's program are copied
into the job's own directory and found first on its PYTHONPATH; they import nothing but
the standard library (they run in the program's Python, not the agent's)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tacc_contract.plugins import Launch
from tacc_plugins import programlib
from tests.unit.agent.tasks.schedule.test_plugin_contract import project_imports


def launch_in(job_dir: Path, rank: int = 0, env: dict | None = None) -> Launch:
    return Launch(None, rank, ["n2"], ["10.0.0.2"], "7", dict(env or {}), job_dir=job_dir)


@pytest.fixture
def probe_module(monkeypatch, tmp_path) -> str:
    source = tmp_path / "src"
    source.mkdir()
    (source / "tacc_probe.py").write_text("VALUE = 1\n")
    monkeypatch.setattr(programlib, "HERE", source)
    return "tacc_probe"


def test_the_module_is_copied_into_the_job_and_put_first_on_pythonpath(tmp_path, probe_module):
    launch = launch_in(tmp_path, env={"PYTHONPATH": "/mine"})
    copy = programlib.install(launch, probe_module)
    assert copy == tmp_path / ".tacc/lib/tacc_probe.py"
    assert copy.read_text() == "VALUE = 1\n"
    assert launch.env["PYTHONPATH"] == f"{tmp_path / '.tacc/lib'}{os.pathsep}/mine"
    assert (tmp_path / ".tacc/lib").stat().st_mode & 0o077 == 0  # the user's own


def test_a_second_rank_leaves_an_equal_copy_and_pythonpath_as_they_are(tmp_path, probe_module):
    first = launch_in(tmp_path)
    programlib.install(first, probe_module)
    before = (tmp_path / ".tacc/lib/tacc_probe.py").stat().st_mtime_ns
    second = launch_in(tmp_path, rank=1, env=first.env)
    programlib.install(second, probe_module)
    assert (tmp_path / ".tacc/lib/tacc_probe.py").stat().st_mtime_ns == before
    assert second.env["PYTHONPATH"] == str(tmp_path / ".tacc/lib")
    assert sorted(p.name for p in (tmp_path / ".tacc/lib").iterdir()) == ["tacc_probe.py"]


@pytest.mark.security
def test_a_link_planted_at_the_copys_path_is_replaced_not_written_through(tmp_path, probe_module):
    """The copy is written beside and renamed over: a link at its path is replaced, so
    the write never lands where the link points."""
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text("untouched\n")
    lib = tmp_path / "job/.tacc/lib"
    lib.mkdir(parents=True)
    (lib / "tacc_probe.py").symlink_to(elsewhere)
    programlib.install(launch_in(tmp_path / "job"), probe_module)
    assert elsewhere.read_text() == "untouched\n"
    assert not (lib / "tacc_probe.py").is_symlink()


def test_every_program_library_imports_only_the_standard_library():
    libraries = sorted(p for p in Path(programlib.HERE).glob("*.py") if p.name != "__init__.py")
    problems = [
        f"{path}:{line}: imports {module}"
        for path in libraries
        for line, module in project_imports(path)
        if module not in sys.stdlib_module_names
    ]
    assert not problems, "\n".join(problems)
