#!/usr/bin/python
"""Ansible module: which of the common role's settings differ from the node (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: common_drift
short_description: Say which hostname, files, links, groups, users and directories differ
description:
  - Reads the node once and returns, for each kind of setting the common role manages,
    the ones that differ from what is asked, comparing what the module that sets it
    compares (template/copy, file, group, user; for the hostname, /etc/hostname as the
    file strategy does, and also the running kernel's name). The role runs those
    modules only on what differs, so a node that is already right costs one module run
    instead of one per file, account and key.
  - Changes nothing; runs the same in check mode.
options:
  hostname:
    description: Name /etc/hostname and the running kernel should hold.
    type: str
  files:
    description: Regular files, their whole content, owner, group and octal mode.
    type: list
    elements: dict
    default: []
  links:
    description: Symbolic links (path) and the target (src) each should point at.
    type: list
    elements: dict
    default: []
  dirs:
    description: Directories, their owner, group and octal mode.
    type: list
    elements: dict
    default: []
  groups:
    description: Groups (name) and their GID.
    type: list
    elements: dict
    default: []
  users:
    description:
      - Users (name) with uid and primary group (a name); groups (exact supplementary
        groups), shell, home and comment are compared where given.
    type: list
    elements: dict
    default: []
  probe:
    description:
      - Paths to report the kind of (and a link's target), e.g. who owns
        /etc/resolv.conf; read, never compared.
    type: list
    elements: str
    default: []
author: TACC stack
"""

EXAMPLES = r"""
- name: Read what differs on this node
  common_drift:
    hostname: n1
    files:
      - {path: /etc/hosts, content: "127.0.0.1 localhost\n", owner: root, group: root, mode: "0644"}
    groups: [{name: slurm, gid: 64030}]
  register: common_drifted
"""

RETURN = r"""
hostname: {description: Whether the hostname differs., type: bool, returned: always}
files: {description: Paths of the files that differ or are missing., type: list, returned: always}
links: {description: Paths of the links that differ or are missing., type: list, returned: always}
dirs: {description: Paths of the directories that differ or are missing., type: list,
  returned: always}
groups: {description: Names of the groups that differ or are missing., type: list, returned: always}
users: {description: Names of the users that differ or are missing., type: list, returned: always}
probed:
  description: For each probe path, kind (missing, link, dir, file or other) and target (a
    link's, else "").
  type: dict
  returned: always
"""

import grp  # noqa: E402
import os  # noqa: E402
import pwd  # noqa: E402
import socket  # noqa: E402
import stat  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def owner_id(owner: str | int, lookup) -> int | None:
    """A numeric owner as is, a name through lookup (None: no such name)."""
    text = str(owner)
    if text.isdigit():
        return int(text)
    try:
        return lookup(text)
    except KeyError:
        return None


def user_id(name: str | int) -> int | None:
    return owner_id(name, lambda text: pwd.getpwnam(text).pw_uid)


def group_id(name: str | int) -> int | None:
    return owner_id(name, lambda text: grp.getgrnam(text).gr_gid)


def owned_as_asked(info: os.stat_result, want: dict) -> bool:
    return (
        info.st_uid == user_id(want["owner"])
        and info.st_gid == group_id(want["group"])
        and stat.S_IMODE(info.st_mode) == int(str(want["mode"]), 8)
    )


def file_differs(want: dict) -> bool:
    try:
        info = os.lstat(want["path"])
        if not stat.S_ISREG(info.st_mode) or not owned_as_asked(info, want):
            return True
        with open(want["path"], "rb") as handle:
            return handle.read() != want["content"].encode()
    except OSError:
        return True


def dir_differs(want: dict) -> bool:
    try:
        info = os.stat(want["path"])
    except OSError:
        return True
    return not stat.S_ISDIR(info.st_mode) or not owned_as_asked(info, want)


def link_differs(want: dict) -> bool:
    try:
        return os.readlink(want["path"]) != want["src"]
    except OSError:
        return True


def group_differs(want: dict) -> bool:
    try:
        return grp.getgrnam(want["name"]).gr_gid != int(want["gid"])
    except KeyError:
        return True


def user_differs(want: dict) -> bool:
    """What ansible.builtin.user (usermod) would change: uid, primary group, the exact
    supplementary groups (append: false), and shell, home and comment where given."""
    try:
        entry = pwd.getpwnam(want["name"])
    except KeyError:
        return True
    if entry.pw_uid != int(want["uid"]) or entry.pw_gid != group_id(want["group"]):
        return True
    if want.get("groups") is not None:
        member_of = {group.gr_name for group in grp.getgrall() if want["name"] in group.gr_mem}
        if member_of != set(want["groups"]):
            return True
    given = {"shell": entry.pw_shell, "home": entry.pw_dir, "comment": entry.pw_gecos}
    return any(want.get(key) is not None and want[key] != value for key, value in given.items())


def hostname_differs(name: str) -> bool:
    """The file strategy: /etc/hostname holds the name and the kernel runs with it."""
    try:
        with open("/etc/hostname", encoding="utf-8") as handle:
            permanent = handle.read().strip()
    except OSError:
        return True
    return permanent != name or socket.gethostname() != name


def probe(path: str) -> dict:
    """What is at path, without following a link."""
    try:
        info = os.lstat(path)
    except OSError:
        return {"kind": "missing", "target": ""}
    if stat.S_ISLNK(info.st_mode):
        return {"kind": "link", "target": os.readlink(path)}
    kind = (
        "dir" if stat.S_ISDIR(info.st_mode) else "file" if stat.S_ISREG(info.st_mode) else "other"
    )
    return {"kind": kind, "target": ""}


def drift(params: dict) -> dict:
    groups = [g["name"] for g in params["groups"] if group_differs(g)]
    return {
        "hostname": params["hostname"] is not None and hostname_differs(params["hostname"]),
        "files": [f["path"] for f in params["files"] if file_differs(f)],
        "links": [link["path"] for link in params["links"] if link_differs(link)],
        "dirs": [d["path"] for d in params["dirs"] if dir_differs(d)],
        "groups": groups,
        # A user whose primary group gets a new GID is changed with it.
        "users": [u["name"] for u in params["users"] if u["group"] in groups or user_differs(u)],
        "probed": {path: probe(path) for path in params["probe"]},
    }


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "hostname": {"type": "str"},
            "files": {"type": "list", "elements": "dict", "default": []},
            "links": {"type": "list", "elements": "dict", "default": []},
            "dirs": {"type": "list", "elements": "dict", "default": []},
            "groups": {"type": "list", "elements": "dict", "default": []},
            "users": {"type": "list", "elements": "dict", "default": []},
            "probe": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    module.exit_json(changed=False, **drift(module.params))


if __name__ == "__main__":
    main()
