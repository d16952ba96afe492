"""The common role's common_drift module: what it reports as differing is what the
template/copy, file, group and user modules would change, and nothing else."""

from __future__ import annotations

import grp
import os
import pwd

import pytest

from tests.conftest import role_module

common_drift = role_module("common", "common_drift")

ME = pwd.getpwuid(os.getuid())
MY_GROUP = grp.getgrgid(os.getgid())


def file_spec(path, content="a\n", mode="0644", owner=None, group=None) -> dict:
    return {
        "path": str(path),
        "content": content,
        "owner": ME.pw_name if owner is None else owner,
        "group": MY_GROUP.gr_name if group is None else group,
        "mode": mode,
    }


def params(**kinds) -> dict:
    empty = {
        "hostname": None,
        "files": [],
        "links": [],
        "dirs": [],
        "groups": [],
        "users": [],
        "probe": [],
    }
    return {**empty, **kinds}


@pytest.fixture
def written(tmp_path):
    path = tmp_path / "f.conf"
    path.write_text("a\n")
    path.chmod(0o644)
    return path


def test_a_file_as_asked_does_not_differ(written):
    assert not common_drift.file_differs(file_spec(written))


def test_numeric_owners_compare_as_numbers(written):
    assert not common_drift.file_differs(
        file_spec(written, owner=str(ME.pw_uid), group=MY_GROUP.gr_gid)
    )


@pytest.mark.parametrize(
    "change",
    [
        {"content": "b\n"},
        {"content": "a"},  # a trailing newline is content too
        {"mode": "0600"},
        {"owner": "no-such-user-here"},
        {"group": str(MY_GROUP.gr_gid + 1)},
    ],
)
def test_content_mode_and_owners_each_differ(written, change):
    assert common_drift.file_differs({**file_spec(written), **change})


def test_a_missing_file_or_a_link_in_its_place_differs(tmp_path, written):
    assert common_drift.file_differs(file_spec(tmp_path / "missing"))
    link = tmp_path / "link"
    link.symlink_to(written)
    assert common_drift.file_differs(file_spec(link))


def test_directories(tmp_path, written):
    tmp_path.chmod(0o700)
    spec = {"path": str(tmp_path), "owner": ME.pw_uid, "group": MY_GROUP.gr_gid, "mode": "0700"}
    assert not common_drift.dir_differs(spec)
    assert common_drift.dir_differs({**spec, "mode": "0755"})
    assert common_drift.dir_differs({**spec, "path": str(written)})
    assert common_drift.dir_differs({**spec, "path": str(tmp_path / "missing")})


def test_links(tmp_path):
    link = tmp_path / "localtime"
    link.symlink_to("/usr/share/zoneinfo/Etc/UTC")
    assert not common_drift.link_differs({"path": str(link), "src": "/usr/share/zoneinfo/Etc/UTC"})
    assert common_drift.link_differs({"path": str(link), "src": "/usr/share/zoneinfo/Europe/Paris"})
    assert common_drift.link_differs({"path": str(tmp_path / "none"), "src": "/x"})


def test_groups():
    assert not common_drift.group_differs({"name": MY_GROUP.gr_name, "gid": MY_GROUP.gr_gid})
    assert common_drift.group_differs({"name": MY_GROUP.gr_name, "gid": MY_GROUP.gr_gid + 1})
    assert common_drift.group_differs({"name": "no-such-group-here", "gid": 4242})


def me_as_user(**change) -> dict:
    member_of = sorted(g.gr_name for g in grp.getgrall() if ME.pw_name in g.gr_mem)
    base = {
        "name": ME.pw_name,
        "uid": ME.pw_uid,
        "group": grp.getgrgid(ME.pw_gid).gr_name,
        "groups": member_of,
        "shell": ME.pw_shell,
        "home": ME.pw_dir,
        "comment": ME.pw_gecos,
    }
    return {**base, **change}


def test_a_user_as_asked_does_not_differ():
    assert not common_drift.user_differs(me_as_user())
    # Unset settings are not compared (the user module leaves them alone too).
    assert not common_drift.user_differs(me_as_user(groups=None, home=None, comment=None))


@pytest.mark.parametrize(
    "change",
    [
        {"uid": ME.pw_uid + 1},
        {"group": "no-such-group-here"},
        {"shell": "/bin/no-such-shell"},
        {"home": "/no/such/home"},
        {"comment": "someone else"},
        {"groups": ["no-such-group-here"]},
        {"name": "no-such-user-here"},
    ],
)
def test_each_user_setting_differs(change):
    assert common_drift.user_differs(me_as_user(**change))


def test_a_user_whose_group_gets_a_new_gid_is_changed_with_it():
    """The user module sets the primary GID again after groupmod: the user is listed."""
    group = grp.getgrgid(ME.pw_gid)
    result = common_drift.drift(
        params(groups=[{"name": group.gr_name, "gid": group.gr_gid + 1}], users=[me_as_user()])
    )
    assert result["groups"] == [group.gr_name]
    assert result["users"] == [ME.pw_name]


def test_drift_lists_only_what_differs(tmp_path, written):
    result = common_drift.drift(
        params(files=[file_spec(written), file_spec(tmp_path / "missing")], users=[me_as_user()])
    )
    assert result == {
        "hostname": False,
        "files": [str(tmp_path / "missing")],
        "links": [],
        "dirs": [],
        "groups": [],
        "users": [],
        "probed": {},
    }


def test_hostname_reads_the_file_and_the_kernel(monkeypatch, tmp_path):
    hostname_file = tmp_path / "hostname"
    hostname_file.write_text("n1\n")
    real_open = open

    def open_with_our_hostname(path, *args, **kwargs):
        return real_open(hostname_file if path == "/etc/hostname" else path, *args, **kwargs)

    monkeypatch.setattr("builtins.open", open_with_our_hostname)
    monkeypatch.setattr(common_drift.socket, "gethostname", lambda: "n1")
    assert not common_drift.hostname_differs("n1")
    assert common_drift.hostname_differs("n2")
    monkeypatch.setattr(common_drift.socket, "gethostname", lambda: "zz")
    assert common_drift.hostname_differs("n1")


def test_a_probe_names_the_kind_of_each_path_and_a_links_target(tmp_path):
    """How the role tells who owns /etc/resolv.conf (systemd-resolved's link, a DHCP
    client's hook directory): read, never reported as differing."""
    (tmp_path / "hooks.d").mkdir()
    (tmp_path / "resolv.conf").symlink_to("/run/systemd/resolve/stub-resolv.conf")
    (tmp_path / "plain").write_text("x")
    paths = [str(tmp_path / name) for name in ("hooks.d", "resolv.conf", "plain", "gone")]
    found = common_drift.drift(params(probe=paths))
    assert found["probed"] == {
        paths[0]: {"kind": "dir", "target": ""},
        paths[1]: {"kind": "link", "target": "/run/systemd/resolve/stub-resolv.conf"},
        paths[2]: {"kind": "file", "target": ""},
        paths[3]: {"kind": "missing", "target": ""},
    }
    assert found["files"] == [] and found["links"] == []
