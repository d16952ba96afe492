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
from dataclasses import dataclass, field
from pathlib import Path

from tacc_agent import locks
from tacc_agent.accounts import membership
from tacc_agent.accounts.mapping import GroupAccount
from tacc_agent.accounts.membership import Member, Membership
from tacc_agent.accounts.plan import Slurm, Step, plan
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


def slurm_state(config: AgentConfig, cluster: str, accounts: list[str]) -> Slurm:
    found = accounting.associations(cluster, accounts, TIMEOUT)
    users = sorted({a.user for a in found if a.user})
    jobs = queue.job_owners(TIMEOUT)
    waiting = frozenset((user, account) for user, account, state in jobs if state == "PENDING")
    running = frozenset((user, account) for user, account, state in jobs if state != "PENDING")
    defaults = accounting.default_accounts(users, TIMEOUT)
    return Slurm(tuple(found), defaults, waiting, running)


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


def make_workspaces(root: Path, users: list[Member], outcome: Outcome, dry_run: bool) -> None:
    """<root>/<user>, owned by the user and their primary group, 0700, where missing; one
    that exists is theirs already (the role or an earlier sync made it) and is left alone."""
    if not root.is_dir():
        outcome.errors.append(f"workspace root {root}: not a directory on this host")
        return
    for user in users:
        path = root / user.name
        if path.exists() or path.is_symlink():
            continue
        if not dry_run:
            os.mkdir(path, 0o700)
            os.chown(path, user.uid, user.gid, follow_symlinks=False)
            os.chmod(path, 0o700, follow_symlinks=False)
        outcome.workspaces.append(f"{path} made for {user.name}")


def sync(config: AgentConfig, slurm: bool, workspace_root: str, dry_run: bool) -> Outcome:
    entries: tuple[GroupAccount, ...] = config.directory_accounts
    outcome = Outcome()
    found: Membership = membership.read(entry.group for entry in entries)
    outcome.skipped += found.skipped
    outcome.errors += [
        f"group {group}: unknown to this node (NSS/SSSD): its account is left as it is"
        for group in found.unknown_groups
    ]
    if slurm and entries:
        cluster = controller.show_config(TIMEOUT).get("ClusterName", "")
        if not cluster:
            raise AgentError("scontrol show config: no ClusterName")
        accounts = sorted({entry.account for entry in entries})
        names = {group: tuple(m.name for m in users) for group, users in found.members.items()}
        state = slurm_state(config, cluster, accounts)
        steps = plan(entries, names, state, config.directory_removed_jobs, cluster)
        apply(steps, outcome, dry_run)
    if workspace_root:
        users = {m.name: m for members in found.members.values() for m in members}
        make_workspaces(
            Path(workspace_root), sorted(users.values(), key=lambda m: m.name), outcome, dry_run
        )
    return outcome


def run_sync(
    config: AgentConfig, slurm: bool, workspace_root: str, dry_run: bool, as_json: bool
) -> int:
    if os.geteuid() != 0:
        print("accounts sync: run it as root (the timer tacc-accounts-sync does)")
        return EXIT_NOT_ROOT
    # One round at a time on a host: the timer's and a playbook's never add the same user.
    with locks.lock_file(LOCK, locks.FLOCK, wait=True):
        outcome = sync(config, slurm, workspace_root, dry_run)
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
