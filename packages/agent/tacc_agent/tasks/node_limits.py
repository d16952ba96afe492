"""The most nodes Slurm's limits let one job hold, read as root before the agent grows it
(`Queue.resize`). Root's `scontrol update JobId=N NumNodes=K-K` is an administrator's
change, which Slurm does not hold to the job's QOS or association limits: the agent
holds it to them itself, at each grow.

- the partition's MaxNodes (`scontrol show partition P`), always;
- where Slurm enforces accounting limits (`scontrol show config`: AccountingStorageEnforce
  names limits, qos or safe): the job's QOS (`sacctmgr show qos`: MaxTRES per job,
  MaxTRESPU per user) and its owner's association for the job's account (`sacctmgr show
  assoc`: MaxTRES per job, GrpTRES for the user's jobs together). Each is a list of TRES
  counts (node=4,cpu=64,gres/gpu=8).

A job at K nodes holds K times what it holds per node (TRES=cpu=8,node=2,gres/gpu=4: 4
CPUs and 2 GPUs a node, and 1 node): each limit on a TRES it holds caps K. A per-user
limit counts what the owner's other running jobs hold. A QOS's GrpTRES (every user of
the QOS together) is not read. A limit that cannot be read refuses the grow.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from tacc_agent import slurm
from tacc_agent.errors import AgentError

MAX_NODES = 100_000  # no partition has more
ENFORCE_LINE = re.compile(r"^AccountingStorageEnforce\s*=\s*(.*?)\s*$", re.MULTILINE)
ENFORCING = frozenset({"limits", "qos", "safe"})  # each makes Slurm hold jobs to limits
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
COUNT = re.compile(r"\d+")
SACCTMGR_SHOW = ("sacctmgr", "--noheader", "--parsable2", "show")

Tres = dict[str, int]


def tres_counts(text: str) -> Tres:
    """The whole-number counts of a TRES list ("cpu=8,mem=4G,node=2,gres/gpu=4" ->
    cpu, node, gres/gpu); memory and anything else with a unit are left out."""
    counts: Tres = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if sep and name and COUNT.fullmatch(value):
            counts[name] = int(value)
    return counts


def per_node(tres: Tres, nodes: int) -> Tres:
    """What a job holding `tres` on `nodes` nodes holds on each (rounded up); 1 node."""
    count = tres.get("node") or nodes or 1
    shares = {name: -(-value // count) for name, value in tres.items() if value > 0}
    return shares | {"node": 1}


@dataclass(frozen=True)
class Limits:
    """Each limit as (where it comes from, its TRES counts)."""

    per_job: list[tuple[str, Tres]] = field(default_factory=list)
    per_user: list[tuple[str, Tres]] = field(default_factory=list)


@dataclass(frozen=True)
class JobPlace:
    """Where a job counts against Slurm's limits, as Slurm's record of it says."""

    user: str
    partition: str
    qos: str
    account: str


def known(name: str) -> str:
    """A QOS, account or partition name as Slurm printed it; "" for none ((null))."""
    return name if NAME.fullmatch(name) else ""


def enforced(config_text: str) -> bool:
    """Whether `scontrol show config` says Slurm holds jobs to QOS and association limits."""
    found = ENFORCE_LINE.search(config_text)
    words = set(found.group(1).lower().split(",")) if found else set()
    return bool(words & ENFORCING)


def table_tres(text: str) -> list[list[Tres]]:
    """sacctmgr --parsable2 lines, each field a TRES list."""
    return [
        [tres_counts(part) for part in line.split("|")]
        for line in text.splitlines()
        if line.strip()
    ]


def partition_limit(place: JobPlace, timeout: float) -> Limits:
    records = slurm.show("partition", place.partition, timeout) if place.partition else []
    found = [r.get("MaxNodes", "") for r in records if r.get("PartitionName") == place.partition]
    counts = [int(value) for value in found if COUNT.fullmatch(value)]
    where = f"partition {place.partition} MaxNodes"
    return Limits(per_job=[(where, {"node": min(counts)})] if counts else [])


def accounting_limits(place: JobPlace, timeout: float) -> Limits:
    per_job: list[tuple[str, Tres]] = []
    per_user: list[tuple[str, Tres]] = []
    if place.qos:
        argv = [*SACCTMGR_SHOW, "qos", "where", f"name={place.qos}", "format=MaxTRES,MaxTRESPU"]
        for row in table_tres(slurm.slurm(argv, timeout)):
            per_job.append((f"QOS {place.qos} MaxTRESPerJob", row[0]))
            per_user += [(f"QOS {place.qos} MaxTRESPerUser", row[1])] if len(row) > 1 else []
    if place.account:
        where = [f"user={place.user}", f"account={place.account}"]
        argv = [*SACCTMGR_SHOW, "assoc", "where", *where, "format=MaxTRES,GrpTRES"]
        for row in table_tres(slurm.slurm(argv, timeout)):
            where = f"association {place.user}/{place.account}"
            per_job.append((f"{where} MaxTRES", row[0]))
            per_user += [(f"{where} GrpTRES", row[1])] if len(row) > 1 else []
    return Limits(per_job, per_user)


def read_limits(place: JobPlace, timeout: float) -> Limits:
    """The limits that apply to the job (see the module's docstring); AgentError when
    Slurm does not answer."""
    if not NAME.fullmatch(place.user):
        raise AgentError(f"not a user name Slurm's limits can be read for: {place.user!r}")
    found = partition_limit(place, timeout)
    if not enforced(slurm.slurm(["scontrol", "show", "config"], timeout)):
        return found
    more = accounting_limits(place, timeout)
    return Limits(found.per_job + more.per_job, found.per_user + more.per_user)


def ceiling(limits: Limits, share: Tres, others: Iterable[Tres]) -> tuple[int, str]:
    """The most nodes the job may hold under `limits`, holding `share` a node while the
    owner's other running jobs hold `others`; and the limit that sets it ("" for none)."""
    held: Tres = {}
    for tres in others:
        for name, value in tres.items():
            held[name] = held.get(name, 0) + value
    most, why = MAX_NODES, ""
    for kind, entries in (("job", limits.per_job), ("user", limits.per_user)):
        for where, limit in entries:
            for name, value in limit.items():
                if name not in share:
                    continue
                left = value - (held.get(name, 0) if kind == "user" else 0)
                count = max(0, left) // share[name]
                if count < most:
                    most, why = count, f"{where} {name}={value}"
    return most, why
