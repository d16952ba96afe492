"""Who the directory puts in each mapped group, as this node's NSS (SSSD) answers: the
group's listed members (memberUid), each resolved to a user. SSSD's cache of the groups
is dropped first (sss_cache, where installed), so a change in the directory is seen at
the next sync, not when the cache entry expires (90 minutes by default); with the
directory out of reach SSSD answers from its cache, so an outage never empties a group.
"""

from __future__ import annotations

import grp
import pwd
import shutil
from collections.abc import Iterable
from dataclasses import dataclass

from tacc_agent.slurm import run

SYSTEM_UID_MAX = 999  # Debian's system users: never given an account
CACHE_TOOL = "sss_cache"


@dataclass(frozen=True)
class Member:
    name: str
    uid: int
    gid: int  # primary group: the owner group of their workspace


@dataclass(frozen=True)
class Membership:
    members: dict[str, tuple[Member, ...]]  # group -> its users
    unknown_groups: tuple[str, ...]  # groups NSS does not know: their accounts are left alone
    skipped: tuple[str, ...]  # "name (why)": listed members that get nothing


def forget_cached(groups: Iterable[str]) -> None:
    """Make SSSD ask the directory again about these groups (root only)."""
    tool = shutil.which(CACHE_TOOL)
    if tool is None:
        return
    for group in groups:
        run.command([tool, "-g", group], hint="SSSD's tools (sssd-tools)")


def member(name: str) -> Member | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return Member(entry.pw_name, entry.pw_uid, entry.pw_gid)


def read(groups: Iterable[str]) -> Membership:
    wanted = sorted(set(groups))
    forget_cached(wanted)
    members: dict[str, tuple[Member, ...]] = {}
    unknown: list[str] = []
    skipped: list[str] = []
    for group in wanted:
        try:
            names = grp.getgrnam(group).gr_mem
        except KeyError:
            unknown.append(group)
            continue
        found = []
        for name in sorted(set(names)):
            user = member(name)
            if user is None:
                skipped.append(f"{name} (in {group}: no such user)")
            elif user.uid <= SYSTEM_UID_MAX:
                skipped.append(f"{name} (in {group}: a system user, uid {user.uid})")
            else:
                found.append(user)
        members[group] = tuple(found)
    return Membership(members, tuple(unknown), tuple(skipped))
