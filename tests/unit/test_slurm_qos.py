"""The slurm role's slurm_qos module: parsing sacctmgr output and planning changes."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import ROOT

_SPEC = importlib.util.spec_from_file_location(
    "slurm_qos", ROOT / "roles/slurm/library/slurm_qos.py"
)
slurm_qos = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(slurm_qos)


def spec(name: str, priority: int = 0, preempt=(), max_wall: str = "") -> dict:
    return {"name": name, "priority": priority, "preempt": list(preempt), "max_wall": max_wall}


@pytest.mark.parametrize(
    ("text", "minutes"),
    [
        ("", None),
        ("UNLIMITED", None),
        ("30", 30),
        ("30:30", 31),
        ("12:00:00", 720),
        ("1-00:00:00", 1440),
        ("3-12", 3 * 1440 + 720),
        ("2-01:30", 2 * 1440 + 90),
    ],
)
def test_wall_minutes_reads_every_slurm_time_form(text, minutes):
    assert slurm_qos.wall_minutes(text) == minutes


def test_wall_minutes_rejects_garbage():
    with pytest.raises(ValueError, match="not a Slurm time"):
        slurm_qos.wall_minutes("twelve hours")


def test_parse_table_reads_sacctmgr_parsable_output():
    table = slurm_qos.parse_table("normal|0||\nurgent|100|normal,low|12:00:00\n")
    assert table == {
        "normal": {"priority": 0, "preempt": [], "max_wall": None},
        "urgent": {"priority": 100, "preempt": ["low", "normal"], "max_wall": 720},
    }


def test_plan_adds_everything_before_modifying():
    current = slurm_qos.parse_table("normal|0||\n")
    commands = slurm_qos.plan([spec("urgent", 100, ["low"], "12:00:00"), spec("low", 1)], current)
    assert commands == [
        ["sacctmgr", "--immediate", "add", "qos", "urgent"],
        ["sacctmgr", "--immediate", "add", "qos", "low"],
        ["sacctmgr", "--immediate", "modify", "qos", "where", "name=urgent", "set",
         "Priority=100", "Preempt=low", "MaxWall=12:00:00"],
        ["sacctmgr", "--immediate", "modify", "qos", "where", "name=low", "set", "Priority=1"],
    ]  # fmt: skip


def test_plan_is_empty_when_the_database_already_matches():
    current = slurm_qos.parse_table("normal|0||\nurgent|100|normal|12:00:00\n")
    assert slurm_qos.plan([spec("urgent", 100, ["normal"], "720")], current) == []


def test_plan_changes_only_what_differs_and_clears_limits():
    current = slurm_qos.parse_table("urgent|100|normal|12:00:00\n")
    assert slurm_qos.plan([spec("urgent", 100)], current) == [
        ["sacctmgr", "--immediate", "modify", "qos", "where", "name=urgent", "set",
         "Preempt=", "MaxWall=-1"],
    ]  # fmt: skip
