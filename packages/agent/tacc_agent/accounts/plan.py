"""What a sync changes, worked out from what Slurm has and what the directory says, with
no I/O: a list of steps, each one sacctmgr or scancel command and a line that says it.

For each mapped account: it is made (or its fair share and QoS set) as the mapping says;
each member of its groups without an association gets one; a member whose association
was held gets it back. A user of the account who is in none of its groups any more is
held at once (MaxSubmitJobs=0: no new job), then:
- "finish": their pending jobs in the account are cancelled, running ones run to their
  end, and the association goes at the first sync that finds none of theirs there;
- "cancel": all of their jobs in the account are cancelled, and the association goes
  at the first sync that finds them ended.
Before a user's default account goes, another of theirs (mapped or not) becomes the
default. Nobody leaves an account while one of its groups is unknown to NSS, nor while
they are listed in a group but their own entry did not resolve (an outage takes no
association away). Accounts the mapping does not name are never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tacc_agent.accounts.mapping import GroupAccount
from tacc_agent.slurm.accounting import Association

SACCTMGR = ("sacctmgr", "--immediate")
HELD = "0"  # MaxSubmitJobs=0: the association takes no new job
UNHELD = "-1"  # sacctmgr's word for "no limit"


@dataclass(frozen=True)
class Step:
    argv: tuple[str, ...]
    says: str


@dataclass(frozen=True)
class Slurm:
    """What Slurm has: the mapped accounts' associations, their users' default
    accounts, and the (user, account) pairs with a job waiting, and with one started
    (running, completing, suspended: anything but pending)."""

    associations: tuple[Association, ...]
    defaults: dict[str, str]
    waiting: frozenset[tuple[str, str]]
    running: frozenset[tuple[str, str]]
    elsewhere: dict[str, frozenset[str]] = field(default_factory=dict)  # unmapped accounts


@dataclass(frozen=True)
class Groups:
    """What NSS said: group -> its members' names (a group it did not know is absent),
    and the names listed somewhere whose own entry did not resolve (never leavers)."""

    members: dict[str, tuple[str, ...]]
    unresolved: frozenset[str] = frozenset()


def wanted_users(
    mapping: tuple[GroupAccount, ...], members: dict[str, tuple[str, ...]]
) -> dict[str, set[str]]:
    """account -> the users its known groups give it (an account none of whose groups
    NSS knew: not here)."""
    wanted: dict[str, set[str]] = {}
    for entry in mapping:
        if entry.group in members:
            wanted.setdefault(entry.account, set()).update(members[entry.group])
    return wanted


def unsure_accounts(mapping: tuple[GroupAccount, ...], members: dict) -> set[str]:
    """Accounts with a group NSS did not know: members may be added, none removed."""
    return {entry.account for entry in mapping if entry.group not in members}


def account_steps(entry: GroupAccount, own: Association | None, cluster: str) -> list[Step]:
    settings = [f"fairshare={entry.fairshare}"]
    settings += [f"qos={','.join(entry.qos)}"] if entry.qos else []
    settings += [f"defaultqos={entry.default_qos}"] if entry.default_qos else []
    if own is None:
        argv = (*SACCTMGR, "add", "account", entry.account, f"cluster={cluster}", *settings)
        return [Step(argv, f"account {entry.account} made (group {entry.group})")]
    differs = (
        own.fairshare != str(entry.fairshare)
        or (entry.qos and own.qos != frozenset(entry.qos))
        or (entry.default_qos and own.default_qos != entry.default_qos)
    )
    if not differs:
        return []
    where = ("where", f"name={entry.account}", f"cluster={cluster}")
    argv = (*SACCTMGR, "modify", "account", *where, "set", *settings)
    return [Step(argv, f"account {entry.account} set: {' '.join(settings)}")]


def user_where(user: str, account: str, cluster: str) -> tuple[str, ...]:
    return ("where", f"name={user}", f"account={account}", f"cluster={cluster}")


def leaving_steps(
    user: str, account: str, remaining: list[str], slurm: Slurm, policy: str, cluster: str
) -> list[Step]:
    """The steps for a user who is no longer in any group of `account`."""
    held = next(
        a.max_submit == HELD for a in slurm.associations if (a.user, a.account) == (user, account)
    )
    pair = (user, account)
    steps = []
    if not held:
        argv = (*SACCTMGR, "modify", "user", *user_where(user, account, cluster))
        steps.append(Step((*argv, "set", f"maxsubmitjobs={HELD}"), f"{user} held in {account}"))
    if policy == "cancel" and pair in slurm.waiting | slurm.running:
        scancel = ("scancel", f"--user={user}", f"--account={account}")
        steps.append(Step(scancel, f"{user}'s jobs in {account} cancelled"))
    elif pair in slurm.waiting:
        scancel = ("scancel", f"--user={user}", f"--account={account}", "--state=PENDING")
        steps.append(Step(scancel, f"{user}'s pending jobs in {account} cancelled"))
    if pair in slurm.waiting | slurm.running:
        return steps  # held until their jobs there have ended
    if slurm.defaults.get(user) == account and remaining:
        argv = (*SACCTMGR, "modify", "user", "where", f"name={user}", f"cluster={cluster}")
        says = f"{user}'s default account is {remaining[0]}"
        steps.append(Step((*argv, "set", f"defaultaccount={remaining[0]}"), says))
    argv = (*SACCTMGR, "delete", "user", *user_where(user, account, cluster))
    steps.append(Step(argv, f"{user} removed from {account}"))
    return steps


def plan(
    mapping: tuple[GroupAccount, ...], groups: Groups, slurm: Slurm, policy: str, cluster: str
) -> list[Step]:
    """The steps that make the mapped accounts' associations follow `groups`."""
    wanted = wanted_users(mapping, groups.members)
    unsure = unsure_accounts(mapping, groups.members)
    have: dict[str, dict[str, Association]] = {}
    for association in slurm.associations:
        have.setdefault(association.account, {})[association.user] = association
    every_account: dict[str, set[str]] = {}  # user -> every account they keep or get
    for association in slurm.associations:
        if association.user:
            every_account.setdefault(association.user, set()).add(association.account)
    for account, users in wanted.items():
        for user in users:
            every_account.setdefault(user, set()).add(account)
    for user, accounts in slurm.elsewhere.items():
        every_account.setdefault(user, set()).update(accounts)
    first: dict[str, GroupAccount] = {}  # account -> its first entry (they agree: mapping.py)
    for entry in mapping:
        first.setdefault(entry.account, entry)
    entries = [entry for entry in first.values() if entry.account in wanted]
    steps: list[Step] = []
    for entry in entries:  # what is made or given back first: a leaver's new default exists
        users = have.get(entry.account, {})
        steps += account_steps(entry, users.get(""), cluster)
        for user in sorted(wanted[entry.account]):
            if user not in users:
                argv = (*SACCTMGR, "add", "user", user, f"account={entry.account}")
                says = f"{user} added to {entry.account}"
                steps.append(Step((*argv, f"cluster={cluster}"), says))
            elif users[user].max_submit == HELD:
                argv = (*SACCTMGR, "modify", "user", *user_where(user, entry.account, cluster))
                says = f"{user} may submit to {entry.account} again"
                steps.append(Step((*argv, "set", f"maxsubmitjobs={UNHELD}"), says))
    for entry in (entry for entry in entries if entry.account not in unsure):
        leavers = set(have.get(entry.account, {})) - wanted[entry.account] - {""}
        for user in sorted(leavers - groups.unresolved):
            remaining = sorted(
                account
                for account in every_account[user] - {entry.account}
                if account not in wanted or user in wanted[account]
            )
            steps += leaving_steps(user, entry.account, remaining, slurm, policy, cluster)
    return steps
