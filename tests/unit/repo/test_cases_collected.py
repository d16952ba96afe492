"""A test in a `*_cases.py` module runs only when a test module imports it (the cases run
on a lab that module owns): one never imported proves nothing and fails nobody. This
guard fails for every such test that no `tests/integration/test_*.py` module imports."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

INTEGRATION = ROOT / "tests/integration"


def defined_tests(path: Path) -> set[str]:
    """The test functions and Test classes a module defines at its top level."""
    tree = ast.parse(path.read_text(), filename=str(path))
    functions = (ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        node.name
        for node in tree.body
        if (isinstance(node, functions) and node.name.startswith("test"))
        or (isinstance(node, ast.ClassDef) and node.name.startswith("Test"))
    }


def imported_from(path: Path, module: str) -> set[str]:
    """The names `path` imports from tests.integration.<module>."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == f"tests.integration.{module}"
        for alias in node.names
    }


def uncollected(directory: Path = INTEGRATION) -> dict[str, set[str]]:
    """cases module -> its tests that no test module of `directory` imports."""
    test_modules = sorted(directory.glob("test_*.py"))
    missing = {}
    for cases in sorted(directory.glob("*_cases.py")):
        collected = set().union(*(imported_from(path, cases.stem) for path in test_modules))
        left = defined_tests(cases) - collected
        if left:
            missing[cases.name] = left
    return missing


def test_every_case_in_a_cases_module_is_collected_by_a_test_module():
    assert uncollected() == {}


def test_the_guard_sees_a_case_no_module_imports(tmp_path):
    """The guard itself: a cases module with one collected and one forgotten test."""
    (tmp_path / "demo_cases.py").write_text("def test_kept(): pass\ndef test_forgotten(): pass\n")
    (tmp_path / "test_demo.py").write_text(
        "from tests.integration.demo_cases import test_kept  # noqa: F401\n"
    )
    assert uncollected(tmp_path) == {"demo_cases.py": {"test_forgotten"}}
