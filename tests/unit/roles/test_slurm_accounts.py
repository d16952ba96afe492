"""The slurm role's slurm_accounts module: reading `sacctmgr show assoc` and planning only
the accounts, users and settings that differ."""

from __future__ import annotations

import pytest

from tests.conftest import role_module

slurm_accounts = role_module("slurm", "slurm_accounts")

# `sacctmgr -n -P show assoc where cluster=tacc format=Account,User,Partition,Fairshare,
# DefaultQOS,QOS` as Slurm 22.05 prints it: root's rows as `sacctmgr add cluster` made
# them, an account whose users have QoS set and one user with a per-partition association,
# and an account someone made by hand with Fairshare=parent.
SHOW_ASSOC = """\
root|||1||normal
root|root||1|normal|normal
vision|||200|normal|normal,scavenger
vision|alice||1|normal|normal,scavenger
vision|carol||1|normal|normal,scavenger
vision|carol|gpu|1|normal|normal
handmade|||parent||normal
"""


def account(name: str, **settings) -> dict:
    return {
        "name": name,
        "description": "",
        "fairshare": 1,
        "users": [],
        "default_qos": "",
        "qos": [],
        **settings,
    }


def plan(specs: list[dict], shown: str = SHOW_ASSOC) -> list[str]:
    current = slurm_accounts.parse_assocs(shown)
    return [" ".join(c) for c in slurm_accounts.plan(specs, current, "tacc")]


VISION = account(
    "vision",
    fairshare=200,
    users=["alice", "carol"],
    qos=["scavenger", "normal"],
    default_qos="normal",
)


def test_parse_assocs_reads_accounts_users_and_parent_shares():
    table = slurm_accounts.parse_assocs(SHOW_ASSOC)
    assert table[("vision", "")] == {
        "fairshare": 200,
        "default_qos": "normal",
        "qos": ["normal", "scavenger"],
    }
    assert table[("root", "root")]["default_qos"] == "normal"
    assert table[("handmade", "")]["fairshare"] == "parent"
    # carol's per-partition association is not her account association.
    assert table[("vision", "carol")]["qos"] == ["normal", "scavenger"]
    assert len(table) == 6


@pytest.mark.parametrize(
    ("text", "shares"), [("1", 1), ("200", 200), ("parent", "parent"), ("Parent", "parent")]
)
def test_fairshare_reads_numbers_and_parent(text, shares):
    assert slurm_accounts.fairshare(text) == shares


def test_plan_is_empty_when_the_database_already_matches():
    assert plan([VISION]) == []


def test_an_empty_database_gets_accounts_before_users():
    specs = [VISION, account("nlp", description="NLP group", fairshare=100, users=["bob"])]
    assert plan(specs, "root|||1||normal\nroot|root||1|normal|normal\n") == [
        "sacctmgr --immediate add account vision Cluster=tacc Fairshare=200 "
        "QOS=normal,scavenger DefaultQOS=normal",
        "sacctmgr --immediate add account nlp Cluster=tacc Description=NLP group Fairshare=100",
        "sacctmgr --immediate add user alice Account=vision Cluster=tacc "
        "QOS=normal,scavenger DefaultQOS=normal",
        "sacctmgr --immediate add user carol Account=vision Cluster=tacc "
        "QOS=normal,scavenger DefaultQOS=normal",
        "sacctmgr --immediate add user bob Account=nlp Cluster=tacc",
    ]


def test_only_differences_are_modified():
    specs = [
        account(
            "vision",
            fairshare=300,
            users=["alice", "carol", "dave"],
            qos=["normal"],
            default_qos="normal",
        ),
        account("handmade", fairshare=5),
    ]
    assert plan(specs) == [
        "sacctmgr --immediate modify account where Name=vision Cluster=tacc set "
        "Fairshare=300 QOS=normal",
        "sacctmgr --immediate modify account where Name=handmade Cluster=tacc set Fairshare=5",
        "sacctmgr --immediate modify user where Name=alice Account=vision Cluster=tacc set "
        "QOS=normal",
        "sacctmgr --immediate modify user where Name=carol Account=vision Cluster=tacc set "
        "QOS=normal",
        "sacctmgr --immediate add user dave Account=vision Cluster=tacc QOS=normal "
        "DefaultQOS=normal",
    ]


def test_unlisted_accounts_users_and_settings_are_left_alone():
    """Listing vision with only alice touches neither carol nor root; no qos / default_qos
    keeps what the database has; nothing is ever removed."""
    specs = [account("vision", fairshare=200, users=["alice"])]
    assert plan(specs) == []
    commands = plan([account("vision", fairshare=200, users=["alice"], default_qos="scavenger")])
    assert all("carol" not in c and "root" not in c and "delete" not in c for c in commands)
    assert commands == [
        "sacctmgr --immediate modify account where Name=vision Cluster=tacc set "
        "DefaultQOS=scavenger",
        "sacctmgr --immediate modify user where Name=alice Account=vision Cluster=tacc set "
        "DefaultQOS=scavenger",
    ]


def test_a_user_listed_twice_is_added_once():
    commands = plan([account("nlp", users=["bob", "bob"])], "")
    assert commands.count("sacctmgr --immediate add user bob Account=nlp Cluster=tacc") == 1


def test_the_diff_shows_before_and_after_per_association():
    current = slurm_accounts.parse_assocs(SHOW_ASSOC)
    specs = [account("vision", fairshare=300, users=["alice", "dave"])]
    before = slurm_accounts.current_state(specs, current)
    after = slurm_accounts.wanted_state(specs)
    assert before["vision"]["fairshare"] == 200 and before["vision/dave"] is None
    assert after["vision"] == {"fairshare": 300, "qos": None, "default_qos": None}
    assert set(after) == {"vision", "vision/alice", "vision/dave"}


def test_a_cluster_the_database_does_not_know_is_added_first():
    """First converge: slurmctld has never registered the cluster when accounts are made."""
    commands = slurm_accounts.plan([account("nlp", users=["bob"])], {}, "tacc", False)
    assert [" ".join(c) for c in commands] == [
        "sacctmgr --immediate add cluster tacc",
        "sacctmgr --immediate add account nlp Cluster=tacc Fairshare=1",
        "sacctmgr --immediate add user bob Account=nlp Cluster=tacc",
    ]
    assert slurm_accounts.plan([], {}, "tacc", False) == []
    assert slurm_accounts.parse_clusters("tacc\nother\n") == {"tacc", "other"}
