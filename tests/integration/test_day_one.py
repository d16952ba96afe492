"""Issue [21] point 5: docs/day-one.md's commands, run as written and in order on the hw
lab after site_from_nothing.py built it from the bare image (the blocks that name a test
of their own are that test's: tests/unit/repo/test_day_one_doc.py checks both). Each
block runs where it says: `admin` here in the checkout against the lab's inventory, a
host of the example inventory on the lab node that stands for it, `laptop` here as the
directory user carol with tcloud; what it prints must hold the doc's `text` lines."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest

from tacc_lab.config import STATE_ROOT
from tests.conftest import BIN, ROOT
from tests.integration.day_one_doc import LAB_NAMES, Block, missing_lines, read_blocks
from tests.integration.lab_helpers import ansible_env, node_address, node_sh
from tests.integration.labs import HW

pytestmark = pytest.mark.lab

NAME = HW.name
RESEARCHER = "carol"  # in the directory, in the mapped group vision
LOGIN_HOST = "login1.example.org"  # the doc's name for the login node, for tcloud
BLOCKS = [block for block in read_blocks() if block.runs_here]


@pytest.fixture(scope="module")
def site(site_from_nothing) -> dict:
    return site_from_nothing


def lab_words(text: str, replacements: dict[str, str]) -> str:
    """`text` with the example inventory's names (and `replacements`) made the lab's."""
    for old, new in replacements.items():
        text = text.replace(old, new)
    return re.sub(r"\b(" + "|".join(LAB_NAMES) + r")\b", lambda m: LAB_NAMES[m.group(1)], text)


def run_here(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
    )


def run_block(block: Block, site: dict, tmp_path) -> tuple[subprocess.CompletedProcess, str]:
    inventory = site["inventory"]
    lab = STATE_ROOT / NAME
    key = lab / "users" / RESEARCHER / "id_ed25519"
    address = node_address(NAME, LAB_NAMES["login1"])
    login = f"{address} --key {key} --known-hosts {lab / 'ssh/known_hosts'}"
    replacements = {
        "inventory/mycluster": str(inventory),
        "/tmp/review": str(tmp_path / "review"),
        LOGIN_HOST: login,
    }
    script = lab_words(block.script, replacements)
    if block.on == "admin":
        return run_here(script, ansible_env(inventory)), script
    if block.on == "laptop":
        env = {
            **os.environ,
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "TCLOUD_CONFIG": str(tmp_path / "tcloud.yaml"),
            "TCLOUD_CACHE_DIR": str(tmp_path / "cache"),
        }
        return run_here(script, env), script
    wrapped = "exec 2>&1\n" + script  # the doc's output is what a terminal shows
    return node_sh(
        NAME, LAB_NAMES[block.on], shlex.join(["bash", "-euo", "pipefail", "-c", wrapped])
    ), script


@pytest.mark.parametrize(
    "block", BLOCKS, ids=lambda block: f"step{block.step.split('.')[0]}-line{block.line}"
)
def test_day_one_block_runs_as_written(block: Block, site, tmp_path):
    run, script = run_block(block, site, tmp_path)
    output = run.stdout + run.stderr
    assert run.returncode == 0, (
        f"day-one.md:{block.line} on {block.on}:\n{script}\n{output[-3000:]}"
    )
    expect = tuple(lab_words(line, {}) for line in block.expect)
    missing = missing_lines(expect, output)
    assert not missing, f"day-one.md:{block.line}: missing {missing} in:\n{output[-3000:]}"
