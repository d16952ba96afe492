"""tacc_agent/accounts/plan.py: the sacctmgr and scancel steps that make the mapped
accounts follow the directory's groups, and what they leave alone."""

from __future__ import annotations

import pytest

from tacc_agent.accounts.mapping import GroupAccount
from tacc_agent.accounts.plan import Groups, Slurm, plan
from tacc_agent.errors import AgentError
from tacc_agent.slurm.accounting import Association, parse_associations
from tacc_agent.slurm.queue import parse_owners

VISION = GroupAccount("vision", "vision", 10)
NLP = GroupAccount("nlp", "nlp", 5, ("normal", "long"), "normal")


def assoc(account: str, user: str = "", fairshare: str = "10", held: bool = False) -> Association:
    return Association(account, user, fairshare, frozenset(), "", "0" if held else "")


def says(steps) -> list[str]:
    return [step.says for step in steps]


def slurm(*associations, defaults=None, waiting=(), running=(), elsewhere=None) -> Slurm:
    pairs = frozenset(waiting), frozenset(running)
    return Slurm(tuple(associations), defaults or {}, *pairs, elsewhere or {})


def test_a_missing_account_is_made_with_its_settings_and_members_added():
    steps = plan((NLP,), Groups({"nlp": ("carol",)}), slurm(), "finish", "tacc")
    assert [list(step.argv) for step in steps] == [
        [
            "sacctmgr",
            "--immediate",
            "add",
            "account",
            "nlp",
            "cluster=tacc",
            "fairshare=5",
            "qos=normal,long",
            "defaultqos=normal",
        ],
        ["sacctmgr", "--immediate", "add", "user", "carol", "account=nlp", "cluster=tacc"],
    ]


def test_nothing_changes_when_slurm_already_matches():
    state = slurm(assoc("vision"), assoc("vision", "carol"))
    assert plan((VISION,), Groups({"vision": ("carol",)}), state, "finish", "tacc") == []


def test_a_changed_fair_share_is_set():
    state = slurm(assoc("vision", fairshare="1"), assoc("vision", "carol"))
    assert says(plan((VISION,), Groups({"vision": ("carol",)}), state, "finish", "tacc")) == [
        "account vision set: fairshare=10"
    ]


def test_finish_holds_a_leaver_with_a_running_job_and_cancels_only_pending_ones():
    pair = {("carol", "vision")}
    state = slurm(assoc("vision"), assoc("vision", "carol"), waiting=pair, running=pair)
    steps = plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc")
    assert says(steps) == ["carol held in vision", "carol's pending jobs in vision cancelled"]
    assert steps[0].argv[-2:] == ("set", "maxsubmitjobs=0")
    assert steps[1].argv == (
        "scancel",
        "--user=carol",
        "--account=vision",
        "--state=PENDING",
    )


def test_finish_removes_a_held_leaver_once_nothing_of_theirs_runs():
    state = slurm(assoc("vision"), assoc("vision", "carol", held=True))
    steps = plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc")
    assert says(steps) == ["carol removed from vision"]
    assert steps[-1].argv[2:4] == ("delete", "user")


def test_a_leaver_with_nothing_running_is_held_then_removed_in_one_round():
    state = slurm(assoc("vision"), assoc("vision", "carol"))
    steps = plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc")
    assert says(steps) == ["carol held in vision", "carol removed from vision"]


def test_cancel_holds_ends_every_job_and_removes_once_they_have_ended():
    state = slurm(assoc("vision"), assoc("vision", "carol"), running={("carol", "vision")})
    steps = plan((VISION,), Groups({"vision": ()}), state, "cancel", "tacc")
    assert says(steps) == ["carol held in vision", "carol's jobs in vision cancelled"]
    assert steps[1].argv == ("scancel", "--user=carol", "--account=vision")
    ended = slurm(assoc("vision"), assoc("vision", "carol", held=True))
    steps = plan((VISION,), Groups({"vision": ()}), ended, "cancel", "tacc")
    assert says(steps) == ["carol removed from vision"]


def test_a_held_leaver_whose_job_still_runs_is_left_as_is():
    pair = {("carol", "vision")}
    state = slurm(assoc("vision"), assoc("vision", "carol", held=True), running=pair)
    assert plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc") == []


def test_a_returning_member_is_no_longer_held():
    state = slurm(assoc("vision"), assoc("vision", "carol", held=True))
    steps = plan((VISION,), Groups({"vision": ("carol",)}), state, "finish", "tacc")
    assert says(steps) == ["carol may submit to vision again"]
    assert steps[0].argv[-1] == "maxsubmitjobs=-1"


def test_a_leaver_whose_default_account_goes_gets_another_first():
    state = slurm(
        assoc("vision"),
        assoc("vision", "carol"),
        defaults={"carol": "vision"},
    )
    mapping = (VISION, GroupAccount("nlp", "nlp", 10))
    steps = plan(mapping, Groups({"vision": (), "nlp": ("carol",)}), state, "finish", "tacc")
    assert says(steps) == [
        "account nlp made (group nlp)",
        "carol added to nlp",
        "carol held in vision",
        "carol's default account is nlp",
        "carol removed from vision",
    ]


@pytest.mark.fault
def test_a_group_the_directory_did_not_answer_for_leaves_its_account_alone():
    state = slurm(assoc("vision"), assoc("vision", "carol"), assoc("vision", "erin"))
    assert plan((VISION,), Groups({}), state, "finish", "tacc") == []


def test_a_leavers_default_moves_to_an_account_the_mapping_does_not_name():
    state = slurm(
        assoc("vision"),
        assoc("vision", "carol", held=True),
        defaults={"carol": "vision"},
        elsewhere={"carol": frozenset({"research"})},
    )
    steps = plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc")
    assert says(steps) == ["carol's default account is research", "carol removed from vision"]


@pytest.mark.fault
def test_nobody_leaves_an_account_while_one_of_its_groups_is_unknown():
    mapping = (VISION, GroupAccount("vision-students", "vision", 10))
    state = slurm(assoc("vision"), assoc("vision", "carol"), assoc("vision", "erin"))
    steps = plan(mapping, Groups({"vision": ("carol", "fay")}), state, "finish", "tacc")
    assert says(steps) == ["fay added to vision"]  # erin may be in the unknown group


@pytest.mark.fault
def test_a_listed_member_whose_entry_did_not_resolve_keeps_the_association():
    state = slurm(assoc("vision"), assoc("vision", "carol"), assoc("vision", "erin"))
    groups = Groups({"vision": ("carol",)}, unresolved=frozenset({"erin"}))
    assert plan((VISION,), groups, state, "finish", "tacc") == []


def test_accounts_the_mapping_does_not_name_are_never_touched():
    state = slurm(assoc("research"), assoc("research", "alice"), assoc("vision"))
    assert plan((VISION,), Groups({"vision": ()}), state, "finish", "tacc") == []


def test_two_groups_of_one_account_give_it_both_their_members():
    mapping = (VISION, GroupAccount("vision-students", "vision", 10))
    state = slurm(assoc("vision"), assoc("vision", "carol"))
    members = {"vision": ("carol",), "vision-students": ("erin",)}
    assert says(plan(mapping, Groups(members), state, "finish", "tacc")) == ["erin added to vision"]


def test_squeues_owner_lines_are_read_and_a_strange_one_refused():
    assert parse_owners("carol|vision|PENDING\nerin||RUNNING\n") == {
        ("carol", "vision", "PENDING"),
        ("erin", "", "RUNNING"),
    }
    with pytest.raises(AgentError, match="owner line not understood"):
        parse_owners("carol vision PENDING\n")


def test_sacctmgrs_association_lines_are_read():
    text = "vision||10|normal,long|normal|\nvision|carol|1|normal,long|normal|0\n"
    assert parse_associations(text) == [
        Association("vision", "", "10", frozenset({"normal", "long"}), "normal", ""),
        Association("vision", "carol", "1", frozenset({"normal", "long"}), "normal", "0"),
    ]
