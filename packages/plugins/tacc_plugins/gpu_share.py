"""Fine-grained GPU sharing: a task may ask for a fraction of a GPU
(`gpus_per_node: 0.25`). The compiler marks the fraction (`resources.gpu_share`), and
the scheduling layer serves it one of two ways, set up by the slurm role
(`slurm_gpu_sharing`):

- CUDA MPS (gres/mps, `mps`), where the partition's nodes offer it:
  ceil(fraction x MPS shares per GPU) of one GPU's shares, with `--exclusive=user`: a
  node's MPS daemon serves one user's processes at a time (another user's CUDA programs
  on that node would wait for it), so while the share runs the node runs only its
  owner's jobs. Each of the job's processes on a node gets its part of the share's
  limits (the share over the node's processes): CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (of
  the GPU's compute; never above what Slurm set for the job) and
  CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (of its memory, from nvidia-smi on the node), set
  over the task's own environment and a container image's. The MPS daemon obeys the
  lower of these and its own limits; they bind the owner's programs, which could set
  their own environment, among the owner's jobs only. Where no MPS daemon answers on
  the node (none installed, or it stopped) the job's notes say the limits bind nothing.
- Slurm GPU shards (gres/shard, `shard`) elsewhere: ceil(fraction x shards per GPU)
  shards, so several small tasks pack onto one GPU. Nothing limits a shard job's
  compute or GPU memory: a neighbour on the same GPU can take all of either (SHARDS_WARN,
  shown by `tcloud validate` and in the submit answer).

The program gets TACC_GPU_SHARE (the fraction). Slurm 22.05 (Debian 12) does not set
CUDA_VISIBLE_DEVICES for shard jobs; later releases do."""

from __future__ import annotations

import math
from typing import ClassVar

from tacc_contract.errors import Rejected
from tacc_contract.fields import Field
from tacc_contract.plugins import Launch, Plugin, Problem, Submission
from tacc_contract.schema import processes_per_node

WHOLE_OR_FRACTION = "whole GPUs (0, 1, 2, ...) or a fraction of one GPU (0 < x < 1, e.g. 0.25)"
SHARDS_WARN = "as Slurm shards nothing limits its GPU memory or compute"
MPS_LIMITS = "CUDA MPS limits its compute and GPU memory to its share"
NO_MPS_DAEMON = "WARNING: no CUDA MPS daemon answers on this node: these limits bind nothing"


def gpus_value(value: float) -> str | None:
    if not math.isfinite(value) or value < 0 or (value > 1 and value != int(value)):
        return WHOLE_OR_FRACTION
    return None


def fraction_asked(resources: dict) -> float | None:
    """The fraction of one GPU a task's gpus_per_node asks for (0 < x < 1), else None."""
    gpus = resources.get("gpus_per_node", 0)
    return gpus if isinstance(gpus, float) and 0 < gpus < 1 else None


def share_value(value: float) -> str | None:
    return None if math.isfinite(value) and 0 < value < 1 else "a fraction of one GPU (0 < x < 1)"


class GpuShare(Plugin):
    name = "gpu_share"
    order = 10
    layers = ("schema", "compile", "schedule", "execute")
    summary = "fractional GPUs (gpus_per_node: 0.25) become Slurm GPU shards"
    fields: ClassVar[dict[str, Field]] = {
        "resources.gpus_per_node": Field(
            "number", default=0, check=gpus_value, expected=WHOLE_OR_FRACTION
        ),
        # Written by the compile pass (the fraction); a task may also set it directly.
        "resources.gpu_share": Field("number", check=share_value, expected="0 < x < 1"),
    }

    def check(self, task: dict, problem: Problem) -> None:
        res = task["resources"]
        gpus = res["gpus_per_node"]
        if isinstance(gpus, float) and gpus == int(gpus):
            res["gpus_per_node"] = int(gpus)  # 2.0 is 2 GPUs
        elif isinstance(gpus, float) and res.get("gpu_share") is not None:
            problem("resources.gpu_share", "set either a fraction in gpus_per_node or gpu_share")

    def compile(self, document: dict) -> str | None:
        res = document["task"]["resources"]
        gpus = fraction_asked(res)
        if gpus is not None:
            res["gpus_per_node"], res["gpu_share"] = 0, gpus
            return f"gpus_per_node {gpus:g} -> gpu_share {gpus:g} (scheduled as GPU shards)"
        return None

    def schedule(self, submission: Submission) -> None:
        share = submission.task.resources.get("gpu_share")
        if not share:
            return
        members = [n for n in submission.nodes if submission.partition in n.partitions]
        mps = [n.mps // n.gpus for n in members if n.gpus and n.mps]
        if mps:
            units = max(1, math.ceil(share * min(mps)))
            submission.options["gres"] = f"mps:{units}"
            submission.options["exclusive"] = "user"
            submission.note(
                self.name,
                f"{share:g} GPU -> {units} of {min(mps)} MPS shares of one GPU ({MPS_LIMITS}; "
                "the node runs only your jobs meanwhile)",
            )
            return
        per_gpu = [n.shards // n.gpus for n in members if n.gpus and n.shards]
        if not per_gpu:
            raise Rejected(
                f"a fraction of a GPU ({share:g}) needs GPU sharing (gres/mps or gres/shard), "
                f"and no node in partition {submission.partition!r} has either; ask for whole "
                "GPUs, or ask ops to set slurm_gpu_sharing: mps (or shard)",
                "resources.gpus_per_node",
            )
        shards = max(1, math.ceil(share * min(per_gpu)))
        submission.options["gres"] = f"shard:{shards}"
        submission.note(
            self.name,
            f"{share:g} GPU -> {shards} of {min(per_gpu)} shards of one GPU ({SHARDS_WARN})",
        )

    def execute(self, launch: Launch) -> None:
        share = launch.task.resources.get("gpu_share")
        if not share:
            return
        launch.env["TACC_GPU_SHARE"] = f"{share:g}"  # the program may size itself to it
        facts = launch.facts
        if facts.get("gpu_sharing") != "mps":
            return
        percent = math.floor(share * 100)
        if facts.get("slurm_mps_percentage"):  # what Slurm allocated, if less
            percent = min(percent, int(facts["slurm_mps_percentage"]))
        processes = processes_per_node(launch.task.resources)
        limits = mps_limits(percent, processes, facts.get("gpu_memory_mib"))
        launch.env.update(limits)
        said = ", ".join(f"{k}={v}" for k, v in limits.items())
        warning = "" if facts.get("mps_daemon") else f"; {NO_MPS_DAEMON}"
        launch.note(
            self.name, f"MPS limits, each of {processes} process(es) on a node: {said}{warning}"
        )


def described(resources: dict) -> str | None:
    """What a task asking for part of a GPU gets, in words (`tcloud validate`); None for
    whole GPUs."""
    share = resources.get("gpu_share") or fraction_asked(resources)
    if not share:
        return None
    return (
        f"{share:g} of one GPU: through CUDA MPS, where the partition's nodes offer it, its "
        f"processes together are limited to about {math.floor(share * 100)}% of the GPU's "
        "threads and memory, and the node runs only your jobs meanwhile; "
        f"{SHARDS_WARN}: a job beside it on the same GPU can take all of either"
    )


def mps_limits(percent: int, processes: int, memory_mib: int | None) -> dict[str, str]:
    """The CUDA MPS client limits of each of a node's `processes` sharing `percent` of
    one GPU: its part of the GPU's threads, and of its memory (device 0: the one GPU
    Slurm gave the job) where the memory is known."""
    limits = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, percent // processes))}
    if memory_mib:
        limit = max(1, int(memory_mib) * percent // (100 * processes))
        limits["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    return limits
