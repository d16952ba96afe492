"""Nodes and partitions as Slurm shows them (`scontrol show node|partition`, sinfo), host
lists expanded, and the one drain and resume of a node."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from tacc_agent.errors import AgentError
from tacc_agent.slurm import gres, oneliner, run

# scontrol show node appends who set the reason and when: "... [root@2026-11-22T20:10:00]"
SET_BY = re.compile(r"\s*\[[^\]\s]+@[^\]\s]+\]$")
NONE = "(null)"  # what scontrol prints for an empty list
NO_NODE_LIST = ("", "None assigned", "(null)")  # a job's NodeList where it ran nowhere
# sinfo's --states=idle also lists idle nodes that are drained or not responding: only
# those whose whole state (%T) is "idle" take a job.
IDLE_FORMAT = "--format=%D|%T"


def strip_set_by(reason: str) -> str:
    """A node Reason without scontrol's "[user@time]" suffix."""
    return SET_BY.sub("", reason)


def names(text: str) -> tuple[str, ...]:
    """A comma list scontrol prints (Partitions=, AvailableFeatures=); () for (null)."""
    return tuple(name for name in text.split(",") if name and name != NONE)


def number(text: str) -> int:
    return int(text) if text.isdigit() else 0


@dataclass(frozen=True)
class NodeRecord:
    """One node as `scontrol show node` prints it."""

    name: str
    state: str  # e.g. IDLE+DRAIN
    reason: str  # without who set it and when
    partitions: tuple[str, ...]
    features: tuple[str, ...]  # AvailableFeatures
    gres: str  # Gres=, e.g. gpu:a100:8(S:0-1),shard:16
    cpus: int  # CPUTot
    cpus_allocated: int  # CPUAlloc
    memory_mb: int  # RealMemory
    address: str  # NodeAddr, else its name
    gres_used: str = ""  # GresUsed=, e.g. gpu:a100:2(IDX:0-1),shard:0

    @property
    def gpus(self) -> int:
        return gres.count(self.gres)

    @property
    def gpus_free(self) -> int:
        return self.gpus - gres.count(self.gres_used)


def node_of(record: dict[str, str]) -> NodeRecord:
    """A NodeRecord of one `scontrol show node` record (oneliner.parse_oneliner)."""
    name = record.get("NodeName", "")
    return NodeRecord(
        name=name,
        state=record.get("State", ""),
        reason=strip_set_by(record.get("Reason", "")),
        partitions=names(record.get("Partitions", "")),
        features=names(record.get("AvailableFeatures", "")),
        gres=record.get("Gres", ""),
        cpus=number(record.get("CPUTot", "")),
        cpus_allocated=number(record.get("CPUAlloc", "")),
        memory_mb=number(record.get("RealMemory", "")),
        address=record.get("NodeAddr", "") or name,
        gres_used=record.get("GresUsed", ""),
    )


def node(name: str, timeout: float = run.TIMEOUT) -> NodeRecord | None:
    """Slurm's record of one node; None when it is not a node of this cluster (scontrol
    exits 1 saying "Node NAME not found")."""
    try:
        records = oneliner.show("node", name, timeout)
    except AgentError as exc:
        if f"Node {name} not found" in str(exc):
            return None
        raise
    found = [node_of(r) for r in records if "NodeName" in r]
    return found[0] if found else None


def all_nodes(timeout: float = run.TIMEOUT) -> list[NodeRecord]:
    """Every node of the cluster, in scontrol's order."""
    return [node_of(r) for r in oneliner.show("node", "", timeout) if "NodeName" in r]


@dataclass(frozen=True)
class PartitionRecord:
    """One partition as `scontrol show partition` prints it."""

    name: str
    default: bool
    max_nodes: str  # a count, or UNLIMITED
    qos: str  # its own QOS, as printed (N/A for none): `QoS=`, a job's is `QOS=`
    # JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=65536 ((null) for none): {name: number}.
    job_defaults: dict[str, int] = field(default_factory=dict)


def job_defaults(text: str) -> dict[str, int]:
    """`JobDefaults=` of a partition: {"DefCpuPerGPU": 8, "DefMemPerGPU": 65536}."""
    pairs = (item.partition("=") for item in text.split(",") if "=" in item)
    return {name: int(value) for name, _, value in pairs if value.isdigit()}


def partition_of(record: dict[str, str]) -> PartitionRecord:
    return PartitionRecord(
        record.get("PartitionName", ""),
        record.get("Default") == "YES",
        record.get("MaxNodes", ""),
        record.get("QoS", ""),
        job_defaults(record.get("JobDefaults", "")),
    )


def all_partitions(timeout: float = run.TIMEOUT) -> list[PartitionRecord]:
    """Every partition of the cluster, in scontrol's order."""
    records = oneliner.show("partition", "", timeout)
    return [partition_of(r) for r in records if "PartitionName" in r]


def hostnames(nodelist: str, timeout: float = run.TIMEOUT) -> list[str]:
    """A host list expression (n[2-3]) as its names, by `scontrol show hostnames`."""
    return run.output(["scontrol", "show", "hostnames", nodelist], timeout).split()


def drain_argv(node_name: str, reason: str) -> list[str]:
    """The scontrol command that drains a node with a reason."""
    return ["scontrol", "update", f"NodeName={node_name}", "State=DRAIN", f"Reason={reason}"]


def drain(node_name: str, reason: str, timeout: float = run.TIMEOUT) -> None:
    """Drain a node with a reason (running jobs go on, no new one starts there)."""
    run.output(drain_argv(node_name, reason), timeout)


def resume(node_name: str, timeout: float = run.TIMEOUT) -> None:
    """Put a drained node back in service."""
    run.output(["scontrol", "update", f"NodeName={node_name}", "State=RESUME"], timeout)


def parse_idle(out: str) -> int:
    """Nodes that take a job now, from sinfo IDLE_FORMAT lines ("2|idle", "1|drained")."""
    counts = [line.split("|") for line in out.split()]
    return sum(int(c[0]) for c in counts if len(c) == 2 and c[0].isdigit() and c[1] == "idle")


def idle_count(partition: str, timeout: float = run.TIMEOUT) -> int:
    """The partition's nodes that take a job now."""
    argv = ["sinfo", "--noheader", f"--partition={partition}", "--states=idle", IDLE_FORMAT]
    return parse_idle(run.output(argv, timeout))


def parse_sinfo_json(text: str) -> list[dict]:
    """The nodes of `sinfo --json`, one dict each in 22.05's shape (name, state,
    state_flags, partitions, reason, gres, gres_used): names, reasons and partition lists
    are JSON strings, so no text an admin or a user wrote can shift a field. 22.05
    (openapi v0.0.38) lists `nodes`; 24.11 (data_parser v0.0.42) lists `sinfo` groups of
    nodes, one per state and partition, read by sinfo_groups_as_nodes. AgentError for
    anything else, or an answer that names errors."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise AgentError(f"sinfo --json: not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise AgentError("sinfo --json: no node list")
    errors = data.get("errors") or []
    if errors:
        raise AgentError(f"sinfo --json: {str(errors)[:200]}")
    groups = data.get("sinfo")
    found = sinfo_groups_as_nodes(groups) if isinstance(groups, list) else data.get("nodes")
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise AgentError("sinfo --json: no node list")
    return found


def sinfo_groups_as_nodes(groups: list) -> list[dict] | None:
    """24.11's `sinfo` groups as 22.05's node dicts: a node's state list is its base
    state then its flags (["IDLE", "DRAIN"]); a node in several partitions is in one group
    per partition, merged here into one node. None when a group is not of that shape."""
    nodes: dict[str, dict] = {}
    for group in groups:
        try:
            state = [word for word in group["node"]["state"] if isinstance(word, str)]
            names = group["nodes"]["nodes"]
            partition = group["partition"]["name"]
            reason = group["reason"]["description"]
            gres = group["gres"]
        except (KeyError, TypeError):
            return None
        if not state or not isinstance(names, list) or not isinstance(gres, dict):
            return None
        for name in names:
            node = nodes.setdefault(
                str(name),
                {
                    "name": str(name),
                    "state": state[0].lower(),
                    "state_flags": state[1:],
                    "partitions": [],
                    "reason": reason,
                    "gres": gres.get("total", ""),
                    "gres_used": gres.get("used", ""),
                },
            )
            node["partitions"].append(partition)
    return list(nodes.values())
