"""The cluster's shape as scheduling sees it: `scontrol show node` and `show partition`
records as the contract's Node and Partition (GPUs and shards counted from Gres)."""

from __future__ import annotations

import re

from tacc_agent import slurm
from tacc_contract.plugins import Node, Partition


def gres_items(gres: str) -> list[list[str]]:
    """A node's Gres= as its items' words, the socket lists dropped
    (gpu:a100:8(S:0-1),shard:16 -> [gpu, a100, 8], [shard, 16])."""
    return [entry.split(":") for entry in re.sub(r"\([^)]*\)", "", gres).split(",")]


def gpu_count(gres: str, name: str = "gpu") -> int:
    """GPUs (or shards, with name="shard") in a node's Gres= (gpu:a100:8(S:0-1),gpu:2,
    shard:16 ...); 0 for (null)."""
    return sum(
        int(parts[-1])
        for parts in gres_items(gres)
        if parts[0] == name and len(parts) > 1 and parts[-1].isdigit()
    )


def gpu_kinds(gres: str) -> tuple[tuple[str, int], ...]:
    """The typed GPUs of a node's Gres= (gpu:h100:4(S:0-1),gpu:l40s:2 -> (h100, 4),
    (l40s, 2)); untyped ones (gpu:2) are not named."""
    found: dict[str, int] = {}
    for parts in gres_items(gres):
        if parts[0] == "gpu" and len(parts) == 3 and parts[2].isdigit():
            found[parts[1]] = found.get(parts[1], 0) + int(parts[2])
    return tuple(found.items())


def parse_nodes(records_: list[dict[str, str]]) -> list[Node]:
    return [
        Node(
            name=r["NodeName"],
            cpus=int(r.get("CPUTot", "0") or 0),
            memory_mb=int(r.get("RealMemory", "0") or 0),
            gpus=gpu_count(r.get("Gres", "")),
            partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
            shards=gpu_count(r.get("Gres", ""), "shard"),
            features=tuple(
                f for f in r.get("AvailableFeatures", "").split(",") if f and f != "(null)"
            ),
            state=r.get("State", ""),
            gpu_kinds=gpu_kinds(r.get("Gres", "")),
        )
        for r in records_
        if "NodeName" in r
    ]


def parse_partitions(records_: list[dict[str, str]], nodes: list[Node]) -> list[Partition]:
    return [
        Partition(
            name=r["PartitionName"],
            default=r.get("Default") == "YES",
            nodes=tuple(n.name for n in nodes if r["PartitionName"] in n.partitions),
        )
        for r in records_
        if "PartitionName" in r
    ]


def read_nodes(timeout: float) -> list[Node]:
    return parse_nodes(slurm.show("node", timeout=timeout))
