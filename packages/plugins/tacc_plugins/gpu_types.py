"""Heterogeneous GPUs (AlloX's interchangeable devices): a task lists the GPU types it
accepts (`gpu_types: [a100, h100]`); that becomes a Slurm constraint (`a100|h100`) on
the node features the slurm role derives from each node's Gres, and the type the job got
is written to its record."""

from __future__ import annotations

from typing import ClassVar

from tacc_contract.errors import Rejected
from tacc_contract.fields import Field, pattern
from tacc_contract.plugins import FEATURE as GPU_FEATURE
from tacc_contract.plugins import Launch, Plugin, Problem, Submission

FEATURE = pattern(GPU_FEATURE.pattern, "a GPU type such as a100 or h100")


class GpuTypes(Plugin):
    name = "gpu_types"
    order = 30
    layers = ("schema", "schedule", "execute")
    summary = "gpu_types: [a100, h100] -> sbatch --constraint=a100|h100"
    fields: ClassVar[dict[str, Field]] = {
        "resources.gpu_types": Field(
            "list[str]", default=[], each=FEATURE, expected="GPU types the task accepts"
        )
    }

    def check(self, task: dict, problem: Problem) -> None:
        res = task["resources"]
        if res["gpu_types"] and not (res["gpus_per_node"] or res.get("gpu_share")):
            problem("resources.gpu_types", "GPU types need GPUs: set gpus_per_node too")
        if res["gpu_types"] and "constraint" in (res.get("sbatch") or {}):
            problem("resources.gpu_types", "set either gpu_types or sbatch.constraint")

    def schedule(self, submission: Submission) -> None:
        types = submission.task.resources.get("gpu_types") or []
        if not types:
            return
        members = [n for n in submission.nodes if submission.partition in n.partitions]
        offered = sorted({f for n in members for f in n.features})
        usable = [t for t in types if t in offered]
        if not usable:
            raise Rejected(
                f"no node in partition {submission.partition!r} has a GPU of type "
                f"{' or '.join(types)}; the types there: {', '.join(offered) or 'none'}",
                "resources.gpu_types",
            )
        # Slurm refuses a whole constraint that names a feature no node has.
        submission.options["constraint"] = "|".join(usable)
        absent = [t for t in types if t not in offered]
        where = f" (no {', '.join(absent)} node in partition {submission.partition!r})"
        submission.note(self.name, f"constraint {'|'.join(usable)}{where if absent else ''}")

    def execute(self, launch: Launch) -> None:
        types = launch.task.resources.get("gpu_types") or []
        if not types:
            return
        features = launch.node_features()
        chosen = next((t for t in types if t in features), "unknown")
        launch.env["TACC_GPU_TYPE"] = chosen
        launch.note(self.name, chosen)
