"""The most nodes Slurm's limits let one job hold, read as root before the agent grows it
(`Queue.resize`). Root's `scontrol update JobId=N NumNodes=K-K` is an administrator's
change, which Slurm does not hold to the job's QOS or association limits: the agent
holds it to them itself, at each grow, and again once the job is held.

Read, for each partition the job may run in (a pending job may name several: each
one's limits apply, so the strictest counts):

- the partition's MaxNodes (`scontrol show partition`), always;
- where Slurm enforces accounting limits (`scontrol show config`: AccountingStorageEnforce
  names limits, qos or safe): the job's QOS and the partition's own QOS (QOS=), each's
  MaxTRES (per job), MaxTRESPU (per user), MaxTRESPA (per account) and GrpTRES (all its
  jobs); the association of the job's owner and account (MaxTRES, GrpTRES), and of that
  account and every account above it up to root (MaxTRES, GrpTRES: the jobs of every
  account below it), from `sacctmgr show assoc` on this cluster.

A job at K nodes holds K times what it holds per node (TRES=cpu=8,node=2,gres/gpu=4: 4
CPUs and 2 GPUs a node, and 1 node): each limit on a TRES it holds caps K. A limit over
many jobs counts what the running jobs it covers hold (`slurm.queue.running_jobs`). Memory and
other sizes (mem=512G) are counted in megabytes, as Slurm counts them.

Not read: limits over time (GrpTRESMins, GrpTRESRunMins, MaxWall), per node
(MaxTRESPerNode, which a grow does not change) and job counts (MaxJobs, GrpJobs). Each
limit is applied whatever Slurm's precedence between them (OverPartQOS, a user's
association over its account's): the strictest stands. Anything not understood (a TRES
value, a missing association or QOS, a line of squeue's) refuses the grow, named.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from tacc_agent import slurm
from tacc_agent.errors import AgentError
from tacc_agent.slurm.accounting import sacctmgr_show
from tacc_agent.slurm.nodes import PartitionRecord
from tacc_agent.slurm.queue import RunningJob
from tacc_agent.slurm.tres import counts as tres_counts

MAX_NODES = 100_000  # no partition has more
ENFORCING = frozenset({"limits", "qos", "safe"})  # each makes Slurm hold jobs to limits
COUNT = re.compile(r"\d+")
NO_QOS = ("", "N/A")
QOS_FIELDS = (
    ("MaxTRES", "MaxTRESPerJob"),
    ("MaxTRESPU", "MaxTRESPerUser"),
    ("MaxTRESPA", "MaxTRESPerAccount"),
    ("GrpTRES", "GrpTRES"),
)
ASSOC_COLUMNS = ("Account", "ParentName", "User", "MaxTRES", "GrpTRES")

Tres = dict[str, int]


def per_node(tres: Tres, nodes: int) -> Tres:
    """What a job holding `tres` on `nodes` nodes holds on each (rounded up); 1 node."""
    count = tres.get("node") or nodes or 1
    shares = {name: -(-value // count) for name, value in tres.items() if value > 0}
    return shares | {"node": 1}


@dataclass(frozen=True)
class Scope:
    """The running jobs that count against a limit together with the job's own: those
    of `user` (when set), in `accounts` (when set), under `qos` (when set: their QOS or
    their partition's)."""

    user: str = ""
    accounts: frozenset[str] | None = None
    qos: str = ""


@dataclass(frozen=True)
class Limit:
    where: str  # "QOS normal MaxTRESPerUser"
    tres: Tres
    scope: Scope | None = None  # None: the job alone


@dataclass(frozen=True)
class Limits:
    entries: list[Limit]
    partition_qos: dict[str, str]  # each partition's own QOS, for Scope.qos

    def over_many_jobs(self) -> bool:
        return any(limit.scope is not None for limit in self.entries)


@dataclass(frozen=True)
class JobPlace:
    """Where a job counts against Slurm's limits, as Slurm's record of it says."""

    job_id: str
    user: str
    partitions: tuple[str, ...]
    qos: str
    account: str


def enforced(config: dict[str, str]) -> bool:
    """Whether Slurm's settings (slurm.controller.show_config) say it holds jobs to QOS
    and association limits."""
    words = set(config.get("AccountingStorageEnforce", "").lower().split(","))
    return bool(words & ENFORCING)


def partition_limits(place: JobPlace, timeout: float) -> Limits:
    """MaxNodes of each of the job's partitions, and every partition's own QOS."""
    records: dict[str, PartitionRecord] = {
        record.name: record for record in slurm.nodes.all_partitions(timeout)
    }
    entries = []
    for name in place.partitions:
        if name not in records:
            raise AgentError(f"partition {name}: not shown by scontrol show partition")
        most = records[name].max_nodes
        if COUNT.fullmatch(most):
            entries.append(Limit(f"partition {name} MaxNodes", {"node": int(most)}))
        elif most != "UNLIMITED":
            raise AgentError(f"partition {name}: MaxNodes={most[:40]!r} not understood")
    qos = {name: record.qos for name, record in records.items()}
    return Limits(entries, {name: q.lower() for name, q in qos.items() if q not in NO_QOS})


def qos_limits(place: JobPlace, qos: str, timeout: float) -> list[Limit]:
    columns = ("Name", *(field for field, _ in QOS_FIELDS))
    found = sacctmgr_show(["qos", "where", f"name={qos}"], columns, timeout)
    rows = [row for row in found if row[0].lower() == qos]
    if not rows:
        raise AgentError(f"QOS {qos}: not shown by sacctmgr show qos")
    scopes = (
        None,
        Scope(user=place.user, qos=qos),
        Scope(accounts=frozenset({place.account}), qos=qos),
        Scope(qos=qos),
    )
    limits = []
    for row in rows:
        if len(row) != 1 + len(QOS_FIELDS):
            raise AgentError(f"QOS {qos}: sacctmgr's line not understood: {'|'.join(row)[:200]!r}")
        for (_, name), text, scope in zip(QOS_FIELDS, row[1:], scopes, strict=True):
            where = f"QOS {qos} {name}"
            limits.append(Limit(where, tres_counts(text, where), scope))
    return limits


def below(account: str, parents: dict[str, str]) -> frozenset[str]:
    """The account and every account under it."""
    found = {account}
    for name in parents:
        chain, seen = name, set()
        while chain and chain not in seen:
            if chain == account:
                found.add(name)
                break
            seen.add(chain)
            chain = parents.get(chain, "")
    return frozenset(found)


def association_limits(place: JobPlace, cluster: str, timeout: float) -> list[Limit]:
    """The owner's association for the job's account, and that account's and each
    parent's up to root (see the module's docstring)."""
    where = ["where", f"cluster={cluster}"] if cluster else []
    rows = sacctmgr_show(["assoc", *where], ASSOC_COLUMNS, timeout)
    if any(len(row) != 5 for row in rows):
        raise AgentError("sacctmgr show assoc: a line not understood")
    rows = [[row[0].lower(), row[1].lower(), row[2].lower(), *row[3:]] for row in rows]
    parents = {account: parent for account, parent, user, *_ in rows if not user}
    mine = [row for row in rows if row[2] == place.user and row[0] == place.account]
    if not mine:
        raise AgentError(f"association {place.user}/{place.account}: not shown by sacctmgr")
    limits = []
    for _, _, _, most, group in mine:
        name = f"association {place.user}/{place.account}"
        scope = Scope(user=place.user, accounts=frozenset({place.account}))
        limits.append(Limit(f"{name} MaxTRES", tres_counts(most, f"{name} MaxTRES")))
        limits.append(Limit(f"{name} GrpTRES", tres_counts(group, f"{name} GrpTRES"), scope))
    account, seen = place.account, set()
    while account:
        if account in seen or account not in parents:
            raise AgentError(f"account {account}: not found in the association tree")
        seen.add(account)
        for row in (row for row in rows if row[0] == account and not row[2]):
            name = f"account {account}"
            limits.append(Limit(f"{name} MaxTRES", tres_counts(row[3], f"{name} MaxTRES")))
            scope = Scope(accounts=below(account, parents))
            limits.append(Limit(f"{name} GrpTRES", tres_counts(row[4], f"{name} GrpTRES"), scope))
        account = parents[account]
    return limits


def read_limits(place: JobPlace, timeout: float) -> Limits:
    """The limits that apply to the job (see the module's docstring); AgentError when
    Slurm does not answer or says something not understood."""
    if not slurm.jobs.NAME.fullmatch(place.user):
        raise AgentError(f"not a user name Slurm's limits can be read for: {place.user!r}")
    if not place.partitions:
        raise AgentError("its partition was not read")
    found = partition_limits(place, timeout)
    config = slurm.controller.show_config(timeout)
    if not enforced(config):
        return found
    if not place.qos or not place.account:
        raise AgentError("its QOS or account was not read")
    # sacctmgr prints names in lower case (Slurm's database keeps them so)
    own = replace(
        place, user=place.user.lower(), qos=place.qos.lower(), account=place.account.lower()
    )
    partition_qos = (found.partition_qos.get(name, "") for name in place.partitions)
    entries = list(found.entries)
    for qos in sorted({own.qos, *partition_qos} - {""}):
        entries += qos_limits(own, qos, timeout)
    entries += association_limits(own, config.get("ClusterName", ""), timeout)
    return Limits(entries, found.partition_qos)


def counted(scope: Scope, job: RunningJob, partition_qos: dict[str, str]) -> bool:
    """Whether a running job counts against a limit of `scope`."""
    qos = {job.qos.lower(), partition_qos.get(job.partition, "")}
    return (
        (not scope.user or job.user.lower() == scope.user)
        and (scope.accounts is None or job.account.lower() in scope.accounts)
        and (not scope.qos or scope.qos in qos)
    )


def used(scope: Scope, limits: Limits, running: Iterable[RunningJob], job_id: str) -> Tres:
    """What the running jobs of `scope` other than the job itself hold together."""
    held: Tres = {}
    for job in running:
        if job.job_id != job_id and counted(scope, job, limits.partition_qos):
            for name, value in tres_counts(job.tres, f"job {job.job_id}'s TRES").items():
                held[name] = held.get(name, 0) + value
    return held


def ceiling(limits: Limits, share: Tres, running: list[RunningJob], job_id: str) -> tuple[int, str]:
    """The most nodes job `job_id` may hold under `limits`, holding `share` a node while
    `running` jobs run; and the limit that sets it ("" for none)."""
    most, why = MAX_NODES, ""
    for limit in limits.entries:
        held = used(limit.scope, limits, running, job_id) if limit.scope else {}
        for name, value in limit.tres.items():
            if name not in share:
                continue
            count = max(0, value - held.get(name, 0)) // share[name]
            if count < most:
                most, why = count, f"{limit.where} {name}={value}"
    return most, why
