"""Fine-grained GPU sharing: a task may ask for a fraction of a GPU
(`gpus_per_node: 0.25`). The compiler marks the fraction (`resources.gpu_share`), and
the scheduling layer maps it to Slurm GPU shards (gres/shard, set up by the slurm role
with `slurm_gpu_sharing: shard`): ceil(fraction x shards per GPU) shards, so several
small tasks pack onto one GPU. The program gets TACC_GPU_SHARE (the fraction). Slurm
22.05 (Debian 12) does not set CUDA_VISIBLE_DEVICES for shard jobs; later releases do."""

from __future__ import annotations

import math
from typing import ClassVar

from tacc_contract.errors import Rejected
from tacc_contract.fields import Field
from tacc_contract.plugins import Launch, Plugin, Problem, Submission

WHOLE_OR_FRACTION = "whole GPUs (0, 1, 2, ...) or a fraction of one GPU (0 < x < 1, e.g. 0.25)"


def gpus_value(value: float) -> str | None:
    if not math.isfinite(value) or value < 0 or (value > 1 and value != int(value)):
        return WHOLE_OR_FRACTION
    return None


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
        gpus = res.get("gpus_per_node", 0)
        if isinstance(gpus, float) and 0 < gpus < 1:
            res["gpus_per_node"], res["gpu_share"] = 0, gpus
            return f"gpus_per_node {gpus:g} -> gpu_share {gpus:g} (scheduled as GPU shards)"
        return None

    def schedule(self, submission: Submission) -> None:
        share = submission.task.resources.get("gpu_share")
        if not share:
            return
        members = [n for n in submission.nodes if submission.partition in n.partitions]
        per_gpu = [n.shards // n.gpus for n in members if n.gpus and n.shards]
        if not per_gpu:
            raise Rejected(
                f"a fraction of a GPU ({share:g}) needs GPU sharing (gres/shard), and no node "
                f"in partition {submission.partition!r} has shards; ask for whole GPUs, or ask "
                "ops to set slurm_gpu_sharing: shard",
                "resources.gpus_per_node",
            )
        shards = max(1, math.ceil(share * min(per_gpu)))
        submission.options["gres"] = f"shard:{shards}"
        submission.note(self.name, f"{share:g} GPU -> {shards} of {min(per_gpu)} shards of one GPU")

    def execute(self, launch: Launch) -> None:
        share = launch.task.resources.get("gpu_share")
        if share:  # the program may size itself (batch, memory) to its share
            launch.env["TACC_GPU_SHARE"] = f"{share:g}"
