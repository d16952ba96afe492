"""The slurm role's slurm_qos module: parsing sacctmgr output and planning changes."""

from __future__ import annotations

import pytest

from tests.conftest import role_module

slurm_qos = role_module("slurm", "slurm_qos")


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
    """Four-column lines (the old format) read the newer columns as unset."""
    table = slurm_qos.parse_table("normal|0||\nurgent|100|normal,low|12:00:00\n")
    assert table == {
        "normal": {**slurm_qos.NEW_QOS, "priority": 0, "preempt": [], "max_wall": None},
        "urgent": {
            **slurm_qos.NEW_QOS,
            "priority": 100,
            "preempt": ["low", "normal"],
            "max_wall": 720,
        },
    }


def test_plan_adds_everything_before_modifying():
    current = slurm_qos.parse_table("normal|0||\n")
    commands = slurm_qos.plan([spec("urgent", 100, ["low"], "12:00:00"), spec("low", 1)], current)
    assert commands == [
        ["sacctmgr", "--immediate", "add", "qos", "urgent"],
        ["sacctmgr", "--immediate", "add", "qos", "low"],
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=urgent",
            "set",
            "Priority=100",
            "Preempt=low",
            "MaxWall=12:00:00",
        ],
        ["sacctmgr", "--immediate", "modify", "qos", "where", "name=low", "set", "Priority=1"],
    ]


def test_plan_is_empty_when_the_database_already_matches():
    current = slurm_qos.parse_table("normal|0||\nurgent|100|normal|12:00:00\n")
    assert slurm_qos.plan([spec("urgent", 100, ["normal"], "720")], current) == []


def test_plan_changes_only_what_differs_and_clears_limits():
    current = slurm_qos.parse_table("urgent|100|normal|12:00:00\n")
    assert slurm_qos.plan([spec("urgent", 100)], current) == [
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=urgent",
            "set",
            "Preempt=",
            "MaxWall=-1",
        ],
    ]


# `sacctmgr -n -P show qos format=Name,Priority,Preempt,MaxWall,MaxTRESPU,MaxJobsPU,
# PreemptMode,UsageFactor` as Slurm 22.05 prints it: the default QoS `normal`, one with a GPU
# cap (among other TRES limits set by hand) and a free, requeued scavenger QoS.
SHOW_QOS = """\
normal|0|scavenger||cpu=64,gres/gpu=8|4|cluster|1.000000
scavenger|0|||||requeue|0.000000
urgent|100|normal|12:00:00|||cluster|1.000000
"""


def full_spec(name: str, **settings) -> dict:
    return {
        **spec(name),
        "max_gpus_per_user": None,
        "max_jobs_per_user": None,
        "preempt_mode": "",
        "usage_factor": 1.0,
        **settings,
    }


def test_parse_table_reads_limits_modes_and_usage_factors():
    table = slurm_qos.parse_table(SHOW_QOS)
    assert table["normal"] == {
        "priority": 0,
        "preempt": ["scavenger"],
        "max_wall": None,
        "max_gpus_per_user": 8,
        "max_jobs_per_user": 4,
        "preempt_mode": "cluster",
        "usage_factor": 1.0,
    }
    assert table["scavenger"]["preempt_mode"] == "requeue"
    assert table["scavenger"]["usage_factor"] == 0.0
    assert table["scavenger"]["max_gpus_per_user"] is None
    assert table["urgent"]["max_jobs_per_user"] is None


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("", None),
        ("cpu=64", None),
        ("gres/gpu=8", 8),
        ("cpu=2,gres/gpu=0,mem=4G", 0),
        ("gres/gpu:a100=2", None),
    ],  # a typed GPU limit is not the gres/gpu limit
)
def test_tres_limit_reads_only_the_gpu_limit(text, limit):
    assert slurm_qos.tres_limit(text) == limit


@pytest.mark.parametrize(
    ("text", "mode"),
    [("", "cluster"), ("OFF", "cluster"), ("cluster", "cluster"), ("REQUEUE", "requeue")],
)
def test_preempt_mode_compares_in_sacctmgr_spelling(text, mode):
    assert slurm_qos.preempt_mode(text) == mode


def test_plan_is_empty_when_limits_modes_and_factors_match():
    specs = [
        full_spec("normal", preempt=["scavenger"], max_gpus_per_user=8, max_jobs_per_user=4),
        full_spec("scavenger", preempt_mode="REQUEUE", usage_factor=0.0),
        full_spec("urgent", priority=100, preempt=["normal"], max_wall="12:00:00"),
    ]
    assert slurm_qos.plan(specs, slurm_qos.parse_table(SHOW_QOS)) == []


def test_plan_sets_only_the_new_fields_that_differ():
    specs = [
        full_spec("normal", preempt=["scavenger"], max_gpus_per_user=16, max_jobs_per_user=4),
        full_spec("scavenger", preempt_mode="cancel", usage_factor=0.0),
    ]
    assert slurm_qos.plan(specs, slurm_qos.parse_table(SHOW_QOS)) == [
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=normal",
            "set",
            "MaxTRESPerUser=gres/gpu=16",
        ],
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=scavenger",
            "set",
            "PreemptMode=cancel",
        ],
    ]


def test_plan_clears_limits_that_are_no_longer_wanted():
    """Unset max_* means no limit: -1 clears it; an empty preempt_mode is the cluster's."""
    specs = [full_spec("normal", preempt=["scavenger"]), full_spec("scavenger", usage_factor=0.5)]
    assert slurm_qos.plan(specs, slurm_qos.parse_table(SHOW_QOS)) == [
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=normal",
            "set",
            "MaxTRESPerUser=gres/gpu=-1",
            "MaxJobsPerUser=-1",
        ],
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=scavenger",
            "set",
            "PreemptMode=cluster",
            "UsageFactor=0.5",
        ],
    ]


def test_a_new_free_preemptible_qos_gets_every_setting_in_one_modify():
    specs = [
        full_spec(
            "scavenger",
            preempt_mode="requeue",
            usage_factor=0.0,
            max_gpus_per_user=2,
            max_jobs_per_user=10,
        )
    ]
    assert slurm_qos.plan(specs, {}) == [
        ["sacctmgr", "--immediate", "add", "qos", "scavenger"],
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=scavenger",
            "set",
            "MaxTRESPerUser=gres/gpu=2",
            "MaxJobsPerUser=10",
            "PreemptMode=requeue",
            "UsageFactor=0",
        ],
    ]


def test_gpu_limits_wait_for_the_gres_gpu_tres():
    """Before slurmctld registered gres/gpu, the GPU limit is left out and reported."""
    specs = [full_spec("normal", max_gpus_per_user=16), full_spec("free", usage_factor=0.0)]
    current = slurm_qos.parse_table("normal|0||||||1.000000\n")
    assert slurm_qos.plan(specs, current, gpu_tres=False) == [
        ["sacctmgr", "--immediate", "add", "qos", "free"],
        ["sacctmgr", "--immediate", "modify", "qos", "where", "name=free", "set", "UsageFactor=0"],
    ]
    assert slurm_qos.deferred_gpu_limits(specs, current) == ["normal"]
    assert slurm_qos.deferred_gpu_limits([full_spec("free")], current) == []


def test_parse_tres_names_types_and_names():
    out = "cpu|\nmem|\nenergy|\nnode|\nbilling|\nfs|disk\nvmem|\npages|\ngres|gpu\n"
    tres = slurm_qos.parse_tres(out)
    assert "gres/gpu" in tres and "cpu" in tres and "fs/disk" in tres
    assert "gres/gpu" not in slurm_qos.parse_tres("cpu|\nmem|\n")
