"""docs/day-one.md ([21]): every command block is claimed, by the test that runs it or by
test_day_one.py (which runs the rest in the hw lab), and the steps only those two cover
are proven here: `make test` makes the venv first, the vault example holds what the
example inventory reads and encrypts."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.integration.day_one_doc import PLACES, missing_lines, read_blocks

BLOCKS = read_blocks()


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_doc_has_numbered_steps_each_with_a_command_block() -> None:
    steps = [
        line[3:]
        for line in (ROOT / "docs/day-one.md").read_text().splitlines()
        if line.startswith("## ")
    ]
    assert [int(step.split(".")[0]) for step in steps] == list(range(1, len(steps) + 1)), steps
    assert {block.step for block in BLOCKS} == set(steps)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda block: f"line{block.line}")
def test_every_block_says_where_it_runs_and_who_runs_it(block) -> None:
    assert block.on in PLACES, f"day-one.md:{block.line}: `# on:` must be one of {sorted(PLACES)}"
    assert not (block.run_by and block.by_hand), (
        f"day-one.md:{block.line}: run by a test or by hand"
    )
    assert not block.by_hand or block.step.startswith("1. "), (
        f"day-one.md:{block.line}: only the machines themselves (step 1) are done by hand"
    )
    assert block.script.strip(), f"day-one.md:{block.line}: no command"


@pytest.mark.parametrize("target", sorted({t for block in BLOCKS for t in block.run_by}), ids=str)
def test_every_test_a_block_names_exists(target: str) -> None:
    path, _, name = target.partition("::")
    assert (ROOT / path).is_file(), f"{path} does not exist"
    assert name in defined_names(ROOT / path), f"{path} defines no {name}"


def test_a_block_naming_a_missing_test_is_caught() -> None:
    doc = "## 1. x\n\n```sh\n# on: admin\n# run by: tests/nowhere.py::test_x\ntrue\n```\n"
    (block,) = read_blocks(doc)
    assert block.run_by == ("tests/nowhere.py::test_x",) and not block.runs_here
    assert not (ROOT / "tests/nowhere.py").exists()


def test_expected_lines_match_in_order_with_dots_for_anything() -> None:
    output = "Slurmctld(primary) at n1 is UP\nn2 idle none\nn3 idle none\n"
    assert missing_lines(("Slurmctld(primary) at n1 is UP", "n3 idle ..."), output) == []
    assert missing_lines(("n3 idle ...", "n2 idle none"), output) == ["n2 idle none"]
    assert missing_lines(("...down...",), output) == ["...down..."]


def test_an_unclosed_fence_is_an_error_naming_its_line() -> None:
    with pytest.raises(ValueError, match=r"day-one.md:3: a fence that is never closed"):
        read_blocks("## 1. x\n\n```sh\n# on: admin\ntrue\n")


def make_prerequisites(target: str) -> list[str]:
    found = re.search(rf"^{re.escape(target)}:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert found, f"Makefile has no {target} target"
    return found.group(1).split()


def test_make_venv_is_the_first_thing_make_test_does() -> None:
    """Step 2: `make test` (what .ci/run calls) builds the venv first and runs lint (which
    needs it too) beside pytest."""
    assert make_prerequisites("test")[:1] == ["venv"]
    assert make_prerequisites("lint")[:1] == ["venv"]
    recipe = (ROOT / "Makefile").read_text().split("\ntest: venv\n", 1)[1].split("\n\n", 1)[0]
    assert "$(LINT)" in recipe and "pytest" in recipe and "$(MAKE)" not in recipe
    assert "\nlint: venv\n\t$(LINT)\n" in (ROOT / "Makefile").read_text()


def test_the_vault_example_holds_every_vault_variable_and_encrypts(tmp_path) -> None:
    """Step 3: every vault_ variable the example inventory reads is in vault.yml.example,
    and the copy encrypts and reads back the same with the password file named in the
    environment, as the doc sets it."""
    group_vars = ROOT / "inventory/example/group_vars"
    example = group_vars / "all/vault.yml.example"
    read = {
        name
        for path in group_vars.rglob("*.yml")
        for name in re.findall(r"\bvault_\w+", path.read_text())
    }
    held = set(yaml.safe_load(example.read_text()))
    assert read and read <= held, sorted(read - held)
    vault = tmp_path / "vault.yml"
    shutil.copy(example, vault)
    password = tmp_path / "password"
    password.write_text("day-one\n")
    password.chmod(0o600)
    env = {**os.environ, "ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    vault_tool = str(BIN / "ansible-vault")
    subprocess.run([vault_tool, "encrypt", str(vault)], check=True, capture_output=True, env=env)
    assert vault.read_text().startswith("$ANSIBLE_VAULT;1.1;AES256")
    shown = subprocess.run(
        [vault_tool, "view", str(vault)], check=True, capture_output=True, text=True, env=env
    )
    assert shown.stdout == example.read_text()
