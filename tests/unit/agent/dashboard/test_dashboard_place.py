"""Where a user's dashboard server lives (tacc_agent/dashboard/place.py): a directory
only its user can enter, refused when it is anything else, and the one-time codes."""

from __future__ import annotations

import os

import pytest

from tacc_agent.dashboard import place
from tacc_agent.errors import Rejected


def test_the_directory_is_made_private_and_found_again(tmp_path):
    where = place.private_directory(tmp_path / "d")
    assert where.stat().st_mode & 0o777 == 0o700
    assert place.private_directory(where) == where


@pytest.mark.security
@pytest.mark.parametrize("how", ["open to others", "a link", "another user's", "a file"])
def test_a_directory_someone_else_could_have_made_or_entered_is_refused(tmp_path, how):
    """Another user who made /tmp/tacc-dashboard-<uid> first (or a link there) must not
    get the socket, the secret or the server's log."""
    where = tmp_path / "d"
    if how == "open to others":
        where.mkdir(mode=0o755)
        where.chmod(0o755)
    elif how == "a link":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        where.symlink_to(tmp_path / "elsewhere")
    elif how == "another user's":
        where.mkdir(mode=0o700)
        if os.getuid() != 0:
            pytest.skip("needs root to give the directory away")
        os.chown(where, 2001, 2001)
    else:
        where.write_text("")
    with pytest.raises(Rejected, match="not a private directory of yours"):
        place.private_directory(where)


def test_the_secret_is_the_owners_alone(tmp_path):
    secret = place.write_secret(tmp_path)
    assert (tmp_path / place.SECRET).stat().st_mode & 0o777 == 0o600
    assert place.read_secret(tmp_path) == secret
    assert place.write_secret(tmp_path) != secret  # each server start: a new one


def test_no_secret_yet_is_said(tmp_path):
    with pytest.raises(Rejected, match="no secret yet"):
        place.read_secret(tmp_path)


@pytest.mark.security
def test_a_code_signed_with_another_servers_secret_or_stretched_in_time_is_refused():
    codes = place.Codes(b"a" * place.SECRET_BYTES)
    other = place.mint(b"b" * place.SECRET_BYTES)[0]
    assert not codes.take(other)
    nonce, expires, mac = place.mint(codes.secret)[0].split(".")
    assert not codes.take(f"{nonce}.{int(expires) + 3600}.{mac}")  # the signature covers it
    far = int(expires) + 3600
    assert not codes.take(f"{nonce}.{far}.{place.signature(codes.secret, nonce, far)}")
    assert not codes.take("")
    assert not codes.take("a.b.c")


def test_the_logins_runtime_directory_is_used_where_there_is_one(tmp_path, monkeypatch):
    runtime = tmp_path / "run-user"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert place.directory() == runtime / "tacc-dashboard"
    runtime.chmod(0o755)  # not private: not used
    assert place.directory().name == f"tacc-dashboard-{os.getuid()}"
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/path")
    assert place.directory().name == f"tacc-dashboard-{os.getuid()}"
