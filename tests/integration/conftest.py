"""The slurm lab: booted and converged once for test_slurm_cluster.py and the cases it
collects from frameworks_cases.py (one module: one xdist worker with --dist loadfile;
pytest 9 and pytest-xdist 3.8 do not keep an xdist_group on one worker)."""

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
    # --container-image: the lab's base image seeded into a registry on n1 and the
    # container runtime on compute and login nodes (issue [13], docs/containers.md).
    proc = lab_cli(SLURM_LAB, "up", "--nodes", "3", "--subnet", SLURM_SUBNET,
                   "--container-image", "--inventory", str(inventory))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    if not reuse:
        site(inventory)
    yield inventory
    if not reuse:
        lab_cli(SLURM_LAB, "down")
