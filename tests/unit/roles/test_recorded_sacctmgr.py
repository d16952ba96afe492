"""The slurm role's sacctmgr modules (roles/slurm/library/slurm_accounts.py, slurm_qos.py
and module_utils/tacc_sacctmgr.py) on what sacctmgr really printed in the lab, Slurm 22.05
(Debian 12) and 24.11 (Debian 13): tests/unit/slurm_outputs/ (issue [20] point 3).

Each module reads its table through tacc_sacctmgr.show; here a module whose run_command
answers from the recording made with exactly the argv it ran (MANIFEST.json), so an argv
that drifts from the recorded one fails too. The lab's inventory sets one account,
research (alice and bob), and no QoS: only Slurm's own normal exists.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import role_module

slurm_accounts = role_module("slurm", "slurm_accounts")
slurm_qos = role_module("slurm", "slurm_qos")

RECORDED = Path(__file__).resolve().parents[1] / "slurm_outputs"
VERSIONS = ["22.05", "24.11"]
CLUSTER = "tacc"
# What the lab's inventory asks of the role (one account, its two users, defaults else).
LAB_ACCOUNTS = [
    {
        "name": "research",
        "description": "",
        "fairshare": 1,
        "users": ["alice", "bob"],
        "default_qos": "",
        "qos": [],
    }
]


@cache
def manifest(version: str) -> dict:
    return json.loads((RECORDED / version / "MANIFEST.json").read_text())


class Failed(Exception):
    """AnsibleModule.fail_json."""


class RecordedModule:
    """The part of AnsibleModule the modules use: run_command answers from the root
    recordings of one version; `read` lists the recordings it gave."""

    check_mode = False

    def __init__(self, version: str) -> None:
        self.version = version
        self.read: list[str] = []

    def run_command(self, argv: list[str]) -> tuple[int, str, str]:
        recordings = manifest(self.version)["recordings"]
        names = [r["name"] for r in recordings if (r["user"], r["argv"]) == ("root", argv)]
        assert names, f"Slurm {self.version}: no recording of {argv}"
        self.read.append(names[0])
        out = (RECORDED / self.version / f"{names[0]}.out").read_text()
        rc_file = RECORDED / self.version / f"{names[0]}.rc"
        return (int(rc_file.read_text()) if rc_file.exists() else 0), out, ""

    def fail_json(self, msg: str) -> None:
        raise Failed(msg)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_cluster_is_known_to_the_database_on_both(version):
    """slurm_accounts.parse_clusters of `show cluster format=Cluster`."""
    module = RecordedModule(version)
    shown = slurm_accounts.show(module, "cluster", "format=Cluster")
    assert module.read == ["sacctmgr-cluster.root"]
    assert slurm_accounts.parse_clusters(shown) == {CLUSTER}
    assert manifest(version)["placeholders"]["cluster"] == CLUSTER


@pytest.mark.parametrize("version", VERSIONS)
def test_the_associations_read_and_the_role_changes_nothing_on_both(version):
    """slurm_accounts.parse_assocs: root and research, each with its users; fair share 1,
    QOS normal, no default QOS; the lab's own accounts plan no command."""
    module = RecordedModule(version)
    shown = slurm_accounts.show(
        module, "assoc", "where", f"cluster={CLUSTER}", f"format={slurm_accounts.FORMAT}"
    )
    assert module.read == ["sacctmgr-assoc-role.root"]
    current = slurm_accounts.parse_assocs(shown)
    settings = {"fairshare": 1, "default_qos": "", "qos": ["normal"]}
    assert current == {
        ("root", ""): settings,
        ("root", "root"): settings,
        ("research", ""): settings,
        ("research", "alice"): settings,
        ("research", "bob"): settings,
    }
    assert slurm_accounts.plan(LAB_ACCOUNTS, current, CLUSTER, cluster_known=True) == []
    assert slurm_accounts.current_state(LAB_ACCOUNTS, current) == {
        "research": settings,
        "research/alice": settings,
        "research/bob": settings,
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_a_new_user_is_added_to_the_recorded_account(version):
    module = RecordedModule(version)
    current = slurm_accounts.parse_assocs(
        slurm_accounts.show(
            module, "assoc", "where", f"cluster={CLUSTER}", f"format={slurm_accounts.FORMAT}"
        )
    )
    wanted = [{**LAB_ACCOUNTS[0], "users": ["alice", "bob", "carol"]}]
    assert slurm_accounts.plan(wanted, current, CLUSTER) == [
        [*slurm_accounts.SACCTMGR, "add", "user", "carol", "Account=research", f"Cluster={CLUSTER}"]
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_slurms_own_qos_reads_as_a_new_one_on_both(version):
    """slurm_qos.parse_table: normal, as `sacctmgr add qos` makes one (NEW_QOS);
    PreemptMode prints as "cluster", UsageFactor as 1.000000."""
    module = RecordedModule(version)
    table = slurm_qos.parse_table(slurm_qos.show(module, "qos", f"format={slurm_qos.FORMAT}"))
    assert module.read == ["sacctmgr-qos-role.root"]
    assert table == {"normal": slurm_qos.NEW_QOS}
    normal = {"name": "normal", "priority": 0, "preempt": [], "max_wall": ""}
    assert slurm_qos.plan([normal], table) == []
    urgent = {**normal, "name": "urgent", "priority": 100, "preempt": ["normal"]}
    assert slurm_qos.plan([urgent], table) == [
        ["sacctmgr", "--immediate", "add", "qos", "urgent"],
        [
            "sacctmgr",
            "--immediate",
            "modify",
            "qos",
            "where",
            "name=urgent",
            "set",
            "Priority=100",
            "Preempt=normal",
        ],
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_the_clusters_tres_have_no_gpu_on_both(version):
    """slurm_qos.parse_tres: "fs|disk" is fs/disk; a CPU-only lab has no gres/gpu, so a
    QoS GPU limit waits for it (gpu_tres_known)."""
    module = RecordedModule(version)
    shown = slurm_qos.show(module, "tres", "format=Type,Name")
    assert slurm_qos.parse_tres(shown) == {
        "cpu",
        "mem",
        "energy",
        "node",
        "billing",
        "fs/disk",
        "vmem",
        "pages",
    }
    assert slurm_qos.gpu_tres_known(module, [{"name": "gpu", "max_gpus_per_user": 8}]) is False
    assert module.read == ["sacctmgr-tres.root", "sacctmgr-tres.root"]
