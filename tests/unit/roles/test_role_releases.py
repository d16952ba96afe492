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
# slurm_upgrade's entry points run on one side of the move each.
MOVED = (
    "Tested in the lab from Debian 12 (bookworm, Slurm 22.05) to Debian 13 (trixie, Slurm 24.11)"
)


def entry_descriptions(role: Path) -> dict[str, str]:
    """Each entry point's description, its lines joined."""
    specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())["argument_specs"]
    joined = {}
    for entry, spec in specs.items():
        description = spec.get("description", [])
        joined[entry] = " ".join(description) if isinstance(description, list) else description
    return joined


def says_releases(description: str) -> bool:
    flat = " ".join(description.split())
    return TESTED in flat or MOVED in flat


@pytest.mark.parametrize("role", ROLES, ids=lambda role: role.name)
def test_a_roles_specs_name_the_releases_it_is_tested_on(role: Path) -> None:
    """The main entry point says it; a role without one (slurm_upgrade) says it in each
    (render_local entry points run on localhost only)."""
    descriptions = entry_descriptions(role)
    entries = ["main"] if "main" in descriptions else list(descriptions)
    assert entries and all(says_releases(descriptions[entry]) for entry in entries), entries


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
