"""The agent config's `directory_accounts`: which directory group gives which Slurm
account, with the account's fair share and QoS, and what becomes of the jobs of a user
who leaves every mapped group (`directory_removed_jobs`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

# Slurm keeps account names in lower case; a group name as POSIX and SSSD allow it.
ACCOUNT_NAME = re.compile(r"[a-z0-9_][a-z0-9_.-]{0,63}")
GROUP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
QOS_NAME = ACCOUNT_NAME
KEYS = ("group", "account", "fairshare", "qos", "default_qos")
# "finish": no new jobs, pending ones cancelled, running ones run to their end; then the
# association goes. "cancel": every job of theirs in the account is cancelled at once.
REMOVED_JOBS = ("finish", "cancel")


@dataclass(frozen=True)
class GroupAccount:
    """One mapping entry: the members of `group` are the users of `account`."""

    group: str
    account: str
    fairshare: int = 1
    qos: tuple[str, ...] = ()  # () keeps what Slurm has
    default_qos: str = ""  # "" keeps what Slurm has


def problem(where: str, entry: object) -> str:
    return f"{where}: expected {{group, account, fairshare, qos, default_qos}}, not {entry!r}"


def group_account(index: int, entry: object) -> GroupAccount:
    """One entry, checked; ValueError saying which entry and field is wrong."""
    where = f"directory_accounts[{index}]"
    if (
        not isinstance(entry, dict)
        or not set(entry) <= set(KEYS)
        or not {"group", "account"} <= set(entry)
    ):
        raise ValueError(problem(where, entry))
    group = entry["group"]
    if not isinstance(group, str) or not GROUP_NAME.fullmatch(group):
        raise ValueError(f"{where}.group: expected a group name, not {group!r}")
    account = entry["account"]
    if not isinstance(account, str) or not ACCOUNT_NAME.fullmatch(account):
        raise ValueError(
            f"{where}.account: expected a Slurm account name (a-z, 0-9, _ . -), not {account!r}"
        )
    fairshare = entry.get("fairshare", 1)
    if isinstance(fairshare, bool) or not isinstance(fairshare, int) or fairshare < 1:
        raise ValueError(f"{where}.fairshare: expected a whole number of shares >= 1")
    qos = entry.get("qos") or []
    if not isinstance(qos, list) or not all(
        isinstance(name, str) and QOS_NAME.fullmatch(name) for name in qos
    ):
        raise ValueError(f"{where}.qos: expected a list of QoS names, not {qos!r}")
    default_qos = entry.get("default_qos") or ""
    if not isinstance(default_qos, str) or (default_qos and default_qos not in qos):
        raise ValueError(f"{where}.default_qos: expected one of its qos {qos}, not {default_qos!r}")
    return GroupAccount(group, account, fairshare, tuple(qos), default_qos)


def group_accounts(raw: object) -> tuple[GroupAccount, ...]:
    """The whole mapping, checked: two entries of one account must agree on its settings
    (several groups may feed one account)."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"directory_accounts: expected a list of entries, not {raw!r}")
    entries = tuple(group_account(index, entry) for index, entry in enumerate(raw))
    settings: dict[str, tuple] = {}
    for entry in entries:
        mine = (entry.fairshare, entry.qos, entry.default_qos)
        if settings.setdefault(entry.account, mine) != mine:
            raise ValueError(
                f"directory_accounts: account {entry.account!r} is given different fairshare, "
                "qos or default_qos by two entries: give them once"
            )
    return entries


def removed_jobs(raw: object) -> str:
    if raw not in REMOVED_JOBS:
        raise ValueError(
            f"directory_removed_jobs: expected {' or '.join(REMOVED_JOBS)}, not {raw!r}"
        )
    return str(raw)


def id_range(raw: object) -> tuple[int, int]:
    """[lowest, highest] uid of the directory's users: whole numbers, 1000 <= low <= high."""
    if (
        not isinstance(raw, list | tuple)
        or len(raw) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in raw)
        or not 1000 <= raw[0] <= raw[1]
    ):
        raise ValueError(
            f"directory_id_range: expected [lowest, highest] uids >= 1000, not {raw!r}"
        )
    return (raw[0], raw[1])
