"""The client installs alone, as on a researcher's laptop: an empty venv (no system site
packages), `pip install` of tacc-contract, tacc-plugins and tacc-client from this tree
(not editable; dependencies from the package index, as a researcher gets them), and
then `tcloud validate` and `tcloud submit --dry-run` work there while nothing of the
cluster or ops side came with it. About 20 s with a warm pip cache."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DISTRIBUTIONS = ("contract", "plugins", "client")
# What must not come with the client: the cluster side, the ops side and their tools.
NOT_ON_A_LAPTOP = ("ansible-core", "tacc-agent", "tacc-ops", "prometheus-client", "uv")
EXAMPLE = ROOT / "examples" / "hello"


def run(argv: list[str | Path], timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=timeout,
        check=False,
    )


def copy_source(dist: str, into: Path) -> Path:
    """The distribution's tree without build leftovers (pip builds in the source tree,
    which must stay clean for the other tests and the agent bundle)."""
    target = into / dist
    shutil.copytree(
        ROOT / "packages" / dist,
        target,
        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "*.pyc"),
    )
    return target


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("client-alone")
    venv = work / "venv"
    made = run([sys.executable, "-m", "venv", venv])
    assert made.returncode == 0, made.stderr
    sources = [copy_source(dist, work / "src") for dist in CLIENT_DISTRIBUTIONS]
    installed = run([venv / "bin" / "python", "-m", "pip", "install", "--quiet", *sources])
    assert installed.returncode == 0, (
        f"pip install of the client alone failed:\n{installed.stdout[-3000:]}"
        f"{installed.stderr[-3000:]}"
    )
    return venv


def installed_names(venv: Path) -> set[str]:
    listed = run([venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"])
    assert listed.returncode == 0, listed.stderr
    return {line.split("==")[0].lower().replace("_", "-") for line in listed.stdout.split()}


def test_the_client_alone_brings_nothing_of_the_cluster_or_ops_side(client_venv):
    names = installed_names(client_venv)
    assert {"tacc-client", "tacc-contract", "tacc-plugins", "paramiko", "pyyaml"} <= names
    assert not names & set(NOT_ON_A_LAPTOP), f"installed with the client: {names}"


@pytest.mark.parametrize("package", ["tacc_agent", "tacc_lab", "ansible"])
def test_the_agent_and_the_lab_are_not_importable(client_venv, package):
    proc = run([client_venv / "bin" / "python", "-c", f"import {package}"])
    assert proc.returncode != 0
    assert "ModuleNotFoundError" in proc.stderr


def test_tcloud_validate_works_with_the_client_alone(client_venv):
    proc = run([client_venv / "bin" / "tcloud", "validate", EXAMPLE])
    assert proc.returncode == 0, proc.stderr
    assert "valid task 'hello'" in proc.stdout


def test_tcloud_dry_run_compiles_the_same_job_with_the_client_alone(client_venv):
    """The digest names the job's exact content: the same as the full install's."""
    alone = run([client_venv / "bin" / "tcloud", "submit", "--dry-run", EXAMPLE])
    full = run_cli("tcloud", "submit", "--dry-run", str(EXAMPLE))
    assert alone.returncode == 0, alone.stderr
    assert full.returncode == 0, full.stderr
    digest = next(line for line in alone.stdout.splitlines() if line.startswith("digest: "))
    assert digest in full.stdout.splitlines()
