"""Layer 3: what reaches sbatch, and what is refused before it does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.slurm.nodes import node_of, partition_of
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.tasks.schedule.cluster_shape import scheduling_nodes, scheduling_partitions
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.schedule.submit import check_feasible, sbatch_argv
from tacc_contract.instruction import InvalidInstruction
from tacc_contract.slurm_time import time_seconds

NODES = [
    "NodeName=gpu01 Arch=x86_64 CPUTot=64 RealMemory=512000 Gres=gpu:a100:8(S:0-1) "
    "Partitions=gpu,all State=IDLE",
    "NodeName=gpu02 CPUTot=64 RealMemory=512000 Gres=gpu:a100:4 Partitions=gpu,all State=IDLE",
    "NodeName=cpu01 CPUTot=32 RealMemory=128000 Gres=(null) Partitions=cpu,all State=IDLE",
]
PARTITIONS = [
    "PartitionName=gpu AllowGroups=ALL Default=NO Nodes=gpu[01-02] State=UP",
    "PartitionName=cpu Default=YES Nodes=cpu01 State=UP",
    "PartitionName=all Default=NO Nodes=gpu[01-02],cpu01 State=UP",
]


def shape():
    nodes = scheduling_nodes([node_of(parse_oneliner(line)) for line in NODES])
    partitions = [partition_of(parse_oneliner(line)) for line in PARTITIONS]
    return scheduling_partitions(partitions, nodes), nodes


def task(**resources):
    document = {
        "format": "tacc-instruction/1",
        "task": {"name": "t", "run": ["true"], "resources": resources},
    }
    return parse(json.dumps(document), "instruction.json")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5", 300),
        ("1:30", 90),
        ("02:00:00", 7200),
        ("1-0", 86400),
        ("1-2:03:04", 93784),
        ("UNLIMITED", None),
    ],
)
def test_slurm_time_formats(text, seconds):
    assert time_seconds(text) == seconds


def test_default_partition_and_fitting_request_pass():
    assert check_feasible(task(), *shape()) == "cpu"
    assert check_feasible(task(partition="gpu", gpus_per_node=4, nodes=2), *shape()) == "gpu"


@pytest.mark.parametrize(
    ("resources", "field", "message"),
    [
        (
            {"partition": "nope"},
            "resources.partition",
            "unknown partition 'nope'; this cluster has: gpu, cpu, all",
        ),
        (
            {"partition": "gpu", "gpus_per_node": 16},
            "resources.gpus_per_node",
            "16 GPUs per node requested, but the most any node in partition 'gpu' has is 8",
        ),
        ({"gpus_per_node": 1}, "resources.gpus_per_node", "partition 'cpu' has is 0"),
        (
            {"partition": "gpu", "gpus_per_node": 8, "nodes": 2},
            "resources.nodes",
            "2 nodes requested, but partition 'gpu' has 1 node(s) that fit",
        ),
        ({"cpus": 65, "partition": "all"}, "resources.cpus", "65 CPUs per node"),
        ({"mem": "1T", "partition": "all"}, "resources.mem", "1.04858e+06 MB of memory"),
    ],
)
def test_impossible_requests_name_the_field_and_reason(resources, field, message):
    with pytest.raises(Rejected) as caught:
        check_feasible(task(**resources), *shape())
    assert caught.value.field == field and message in str(caught.value)


def test_sbatch_argv_is_words_and_reserved_options_are_refused(tmp_path: Path):
    argv = sbatch_argv(task(sbatch={"constraint": "a100&ib"}), tmp_path, AgentConfig())
    assert "--constraint=a100&ib" in argv and "--signal=USR1@60" in argv
    assert "--signal=USR1@30" in sbatch_argv(task(time="1"), tmp_path, AgentConfig())
    for name in ("output", "outp", "chd", "export"):  # sbatch takes unambiguous prefixes
        with pytest.raises(Rejected, match=f"'{name}' cannot be set by a task"):
            sbatch_argv(task(sbatch={name: "/tmp/x"}), tmp_path, AgentConfig())


def test_the_cluster_revalidates_the_instruction_with_positions():
    document = {
        "format": "tacc-instruction/1",
        "task": {"name": "x y", "run": [], "resources": {"nodes": 0, "gpus_per_nod": 1}},
    }
    with pytest.raises(InvalidInstruction) as caught:
        parse(json.dumps(document, indent=1), "instruction.json")
    text = str(caught.value)
    assert "instruction.json:" in text
    assert "task.resources.nodes: expected a node count >= 1, or a range like 2-4" in text
    assert "task.resources.gpus_per_nod: unknown key (did you mean 'gpus_per_node'?)" in text
    assert "task.run: expected at least one entry" in text
