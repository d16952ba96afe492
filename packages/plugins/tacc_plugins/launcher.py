"""Built-in execution plug-in: how each run line starts on a node, and the variables
frameworks read (MASTER_ADDR, WORLD_SIZE, RANK, LOCAL_RANK, TACC_NODE_RANK, ...).

- `srun`: Slurm starts one wrapper per process (resources.processes_per_node on each
  node, through Slurm's MPI plug-in, so an MPI program gets its PMI from srun); each
  runs the line once with its own RANK and LOCAL_RANK.
- `torchrun`: one wrapper per node runs `torchrun --nproc-per-node=N`, which starts the
  workers and sets their RANK and LOCAL_RANK; every worker line comes out prefixed with
  its global rank (TORCHRUN_RANK_PREFIX) so the wrapper files it under that rank.
- `mpirun`: one wrapper on the first node runs `mpirun --tag-output` once in the
  allocation; OpenMPI reads Slurm's allocation (N slots per node) and starts its daemons
  with srun.
- `none`: the line runs once, on the first node.
"""

from __future__ import annotations

import re
import shlex

from tacc_contract.plugins import Launch, Plugin
from tacc_contract.schema import processes_per_node

# torchrun's line prefix (TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE, with --tee): a worker's
# lines reach the wrapper as "[tacc-rank 3] text"; the wrapper writes "text" to rank 3's log.
TORCHRUN_RANK_PREFIX = "[tacc-rank ${rank}] "
TORCHRUN_LINE = re.compile(rb"^\[tacc-rank (\d+)\] ?")
FIRST_NODE_LAUNCHERS = ("none", "mpirun")


def with_modules(task, line: str) -> str:
    loads = [f"module load {shlex.quote(m)}" for m in task.environment["modules"]]
    return " && ".join([*loads, line]) if loads else line


def wrappers_per_node(task) -> int:
    """Wrappers Slurm starts on each node: one per process with srun, else one."""
    return processes_per_node(task.resources) if task.runtime["launcher"] == "srun" else 1


def wrapper_rank(task, node_rank: int, local_rank: int) -> int:
    """A wrapper's rank: the global rank of the process it runs (torchrun: of its node's
    first worker)."""
    per_node = processes_per_node(task.resources)
    if task.runtime["launcher"] == "srun":
        return node_rank * per_node + local_rank
    return node_rank * per_node if task.runtime["launcher"] == "torchrun" else 0


def framework_env(task, launch: Launch) -> dict:
    """The variables of the line's process: torchrun and srun ranks get RANK,
    LOCAL_RANK and WORLD_SIZE (torchrun sets its workers' own); `none` is one process;
    under mpirun each rank reads OMPI_COMM_WORLD_RANK/SIZE, set by mpirun itself."""
    launcher = task.runtime["launcher"]
    per_node = 1 if launcher == "none" else processes_per_node(task.resources)
    nodes = 1 if launcher == "none" else len(launch.nodes)
    ranks = {
        "WORLD_SIZE": str(nodes * per_node),
        "RANK": str(launch.rank),
        "LOCAL_RANK": str(launch.local_rank),
        "LOCAL_WORLD_SIZE": str(per_node),
    }
    return {
        "TACC_JOB_ID": launch.job_id,
        "TACC_NODE_RANK": str(launch.node_rank),
        "TACC_NUM_NODES": str(nodes),
        "TACC_NODE_IPS": ",".join(launch.ips),
        "TACC_PROCESSES_PER_NODE": str(per_node),
        "TACC_MASTER_ADDR": launch.ips[0],
        "MASTER_ADDR": launch.ips[0],
        "MASTER_PORT": str(20000 + int(launch.job_id or 0) % 20000),
        **({} if launcher == "mpirun" else ranks),
        **(
            {"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": TORCHRUN_RANK_PREFIX}
            if launcher == "torchrun"
            else {}
        ),
    }


def command_for(task, line: str, env: dict[str, str]) -> list[str]:
    launcher = task.runtime["launcher"]
    if launcher == "mpirun":
        # --tag-output: mpirun forwards each rank's output line by line ("[1,3]<stdout>:"),
        # so two ranks' lines are never glued together in the log.
        line = f"mpirun --tag-output {line}"
    elif launcher == "torchrun":
        # Slurm's checkpoint signal (halt, --signal=USR1@T) reaches every process of the
        # step, torchrun too, which it would kill: torchrun ignores it (inherited through
        # exec); the workers get it, for a handler they install (train.py does).
        line = (
            "trap '' USR1 && exec "
            + shlex.join(
                [
                    "torchrun",
                    f"--nnodes={env['TACC_NUM_NODES']}",
                    f"--nproc-per-node={env['TACC_PROCESSES_PER_NODE']}",
                    f"--node-rank={env['TACC_NODE_RANK']}",
                    f"--master-addr={env['MASTER_ADDR']}",
                    f"--master-port={env['MASTER_PORT']}",
                    "--tee=3",
                    f"--log-dir={env['TACC_JOB_DIR']}/logs/torchrun",
                ]
            )
            + f" {line}"
        )
    return ["bash", "-euo", "pipefail", "-c", with_modules(task, line)]


class Launcher(Plugin):
    name = "launcher"
    order = 70
    layers = ("execute",)
    summary = "runtime.launcher (srun, torchrun, mpirun, none) and the framework variables"

    def execute(self, launch: Launch) -> None:
        task = launch.task
        launch.env.update(framework_env(task, launch))
        launch.command = lambda line: command_for(task, line, launch.env)
