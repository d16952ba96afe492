"""roles/directory_server's directory_entries module: slapd's {SSHA} password form (a
stored hash is checked, never replaced while it matches) and which listed attributes
differ from an entry's."""

from __future__ import annotations

import base64
import hashlib

from tests.conftest import role_module

directory_entries = role_module("directory_server", "directory_entries")

# slapd's own hash of "secret-password" with this salt (ldappasswd on slapd 2.6): the
# module must read what slapd writes.
SALT = bytes.fromhex("0011223344556677")
SLAPD_HASH = b"{SSHA}" + base64.b64encode(
    hashlib.sha1(b"secret-password" + SALT).digest() + SALT  # noqa: S324
)


def test_a_password_is_hashed_as_slapd_does() -> None:
    assert directory_entries.ssha("secret-password", SALT) == SLAPD_HASH
    fresh = directory_entries.ssha("secret-password")
    assert fresh.startswith(b"{SSHA}") and fresh != SLAPD_HASH  # a new salt each time


def test_a_stored_hash_is_checked_against_the_password() -> None:
    assert directory_entries.ssha_matches(SLAPD_HASH, "secret-password")
    assert directory_entries.ssha_matches(b"{ssha}" + SLAPD_HASH[6:], "secret-password")
    assert not directory_entries.ssha_matches(SLAPD_HASH, "another-password")
    assert not directory_entries.ssha_matches(b"{CRYPT}$6$x$y", "secret-password")
    assert not directory_entries.ssha_matches(b"{SSHA}not base64!", "secret-password")


def test_values_are_bytes_and_a_single_value_is_a_list() -> None:
    wanted = directory_entries.wanted_values({"cn": "carol", "gidNumber": 30001, "memberUid": []})
    assert wanted == {"cn": [b"carol"], "gidNumber": [b"30001"], "memberUid": []}


def test_only_listed_attributes_that_differ_are_replaced() -> None:
    present = {
        "objectClass": [b"posixGroup"],
        "cn": [b"vision"],
        "gidNumber": [b"30001"],
        "memberUid": [b"carol", b"dave"],
        "description": [b"left alone: not listed"],
    }
    wanted = directory_entries.wanted_values(
        {"objectclass": ["posixGroup"], "cn": "vision", "memberUid": ["dave", "carol"]}
    )
    assert directory_entries.differing(present, wanted) == []  # order and case do not count
    wanted["memberUid"] = [b"carol"]
    wanted["gidNumber"] = [b"30002"]
    assert directory_entries.differing(present, wanted) == ["memberUid", "gidNumber"]
    # an empty list removes the attribute, and matches an entry without it
    assert directory_entries.differing({"cn": [b"x"]}, {"sshPublicKey": []}) == []
