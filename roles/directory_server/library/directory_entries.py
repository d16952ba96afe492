#!/usr/bin/python
"""Ansible module: make the listed LDAP entries exist with the listed attribute values."""

from __future__ import annotations

DOCUMENTATION = r"""
module: directory_entries
short_description: Create or update entries of the local slapd over ldapi as root
description:
  - Binds to the slapd of this host over C(ldapi:///) with SASL EXTERNAL (root's peer
    credentials: the rootDN of the role's configuration, so no password exists for it).
  - Adds each listed entry that is missing and replaces, on each present one, the listed
    attributes whose values differ (compared as sets). Attributes not listed and entries not
    listed are left alone: nothing is ever removed.
  - Sets the password of each O(passwords[]) entry (a salted SHA-1 hash, C({SSHA}), as slapd
    makes) only when the stored hash does not match it, so a re-run changes nothing.
  - Supports check mode and diff mode (passwords are never shown).
options:
  entries:
    description: Entries in the order they are added (parents first).
    type: list
    elements: dict
    default: []
    suboptions:
      dn: {description: Distinguished name., type: str, required: true}
      attributes:
        description: Attribute name -> list of values (a single value may be a string).
        type: dict
        required: true
  passwords:
    description: Entries whose userPassword is set.
    type: list
    elements: dict
    default: []
    suboptions:
      dn: {description: An entry listed or already present., type: str, required: true}
      password: {description: In clear (never logged)., type: str, required: true, no_log: true}
  uri:
    description: slapd's local socket.
    type: str
    default: ldapi:///
requirements: [python3-ldap on the target]
author: TACC stack
"""

EXAMPLES = r"""
- name: A group and its members
  directory_entries:
    entries:
      - dn: cn=vision,ou=groups,dc=cluster,dc=internal
        attributes: {objectClass: [posixGroup], cn: vision, gidNumber: "30001", memberUid: [carol]}
"""

RETURN = r"""
added:
  description: DNs added (or, in check mode, that would be).
  type: list
  elements: str
  returned: always
modified:
  description: DNs whose attributes or password were changed.
  type: list
  elements: str
  returned: always
"""

import base64  # noqa: E402
import hashlib  # noqa: E402
import hmac  # noqa: E402
import os  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402

try:
    import ldap
    import ldap.modlist
    import ldap.sasl

    HAS_LDAP = True
except ImportError:  # reported by main()
    HAS_LDAP = False

SALT_BYTES = 8


def sha1_digest(password: str, salt: bytes) -> bytes:
    return hashlib.sha1(password.encode() + salt).digest()  # noqa: S324 - slapd's {SSHA}


def ssha(password: str, salt: bytes | None = None) -> bytes:
    """userPassword in slapd's default {SSHA} form: base64(sha1(password + salt) + salt)."""
    salt = os.urandom(SALT_BYTES) if salt is None else salt
    return b"{SSHA}" + base64.b64encode(sha1_digest(password, salt) + salt)


def ssha_matches(stored: bytes, password: str) -> bool:
    """Whether a stored {SSHA} value is this password's hash (any other scheme: no)."""
    if not stored.upper().startswith(b"{SSHA}"):
        return False
    try:
        raw = base64.b64decode(stored[6:], validate=True)
    except ValueError:
        return False
    digest, salt = raw[:20], raw[20:]
    return hmac.compare_digest(sha1_digest(password, salt), digest)


def wanted_values(attributes: dict) -> dict[str, list[bytes]]:
    """Attribute -> values as bytes, a single value given as a string or number included."""
    wanted = {}
    for name, values in attributes.items():
        listed = values if isinstance(values, list) else [values]
        wanted[name] = [str(value).encode() for value in listed]
    return wanted


def differing(present: dict[str, list[bytes]], wanted: dict[str, list[bytes]]) -> list[str]:
    """Listed attributes whose values differ from the entry's (as sets; names are
    case-insensitive in LDAP)."""
    by_lower = {name.lower(): values for name, values in present.items()}
    return [
        name
        for name, values in wanted.items()
        if set(values) != set(by_lower.get(name.lower(), []))
    ]


def read_entry(conn, dn: str) -> dict[str, list[bytes]] | None:
    try:
        found = conn.search_s(dn, ldap.SCOPE_BASE, "(objectClass=*)", ["*", "userPassword"])
    except ldap.NO_SUCH_OBJECT:
        return None
    return found[0][1] if found else None


def run(module: AnsibleModule, conn) -> dict:
    added: list[str] = []
    modified: list[str] = []
    before: list[str] = []
    after: list[str] = []
    check = module.check_mode
    passwords = {item["dn"]: item["password"] for item in module.params["passwords"]}
    for entry in module.params["entries"]:
        dn = entry["dn"]
        wanted = wanted_values(entry["attributes"])
        present = read_entry(conn, dn)
        if present is None:
            added.append(dn)
            after.append(f"+ {dn}")
            if dn in passwords:  # its object class may require one (simpleSecurityObject)
                wanted["userPassword"] = [ssha(passwords.pop(dn))]
            if not check:
                conn.add_s(dn, ldap.modlist.addModlist(wanted))
            continue
        changes = differing(present, wanted)
        if changes:
            modified.append(dn)
            before.append(f"{dn}: " + ", ".join(f"{n}={_show(present, n)}" for n in changes))
            after.append(f"{dn}: " + ", ".join(f"{n}={_show(wanted, n)}" for n in changes))
            if not check:
                conn.modify_s(dn, [(ldap.MOD_REPLACE, name, wanted[name]) for name in changes])
    for dn, password in passwords.items():
        present = read_entry(conn, dn) or {}
        stored = {k.lower(): v for k, v in present.items()}.get("userpassword", [])
        if any(ssha_matches(value, password) for value in stored):
            continue
        if dn not in modified:
            modified.append(dn)
        after.append(f"{dn}: userPassword (set)")
        if not check:
            conn.modify_s(dn, [(ldap.MOD_REPLACE, "userPassword", [ssha(password)])])
    changed = bool(added or modified)
    diff = {"before": "\n".join(before) + "\n", "after": "\n".join(after) + "\n"}
    return {"changed": changed, "added": added, "modified": modified, "diff": diff}


def _show(values: dict[str, list[bytes]], name: str) -> str:
    by_lower = {key.lower(): value for key, value in values.items()}
    return "|".join(sorted(v.decode(errors="replace") for v in by_lower.get(name.lower(), [])))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "entries": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "options": {
                    "dn": {"type": "str", "required": True},
                    "attributes": {"type": "dict", "required": True},
                },
            },
            "passwords": {
                "type": "list",
                "elements": "dict",
                "default": [],
                "no_log": True,
                "options": {
                    "dn": {"type": "str", "required": True},
                    "password": {"type": "str", "required": True, "no_log": True},
                },
            },
            "uri": {"type": "str", "default": "ldapi:///"},
        },
        supports_check_mode=True,
    )
    if not HAS_LDAP:
        module.fail_json(msg="directory_entries needs python3-ldap on the directory host")
    try:
        conn = ldap.initialize(module.params["uri"])
        conn.sasl_interactive_bind_s("", ldap.sasl.external())
        module.exit_json(**run(module, conn))
    except ldap.LDAPError as exc:
        detail = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else {}
        words = detail.get("desc", str(exc))
        if detail.get("info"):
            words += f" ({detail['info']})"
        module.fail_json(msg=f"slapd at {module.params['uri']}: {words}")


if __name__ == "__main__":
    main()
