"""The CPUs and memory a task asks Slurm for (issue [22]). What the task names wins:
`cpus` (per process) or `cpus_per_gpu`, `mem` (per node) or `mem_per_gpu`. A task with
whole GPUs that names neither asks for nothing, so Slurm gives it the partition's
per-GPU defaults (DefCpuPerGPU, DefMemPerGPU: the slurm role sets them from the nodes'
shapes), never one CPU and a few GB for eight GPUs. A task without GPUs (a GPU share
included: it runs on shards, which no per-GPU default covers) that names neither gets
CPUS_DEFAULT and MEM_DEFAULT."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

CPUS_DEFAULT = 1  # per process
MEM_DEFAULT = "4G"  # per node


class Kind(NamedTuple):
    """One resource: its own field and sbatch option, their per-GPU twins, and what a
    task without GPUs that names neither asks for."""

    field: str
    option: str
    per_gpu_field: str
    per_gpu_option: str
    default: str


CPUS = Kind("cpus", "cpus-per-task", "cpus_per_gpu", "cpus-per-gpu", str(CPUS_DEFAULT))
MEMORY = Kind("mem", "mem", "mem_per_gpu", "mem-per-gpu", MEM_DEFAULT)


def whole_gpus(resources: Mapping) -> int:
    """The task's whole GPUs per node (0 for none or a fraction of one)."""
    gpus = resources.get("gpus_per_node") or 0
    return int(gpus) if gpus >= 1 else 0


def _option(resources: Mapping, kind: Kind, per_gpu_default: bool) -> tuple[str, str] | None:
    if resources.get(kind.field):
        return kind.option, str(resources[kind.field])
    if resources.get(kind.per_gpu_field):
        return kind.per_gpu_option, str(resources[kind.per_gpu_field])
    if whole_gpus(resources) and per_gpu_default:
        return None
    return kind.option, kind.default


def cpu_option(resources: Mapping, per_gpu_default: bool = True) -> tuple[str, str] | None:
    """The sbatch option for CPUs, or None: the partition's DefCpuPerGPU decides.
    `per_gpu_default` False (the agent knows the partition has none): CPUS_DEFAULT, as
    Slurm would otherwise give one CPU and DefMemPerCPU for the whole job."""
    return _option(resources, CPUS, per_gpu_default)


def memory_option(resources: Mapping, per_gpu_default: bool = True) -> tuple[str, str] | None:
    """The sbatch option for memory, or None: the partition's DefMemPerGPU decides
    (`per_gpu_default` False: MEM_DEFAULT, as cpu_option)."""
    return _option(resources, MEMORY, per_gpu_default)


def conflicts(resources: Mapping) -> list[tuple[str, str]]:
    """(field, what is wrong) for per-GPU settings that cannot hold."""
    found = []
    for kind in (CPUS, MEMORY):
        total, per_gpu = kind.field, kind.per_gpu_field
        if resources.get(per_gpu) is None:
            continue
        if resources.get(total) is not None:
            found.append((per_gpu, f"set either {total} or {per_gpu}, not both"))
        elif not whole_gpus(resources):
            found.append((per_gpu, "needs whole GPUs: set resources.gpus_per_node (1 or more)"))
    return found


def described(resources: Mapping) -> str:
    """What the job gets per node, in words (`tcloud validate`): per GPU, the partition's
    default (where it has none, the agent asks for CPUS_DEFAULT / MEM_DEFAULT)."""
    gpus = whole_gpus(resources)
    cpus, memory = cpu_option(resources), memory_option(resources)
    words = []
    if cpus is None:
        words.append(f"CPUs: the partition's DefCpuPerGPU x {gpus} GPU(s), or 1 if it has none")
    elif cpus[0] == "cpus-per-gpu":
        words.append(f"CPUs: {cpus[1]} per GPU x {gpus}")
    else:
        words.append(f"CPUs: {cpus[1]} per process")
    if memory is None:
        words.append(
            f"memory: the partition's DefMemPerGPU x {gpus} GPU(s), or {MEM_DEFAULT} if it has none"
        )
    elif memory[0] == "mem-per-gpu":
        words.append(f"memory: {memory[1]} per GPU x {gpus}")
    else:
        words.append(f"memory: {memory[1]} per node")
    return "; ".join(words)
