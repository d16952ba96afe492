"""tacc-lab raises the host's inotify limits its nodes share, and never lowers them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tacc_lab.host_limits import MINIMUMS, raise_host_limits


def proc_sys(root: Path, values: dict[str, str]) -> Path:
    for name, value in values.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(value)
    return root


def test_a_low_limit_is_raised_and_said(tmp_path):
    root = proc_sys(tmp_path, {name: "128\n" for name in MINIMUMS})
    logged: list[str] = []
    raised = raise_host_limits(root, log=logged.append)
    assert raised == [f"{n.replace('/', '.')}: 128 -> {least}" for n, least in MINIMUMS.items()]
    assert all((root / name).read_text() == f"{least}\n" for name, least in MINIMUMS.items())
    assert logged and "fs.inotify.max_user_instances: 128 -> 8192" in logged[0]


def test_a_higher_limit_is_left_alone_and_nothing_is_said(tmp_path):
    root = proc_sys(tmp_path, {name: "99999999\n" for name in MINIMUMS})
    logged: list[str] = []
    assert raise_host_limits(root, log=logged.append) == []
    assert all((root / name).read_text() == "99999999\n" for name in MINIMUMS)
    assert logged == []


@pytest.mark.fault
def test_an_unreadable_limit_is_a_warning_naming_it_and_nothing_stops(tmp_path):
    logged: list[str] = []
    assert raise_host_limits(tmp_path, log=logged.append) == []
    assert "max_user_instances: cannot read or raise it to 8192" in logged[0]
    assert logged[0].startswith("warning: ")
