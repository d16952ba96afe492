"""Who the directory puts in each mapped group, as this node's NSS (SSSD) answers: the
group's listed members (memberUid), each resolved to a user. SSSD's cache of the groups
is dropped first (sss_cache, where installed), so a change in the directory is seen at
the next sync, not when the cache entry expires; with the directory out of reach SSSD
answers from its cache. A member counts only with a name Slurm keeps as it is (lower
case, no comma, "=" or "/": it goes into sacctmgr's words and a workspace path) and a
uid in the directory's range (the identity role's, so never root, a service account,
nobody or a local user); a listed name that does not resolve is `unresolved` (kept as
it is: a lookup that failed takes no association away)."""

from __future__ import annotations

import grp
import pwd
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass

from tacc_agent.slurm import run

CACHE_TOOL = "sss_cache"
# What Slurm stores unchanged (it lower-cases user names) and a path takes as one name.
USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class Member:
    name: str
    uid: int
    gid: int  # primary group: the owner group of their workspace


@dataclass(frozen=True)
class Membership:
    members: dict[str, tuple[Member, ...]]  # group -> its users
    unknown_groups: tuple[str, ...]  # groups NSS does not know: nobody leaves their accounts
    unresolved: frozenset[str]  # listed names whose entry did not resolve: left as they are
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


def read(groups: Iterable[str], ids: tuple[int, int]) -> Membership:
    """The members of `groups` with a uid in ids (lowest, highest)."""
    wanted = sorted(set(groups))
    forget_cached(wanted)
    members: dict[str, tuple[Member, ...]] = {}
    unknown: list[str] = []
    unresolved: set[str] = set()
    skipped: list[str] = []
    for group in wanted:
        try:
            names = grp.getgrnam(group).gr_mem
        except KeyError:
            unknown.append(group)
            continue
        found = []
        for name in sorted(set(names)):
            if not USER_NAME.fullmatch(name):
                skipped.append(f"{name!r} (in {group}: not a name Slurm keeps as it is)")
                continue
            user = member(name)
            if user is None:
                unresolved.add(name)
                skipped.append(f"{name} (in {group}: no such user now; left as it is)")
            elif not ids[0] <= user.uid <= ids[1]:
                skipped.append(f"{name} (in {group}: uid {user.uid} outside {ids[0]}..{ids[1]})")
            else:
                found.append(user)
        members[group] = tuple(found)
    return Membership(members, tuple(unknown), frozenset(unresolved), tuple(skipped))
