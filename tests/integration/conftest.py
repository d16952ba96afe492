"""The slurm lab, shared by the modules that need a provisioned Slurm cluster
(test_slurm_cluster.py, test_frameworks.py): booted and converged once per session on
the xdist worker that runs the `slurm` group (make test: --dist loadgroup)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration.lab_helpers import lab_cli, lab_status, site

SLURM_LAB = "slurm"
SLURM_SUBNET = "10.77.6.0/24"


@pytest.fixture(scope="session")
def slurm_lab(tmp_path_factory) -> Path:
    inventory = tmp_path_factory.mktemp("slurm") / "hosts.yml"
    # For a developer re-running a few tests: TACC_TEST_REUSE_LAB=1 keeps a lab that is
    # already up and provisioned (and leaves it up). CI never sets it.
    reuse = os.environ.get("TACC_TEST_REUSE_LAB") == "1" and lab_status(SLURM_LAB)["up"]
    if not reuse:
        lab_cli(SLURM_LAB, "down")
    proc = lab_cli(SLURM_LAB, "up", "--nodes", "3", "--subnet", SLURM_SUBNET,
                   "--inventory", str(inventory))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if not reuse:
        site(inventory)
    yield inventory
    if not reuse:
        lab_cli(SLURM_LAB, "down")
