"""The cluster's shape as scheduling sees it: Slurm's node and partition records
(slurm.nodes) as the contract's Node and Partition."""

from __future__ import annotations

from tacc_agent import slurm
from tacc_agent.slurm.nodes import NodeRecord, PartitionRecord
from tacc_contract.plugins import Node, Partition


def scheduling_nodes(records: list[NodeRecord]) -> list[Node]:
    return [
        Node(
            name=record.name,
            cpus=record.cpus,
            memory_mb=record.memory_mb,
            gpus=record.gpus,
            partitions=record.partitions,
            shards=slurm.gres.count(record.gres, "shard"),
            mps=slurm.gres.count(record.gres, "mps"),
            features=record.features,
            state=record.state,
            gpu_kinds=slurm.gres.gpu_kinds(record.gres),
        )
        for record in records
    ]


def scheduling_partitions(records: list[PartitionRecord], nodes: list[Node]) -> list[Partition]:
    return [
        Partition(
            name=record.name,
            default=record.default,
            nodes=tuple(n.name for n in nodes if record.name in n.partitions),
            cpus_per_gpu=record.job_defaults.get("DefCpuPerGPU", 0),
            mem_per_gpu_mb=record.job_defaults.get("DefMemPerGPU", 0),
        )
        for record in records
    ]


def read_nodes(timeout: float) -> list[Node]:
    return scheduling_nodes(slurm.nodes.all_nodes(timeout))
