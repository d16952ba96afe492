"""Issue [21] point 1, directory users, on the factory's `hw` lab (tests/integration/
labs.py: HW, 10.77.11.0/24, three nodes, `tacc-lab up --directory`), converged from the
bare image by site.yml, which imports playbooks/directory.yml: slapd with TLS on n1 and
SSSD on every node. carol and dave exist only in
the directory and resolve by name and number the same on every node, beside the
inventory's alice; carol logs in with the SSH key the directory holds and not with
dave's; the directory gives nothing to anonymous readers and takes no password over a
connection without TLS; the bind password is root's only.
"""

from __future__ import annotations

import shlex

import pytest

from tacc_lab.config import STATE_ROOT
from tests.integration.lab_helpers import lab_ssh_as, node_ok, node_sh
from tests.integration.labs import HW

pytestmark = pytest.mark.lab

NAME = HW.name
NODES = ("n1", "n2", "n3")
SERVER = "ldap://n1"


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


@pytest.fixture(scope="module")
def converged(site_from_nothing) -> dict:
    """The hw lab after site.yml's runs (site_from_nothing.py; test_hardware_roles.py
    checks that identity and directory_server change nothing in the second run and in
    --check --diff)."""
    return site_from_nothing


def test_d1_directory_users_resolve_by_name_and_number_the_same_on_every_node(converged):
    seen = {}
    for node in NODES:
        seen[node] = sh(
            node,
            "getent passwd carol dave 20001; getent group vision visitors 30001; "
            "id carol; getent -s files passwd carol || echo 'not local'",
        )
    assert len(set(seen.values())) == 1, seen  # the same answers on every node
    lines = seen["n1"].splitlines()
    assert lines[0] == "carol:*:20001:20001:carol:/home/carol:/bin/bash", lines
    assert lines[1].startswith("dave:*:20002:20002:"), lines
    assert lines[2] == lines[0]  # by number: the same user
    assert lines[3] == "vision:*:30001:carol", lines
    assert lines[4] == "visitors:*:30002:dave", lines
    assert lines[5] == lines[3]
    assert lines[6] == "uid=20001(carol) gid=20001(carol) groups=20001(carol),30001(vision)"
    assert lines[7] == "not local"  # from the directory, not /etc/passwd


def test_d1_inventory_users_live_beside_the_directory(converged):
    for node in NODES:
        local = sh(node, "getent -s files passwd alice; getent -s sss passwd alice || true")
        assert local.splitlines() == [local.splitlines()[0]], local  # files only
        assert local.startswith("alice:x:2001:2001:"), local


def test_d1_a_researcher_logs_in_with_the_key_the_directory_holds(converged):
    login = lab_ssh_as(NAME, "carol", "n1", "id -un; test -e ~/.ssh/authorized_keys || echo none")
    assert login.returncode == 0, login.stderr
    assert login.stdout.split() == ["carol", "none"], login.stdout  # no key file: the directory's
    keys = sh("n1", "sss_ssh_authorizedkeys carol")
    assert keys.startswith("ssh-ed25519 ") and keys.rstrip().endswith(f"carol@tacc-lab-{NAME}")


@pytest.mark.security
def test_d1_anothers_key_does_not_log_in_and_a_local_name_gets_no_directory_key(converged):
    """dave's key is dave's: carol's account does not take it; alice (local, not in the
    directory) gets no key from it."""
    refused = lab_ssh_as(NAME, "carol", "n1", "id -un", key_of="dave")
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    assert lab_ssh_as(NAME, "dave", "n1", "id -un").stdout.strip() == "dave"
    assert node_sh(NAME, "n1", "sss_ssh_authorizedkeys alice").stdout == ""


@pytest.mark.security
def test_d1_a_directory_entry_named_like_a_local_account_or_group_gets_nothing(converged):
    """What a site's directory admin (or an accidental name clash) could add by hand: a
    user `bob`, named like the inventory's local bob, holding dave's key, and a group
    `sudo` with carol in it. Neither lends anything: bob stays the local account, dave's
    key does not log in as him, carol gains no group named sudo."""
    ldif = (
        "dn: uid=bob,ou=people,dc=cluster,dc=internal\nobjectClass: inetOrgPerson\n"
        "objectClass: posixAccount\nobjectClass: ldapPublicKey\nuid: bob\ncn: bob\nsn: bob\n"
        "uidNumber: 20099\ngidNumber: 20099\nhomeDirectory: /home/bob\n"
        "sshPublicKey: $(cat /root/dave.pub)\n\n"
        "dn: cn=sudo,ou=groups,dc=cluster,dc=internal\nobjectClass: posixGroup\ncn: sudo\n"
        "gidNumber: 20027\nmemberUid: carol\n"
    )
    dave_key = (STATE_ROOT / NAME / "users/dave/id_ed25519.pub").read_text().strip()
    sh("n1", f"echo {shlex.quote(dave_key)} > /root/dave.pub")
    sh("n1", f'printf "{ldif}" | ldapadd -Q -Y EXTERNAL -H ldapi:///')
    try:
        for node in NODES:
            sh(node, "sss_cache -E")
        refused = lab_ssh_as(NAME, "bob", "n1", "id -un", key_of="dave")
        assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
        for node in NODES:
            seen = sh(node, "getent passwd bob; id -Gn carol; sss_ssh_authorizedkeys bob || true")
            lines = seen.splitlines()
            assert lines[0].startswith("bob:x:2002:"), seen  # the local bob, not 20099
            assert "sudo" not in lines[1].split(), seen
            assert not any(line.startswith("ssh-") for line in lines[2:]), seen
    finally:
        node_sh(
            NAME,
            "n1",
            "ldapdelete -Q -Y EXTERNAL -H ldapi:/// uid=bob,ou=people,dc=cluster,dc=internal "
            "cn=sudo,ou=groups,dc=cluster,dc=internal; rm -f /root/dave.pub",
        )


@pytest.mark.security
def test_d1_a_local_group_added_after_the_run_is_kept_from_the_directory_too(converged):
    """A package or an admin adds a local group after site.yml ran: the watcher
    (tacc-sssd-local-names.service, no path unit) adds it to SSSD's filter within
    seconds, so a directory group of that name lends it to nobody."""
    assert sh("n3", "systemctl is-active tacc-sssd-local-names.service").strip() == "active"
    assert node_sh(NAME, "n3", "systemctl cat tacc-sssd-local-names.path").returncode != 0
    ldif = (
        "dn: cn=labstaff,ou=groups,dc=cluster,dc=internal\nobjectClass: posixGroup\n"
        "cn: labstaff\ngidNumber: 20028\nmemberUid: carol\n"
    )
    sh("n3", "groupadd --system labstaff")
    try:
        sh(
            "n3",
            "for i in $(seq 60); do grep -q '^filter_groups = .*labstaff' "
            "/etc/sssd/conf.d/50-tacc-local-names.conf && exit 0; sleep 0.5; done; exit 1",
        )
        sh("n1", f'printf "{ldif}" | ldapadd -Q -Y EXTERNAL -H ldapi:///')
        sh("n3", "sss_cache -E")
        assert "labstaff" not in sh("n3", "id -Gn carol").split()
        assert "labstaff" in sh("n1", "sss_cache -E; id -Gn carol").split()  # as written
    finally:
        node_sh(NAME, "n3", "groupdel labstaff")
        node_sh(
            NAME,
            "n1",
            "ldapdelete -Q -Y EXTERNAL -H ldapi:/// cn=labstaff,ou=groups,dc=cluster,dc=internal",
        )


@pytest.mark.security
def test_d1_the_directory_gives_anonymous_nothing_and_no_password_without_tls(converged):
    ca = "LDAPTLS_CACERT=/etc/ldap/tls/ca.crt"
    anonymous = node_sh(
        NAME, "n1", f"{ca} ldapsearch -x -ZZ -LLL -H {SERVER} -b dc=cluster,dc=internal uid=carol"
    )
    assert anonymous.returncode == 32, anonymous  # No such object: the tree is not readable
    # The SSSD account's password over plain LDAP is refused before it is checked.
    plain = node_sh(
        NAME,
        "n1",
        "umask 077; grep '^ldap_default_authtok =' /etc/sssd/sssd.conf | cut -d' ' -f3- "
        "| tr -d '\\n' > /root/bindpw; "
        f"ldapwhoami -x -H {SERVER} -D uid=sssd,ou=services,dc=cluster,dc=internal "
        "-y /root/bindpw; echo rc=$?; rm -f /root/bindpw",
    )
    assert "Confidentiality required" in plain.stdout + plain.stderr, plain
    # With StartTLS it binds, and sees users but not their passwords.
    bound = node_sh(
        NAME,
        "n1",
        "umask 077; grep '^ldap_default_authtok =' /etc/sssd/sssd.conf | cut -d' ' -f3- "
        "| tr -d '\\n' > /root/bindpw; "
        f"{ca} ldapsearch -x -ZZ -LLL -H {SERVER} -D uid=sssd,ou=services,dc=cluster,dc=internal "
        "-y /root/bindpw -b dc=cluster,dc=internal '(objectClass=*)' userPassword uid; "
        "echo rc=$?; rm -f /root/bindpw",
    )
    assert "rc=0" in bound.stdout and "uid: carol" in bound.stdout, bound
    assert "userPassword" not in bound.stdout, bound


@pytest.mark.security
def test_d1_the_bind_password_is_root_only_and_the_server_is_verified(converged):
    for node in NODES:
        mode = sh(node, "stat -c '%U:%G %a' /etc/sssd/sssd.conf").strip()
        assert mode in ("root:root 600", "root:root 640"), (node, mode)
        conf = sh(node, "grep -E '^ldap_(tls_reqcert|id_use_start_tls|uri) ' /etc/sssd/sssd.conf")
        assert "ldap_tls_reqcert = demand" in conf and "ldap_id_use_start_tls = true" in conf
    key = sh("n1", "stat -c '%U:%G %a' /etc/ldap/tls/server.key").strip()
    assert key == "root:openldap 640", key
