"""Every role says which releases it is tested on, and a release's own vars file
(vars/<distribution>-<major>.yml, loaded after the family's) only overrides names the
family's file declares: a name only the release file has would be undefined on the other."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

ROLES = sorted(p.parent.parent for p in (ROOT / "roles").glob("*/meta/argument_specs.yml"))
RELEASE_FILES = sorted((ROOT / "roles").glob("*/vars/Debian-*.yml"))
TESTED = "Tested in the lab on Debian 13 (trixie, Slurm 24.11; the primary release) and Debian 12"


def main_description(role: Path) -> str:
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
    description = specs["argument_specs"]["main"].get("description", [])
    return " ".join(description) if isinstance(description, list) else description


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_a_roles_specs_name_the_releases_it_is_tested_on(role: Path) -> None:
    assert TESTED in main_description(role)


@pytest.mark.parametrize("release_file", RELEASE_FILES, ids=lambda p: f"{p.parts[-3]}/{p.name}")
def test_a_release_file_overrides_only_names_its_family_declares(release_file: Path) -> None:
    family = yaml.safe_load((release_file.parent / "Debian.yml").read_text())
    release = yaml.safe_load(release_file.read_text())
    assert set(release) <= set(family), set(release) - set(family)


def test_there_are_release_files_to_check() -> None:
    assert {p.parts[-3] for p in RELEASE_FILES} >= {"slurm", "nfs_server"}


SLURM_RELEASE_NAMES = {
    "slurm_release",
    "slurm_ctld_pid_file",
    "slurm_slurmd_pid_file",
    "slurm_dbd_pid_file",
    "slurm_proctrack_plugins",
    "slurm_mpi_plugins",
    "slurm_private_data_kinds",
    "slurm_health_check_states",
}


@pytest.mark.parametrize("family", ["Debian", "RedHat"])
def test_every_family_names_its_slurm_release_and_what_it_accepts(family: str) -> None:
    names = yaml.safe_load((ROOT / f"roles/slurm/vars/{family}.yml").read_text())
    assert set(names) >= SLURM_RELEASE_NAMES, SLURM_RELEASE_NAMES - set(names)
