"""The root-run sync takes only what it can trust from NSS and the workspace root: names
Slurm and a path take as they are, uids in the directory's range, a root of root's alone,
and never a link (tacc_agent/accounts/membership.py, sync.py)."""

from __future__ import annotations

import grp
import os
import pwd
from types import SimpleNamespace

import pytest

from tacc_agent.accounts import membership
from tacc_agent.accounts.membership import Member
from tacc_agent.accounts.sync import Outcome, make_workspaces

pytestmark = pytest.mark.security

IDS = (10000, 59999)


@pytest.fixture
def directory(monkeypatch):
    """A group `vision` whose listed members resolve as USERS says."""
    users = {
        "carol": 20001,
        "nobody": 65534,
        "alice": 2001,
        "Carol": 20009,
        "a,b": 20010,
        "../etc": 20011,
    }
    listed = [*users, "gone"]
    monkeypatch.setattr(membership, "forget_cached", lambda groups: None)
    monkeypatch.setattr(grp, "getgrnam", lambda name: SimpleNamespace(gr_mem=listed))

    def getpwnam(name):
        if name not in users:
            raise KeyError(name)
        return SimpleNamespace(pw_name=name, pw_uid=users[name], pw_gid=users[name])

    monkeypatch.setattr(pwd, "getpwnam", getpwnam)


def test_only_plain_names_with_a_directory_uid_count(directory):
    found = membership.read(["vision"], IDS)
    assert [m.name for m in found.members["vision"]] == ["carol"]
    assert found.unresolved == frozenset({"gone"})  # kept as it is, not a leaver
    said = " ".join(found.skipped)
    for name in ("'Carol'", "'a,b'", "'../etc'", "nobody (in vision: uid 65534 outside"):
        assert name in said, said
    assert "alice (in vision: uid 2001 outside" in said


def test_a_link_where_a_workspace_would_be_is_not_followed(tmp_path):
    root = tmp_path / "tcloud"
    root.mkdir(mode=0o755)
    target = tmp_path / "elsewhere"
    target.mkdir()
    (root / "carol").symlink_to(target)
    outcome = Outcome()
    me = os.getuid()
    make_workspaces(root, [Member("carol", me + 1, me + 1), Member("erin", me, me)], outcome, False)
    assert outcome.errors == [f"{root}/carol: exists, not carol's directory"]
    assert target.stat().st_uid == me  # not chowned through the link
    assert outcome.workspaces == [f"{root}/erin made for erin"]
    assert (root / "erin").stat().st_mode & 0o777 == 0o700


def test_a_workspace_root_others_may_write_to_gets_nothing(tmp_path):
    root = tmp_path / "tcloud"
    root.mkdir()
    root.chmod(0o1777)
    outcome = Outcome()
    make_workspaces(root, [Member("erin", os.getuid(), os.getgid())], outcome, False)
    assert outcome.errors == [f"workspace root {root}: not root's alone (0755 root expected)"]
    assert list(root.iterdir()) == []


def test_a_workspace_root_that_is_a_link_gets_nothing(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    root = tmp_path / "tcloud"
    root.symlink_to(real)
    outcome = Outcome()
    make_workspaces(root, [Member("erin", os.getuid(), os.getgid())], outcome, False)
    assert outcome.errors and outcome.errors[0].startswith(f"workspace root {root}:")
    assert list(real.iterdir()) == []
