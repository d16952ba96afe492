"""`tacc-agent accounts sync`: root, on the controller (roles/tacc_agent's timer runs it
every few minutes, site.yml once): the mapped accounts' associations made to follow the
directory's groups (plan.py), and, with --workspace-root (on the host that holds the
workspace: the NFS server), each member's private directory there, made once.

Output: a line per change (or one JSON object with --json: changes, workspaces, skipped,
errors, changed); exit 0, or 1 when a step failed or a group is unknown (the timer's
unit then shows failed), 4 when not root. A group NSS does not know leaves its account
as it is: an unreachable directory never takes anyone's account away."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from tacc_agent import locks
from tacc_agent.accounts import membership
from tacc_agent.accounts.mapping import GroupAccount
from tacc_agent.accounts.membership import Member, Membership
from tacc_agent.accounts.plan import Groups, Slurm, Step, plan
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_OK, AgentError
from tacc_agent.slurm import accounting, controller, queue, run

EXIT_FAILED = 1
EXIT_NOT_ROOT = 4
TIMEOUT = 30.0
LOCK = "/run/tacc-accounts-sync.lock"  # root's: only root runs a sync


@dataclass
class Outcome:
    changes: list[str] = field(default_factory=list)
    workspaces: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        changed = bool(self.changes or self.workspaces)
        return {**self.__dict__, "changed": changed}


def slurm_state(cluster: str, accounts: list[str]) -> Slurm:
    found = accounting.associations(cluster, "accounts", accounts, TIMEOUT)
    users = sorted({a.user for a in found if a.user})
    elsewhere: dict[str, set[str]] = {}
    for other in accounting.associations(cluster, "users", users, TIMEOUT):
        if other.account not in accounts:
            elsewhere.setdefault(other.user, set()).add(other.account)
    jobs = queue.job_owners(TIMEOUT)
    waiting = frozenset((user, account) for user, account, state in jobs if state == "PENDING")
    running = frozenset((user, account) for user, account, state in jobs if state != "PENDING")
    defaults = accounting.default_accounts(users, TIMEOUT)
    frozen = {user: frozenset(names) for user, names in elsewhere.items()}
    return Slurm(tuple(found), defaults, waiting, running, frozen)


def apply(steps: list[Step], outcome: Outcome, dry_run: bool) -> None:
    for step in steps:
        if dry_run:
            outcome.changes.append(step.says)
            continue
        done = run.command(list(step.argv), TIMEOUT)
        if done.code == 0:
            outcome.changes.append(step.says)
        else:
            why = (done.stderr or done.stdout).strip().splitlines()[-1:] or [f"exit {done.code}"]
            outcome.errors.append(f"{step.says}: {' '.join(step.argv)}: {why[0]}")


class WorkspaceProblem(Exception):
    """The workspace root cannot be trusted: no workspace is made under it."""


def workspace_root(root: Path) -> int:
    """The root opened without following a link: WorkspaceProblem unless it is a
    directory of root's that nobody else may write to."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise WorkspaceProblem(f"workspace root {root}: {exc.strerror}") from None
    info = os.fstat(fd)
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        os.close(fd)
        raise WorkspaceProblem(f"workspace root {root}: not root's alone (0755 root expected)")
    return fd


def make_workspaces(root: Path, users: list[Member], outcome: Outcome, dry_run: bool) -> None:
    """<root>/<user>, owned by the user and their primary group, 0700, where missing
    (made inside the root opened once, never through a link); one that exists must be
    the user's already (the role or an earlier sync made it), else it is an error."""
    try:
        fd = workspace_root(root)
    except WorkspaceProblem as exc:
        outcome.errors.append(str(exc))
        return
    try:
        for user in users:
            path = root / user.name
            try:
                have = os.stat(user.name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                have = None
            if have is not None:
                if not stat.S_ISDIR(have.st_mode) or have.st_uid != user.uid:
                    outcome.errors.append(f"{path}: exists, not {user.name}'s directory")
                continue
            if not dry_run:
                try:
                    os.mkdir(user.name, 0o700, dir_fd=fd)
                    os.chown(user.name, user.uid, user.gid, dir_fd=fd, follow_symlinks=False)
                    os.chmod(user.name, 0o700, dir_fd=fd, follow_symlinks=False)
                except OSError as exc:
                    outcome.errors.append(f"{path}: {exc.strerror}")
                    continue
            outcome.workspaces.append(f"{path} made for {user.name}")
    finally:
        os.close(fd)


def sync(config: AgentConfig, slurm: bool, root: str, dry_run: bool) -> Outcome:
    entries: tuple[GroupAccount, ...] = config.directory_accounts
    outcome = Outcome()
    found: Membership = membership.read((e.group for e in entries), config.directory_id_range)
    outcome.skipped += found.skipped
    outcome.errors += [
        f"group {group}: unknown to this node (NSS/SSSD): nobody leaves its account"
        for group in found.unknown_groups
    ]
    if slurm and entries:
        cluster = controller.show_config(TIMEOUT).get("ClusterName", "")
        if not cluster:
            raise AgentError("scontrol show config: no ClusterName")
        accounts = sorted({entry.account for entry in entries})
        names = {group: tuple(m.name for m in users) for group, users in found.members.items()}
        groups = Groups(names, found.unresolved)
        steps = plan(
            entries, groups, slurm_state(cluster, accounts), config.directory_removed_jobs, cluster
        )
        apply(steps, outcome, dry_run)
    if root:
        users = {m.name: m for members in found.members.values() for m in members}
        ordered = sorted(users.values(), key=lambda m: m.name)
        make_workspaces(Path(root), ordered, outcome, dry_run)
    return outcome


def run_sync(config: AgentConfig, slurm: bool, root: str, dry_run: bool, as_json: bool) -> int:
    """The verb: `root` is --workspace-root ("" none)."""
    if os.geteuid() != 0:
        print("accounts sync: run it as root (the timer tacc-accounts-sync does)")
        return EXIT_NOT_ROOT
    # One round at a time on a host: the timer's and a playbook's never add the same user.
    with locks.lock_file(LOCK, locks.FLOCK, wait=True):
        outcome = sync(config, slurm, root, dry_run)
    if as_json:
        print(json.dumps(outcome.as_dict(), sort_keys=True))
    else:
        for line in (*outcome.changes, *outcome.workspaces):
            print(line)
        for line in outcome.skipped:
            print(f"skipped: {line}")
        for line in outcome.errors:
            print(f"error: {line}")
    return EXIT_FAILED if outcome.errors else AGENT_OK
