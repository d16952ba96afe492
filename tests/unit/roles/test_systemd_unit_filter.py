"""The nfs_client role's unit-name filter matches `systemd-escape --path --suffix`."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess

import pytest

from tests.conftest import ROOT

_SPEC = importlib.util.spec_from_file_location(
    "systemd_unit", ROOT / "roles/nfs_client/filter_plugins/systemd_unit.py"
)
systemd_unit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(systemd_unit)

PATHS = ["/shared", "/shared/data-1", "/srv/nfs home", "/", "/mnt/.hidden", "/.x/y", "/a//b/", "/ü"]


@pytest.mark.parametrize("path", PATHS)
def test_unit_name_matches_systemd_escape(path):
    if shutil.which("systemd-escape") is None:
        pytest.fail("systemd-escape missing: make deps installs systemd-container")
    expected = subprocess.run(
        ["systemd-escape", "--path", "--suffix=mount", path],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert systemd_unit.tacc_systemd_path_unit(path, "mount") == expected
