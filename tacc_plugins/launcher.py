"""Built-in execution plug-in: how each run line starts on a node (srun runs one
wrapper per node; `torchrun` and `mpirun` wrap the line), and the variables frameworks
read (MASTER_ADDR, WORLD_SIZE, RANK, TACC_NODE_RANK, ...)."""

from __future__ import annotations

import shlex

from tacc_plugins.api import Launch, Plugin


def with_modules(task, line: str) -> str:
    loads = [f"module load {shlex.quote(m)}" for m in task.environment["modules"]]
    return " && ".join([*loads, line]) if loads else line


def gpus_per_node(task) -> int:
    return max(int(task.resources["gpus_per_node"] or 0), 1)


def framework_env(task, rank: int, nodes: list[str], ips: list[str], job_id: str) -> dict:
    per_node = gpus_per_node(task)
    torchrun = task.runtime["launcher"] == "torchrun"
    return {
        "TACC_JOB_ID": job_id,
        "TACC_NODE_RANK": str(rank),
        "TACC_NUM_NODES": str(len(nodes)),
        "TACC_NODE_IPS": ",".join(ips),
        "TACC_MASTER_ADDR": ips[0],
        "MASTER_ADDR": ips[0],
        "MASTER_PORT": str(20000 + int(job_id or 0) % 20000),
        "WORLD_SIZE": str(len(nodes) * (per_node if torchrun else 1)),
        "RANK": str(rank * (per_node if torchrun else 1)),
        "LOCAL_RANK": "0",
    }


def command_for(task, line: str, env: dict[str, str]) -> list[str]:
    line = line if task.runtime["launcher"] != "mpirun" else f"mpirun {line}"
    if task.runtime["launcher"] == "torchrun":
        line = (
            f"torchrun --nnodes={env['TACC_NUM_NODES']} --nproc-per-node={gpus_per_node(task)} "
            f"--node-rank={env['TACC_NODE_RANK']} --master-addr={env['MASTER_ADDR']} "
            f"--master-port={env['MASTER_PORT']} {line}"
        )
    return ["bash", "-euo", "pipefail", "-c", with_modules(task, line)]


class Launcher(Plugin):
    name = "launcher"
    layers = ("execute",)
    summary = "runtime.launcher (srun, torchrun, mpirun, none) and the framework variables"

    def execute(self, launch: Launch) -> None:
        task = launch.task
        launch.env.update(framework_env(task, launch.rank, launch.nodes, launch.ips,
                                        launch.job_id))  # fmt: skip
        launch.command = lambda line: command_for(task, line, launch.env)
