"""Layer 3: what reaches sbatch, and what is refused before it does."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.slurm.nodes import node_of, partition_of
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.tasks.schedule.cluster_shape import scheduling_nodes, scheduling_partitions
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.schedule.submit import (
    check_feasible,
    sbatch_argv,
    wanted_cpus,
    wanted_memory,
)
from tacc_contract.instruction import InvalidInstruction
from tacc_contract.sbatch import base_options
from tacc_contract.slurm_time import time_seconds

NODES = [
    "NodeName=gpu01 Arch=x86_64 CPUTot=64 RealMemory=512000 Gres=gpu:a100:8(S:0-1) "
    "Partitions=gpu,all State=IDLE",
    "NodeName=gpu02 CPUTot=64 RealMemory=512000 Gres=gpu:a100:4 Partitions=gpu,all State=IDLE",
    "NodeName=cpu01 CPUTot=32 RealMemory=128000 Gres=(null) Partitions=cpu,all State=IDLE",
]
PARTITIONS = [
    "PartitionName=gpu AllowGroups=ALL Default=NO Nodes=gpu[01-02] State=UP "
    "JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=64000",
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
        (
            {"partition": "gpu", "gpus_per_node": 8, "cpus_per_gpu": 9},
            "resources.cpus_per_gpu",
            "72 CPUs (8 GPUs x 9) per node requested, but the most any node in partition "
            "'gpu' has is 64",
        ),
        (
            {"partition": "gpu", "gpus_per_node": 8, "mem_per_gpu": "64001M"},
            "resources.mem_per_gpu",
            "512008 MB of memory (8 GPUs) per node requested",
        ),
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


def test_a_gpu_task_naming_no_cpus_or_memory_takes_the_partitions_per_gpu_defaults(
    tmp_path: Path,
):
    """Issue [22]: 8 GPUs and nothing else was 1 CPU and 4G; now Slurm's DefCpuPerGPU and
    DefMemPerGPU decide (no -c, no --mem), and the feasibility check counts them."""
    gpus = task(partition="gpu", gpus_per_node=8)
    argv = sbatch_argv(gpus, tmp_path, AgentConfig())
    assert "--gres=gpu:8" in argv
    assert not [word for word in argv if word.startswith(("--cpus-per", "--mem"))], argv
    assert check_feasible(gpus, *shape()) == "gpu"  # 8 x 8 CPUs, 8 x 64000 MB fit gpu01
    # Per GPU, named by the task.
    per_gpu = sbatch_argv(
        task(partition="gpu", gpus_per_node=2, cpus_per_gpu=6, mem_per_gpu="32G"),
        tmp_path,
        AgentConfig(),
    )
    assert "--cpus-per-gpu=6" in per_gpu and "--mem-per-gpu=32G" in per_gpu
    # Without GPUs (and what a task names): as before.
    plain = sbatch_argv(task(), tmp_path, AgentConfig())
    assert "--cpus-per-task=1" in plain and "--mem=4G" in plain
    named = sbatch_argv(task(gpus_per_node=1, cpus=3, mem="10G"), tmp_path, AgentConfig())
    assert "--cpus-per-task=3" in named and "--mem=10G" in named


def test_the_partition_default_counts_against_the_node_it_would_land_on():
    partitions, nodes = shape()
    small = [p for p in partitions if p.name != "gpu"] + [
        replace(next(p for p in partitions if p.name == "gpu"), cpus_per_gpu=9)
    ]
    with pytest.raises(Rejected) as caught:
        check_feasible(task(partition="gpu", gpus_per_node=8), small, nodes)
    assert caught.value.field == "resources.gpus_per_node"
    assert "72 CPUs (8 GPUs x DefCpuPerGPU) per node requested" in str(caught.value)


def test_an_instruction_with_cpus_per_gpu_and_cpus_is_refused_on_the_cluster_too():
    with pytest.raises(InvalidInstruction, match=r"task\.resources\.cpus_per_gpu: set either"):
        task(gpus_per_node=2, cpus=2, cpus_per_gpu=4)


def test_a_partition_without_per_gpu_defaults_keeps_one_cpu_and_4g(tmp_path: Path):
    """Where Slurm has no DefCpuPerGPU/DefMemPerGPU (a slurm.conf the role did not
    write, def_*_per_gpu: 0), a GPU task naming neither would get one CPU and
    DefMemPerCPU (256 MB): the agent asks for the old 1 CPU per process and 4G, and the
    feasibility check counts a CPU per process."""
    partitions, nodes = shape()
    bare = [replace(p, cpus_per_gpu=0, mem_per_gpu_mb=0) for p in partitions]
    gpus = task(partition="gpu", gpus_per_node=8)
    assert check_feasible(gpus, bare, nodes) == "gpu"
    chosen = next(p for p in bare if p.name == "gpu")
    assert wanted_cpus(gpus, chosen) == ("cpus", 8, "CPUs (8 processes x 1)")  # srun: 8 ranks
    assert wanted_memory(gpus, chosen) == ("mem", 4096, "MB of memory")
    options = base_options(gpus, tmp_path, AgentConfig(), (False, False))
    argv = sbatch_argv(gpus, tmp_path, AgentConfig(), options)
    assert "--cpus-per-task=1" in argv and "--mem=4G" in argv, argv
