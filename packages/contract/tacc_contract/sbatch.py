"""The sbatch line of a task, as the agent submits it and as `tcloud submit --dry-run`
shows it: the task's options, the checkpoint signal, the task's extra options (refused
when the agent sets them). `config` is anything with the two cluster defaults below:
the agent passes its AgentConfig, tcloud the defaults (SbatchDefaults())."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tacc_contract import cpus_and_memory
from tacc_contract.errors import Rejected

# A task that sets no time; USR1 this long before the limit (defined where the agent's
# settings read them without loading the schema).
from tacc_contract.job_defaults import CHECKPOINT_SIGNAL_SECONDS, DEFAULT_TIME_LIMIT
from tacc_contract.jobs import SCRIPT
from tacc_contract.sbatch_options import why_refused
from tacc_contract.schema import TaskSpec, processes_per_node
from tacc_contract.slurm_time import time_seconds


class SbatchDefaults(Protocol):
    default_time_limit: str
    checkpoint_signal_seconds: int


@dataclass(frozen=True)
class ClusterDefaults:
    """The defaults of an agent whose config sets neither."""

    default_time_limit: str = DEFAULT_TIME_LIMIT
    checkpoint_signal_seconds: int = CHECKPOINT_SIGNAL_SECONDS


def extra_options(options: dict[str, str]) -> list[str]:
    """The task's extra sbatch options as words; Rejected for one the agent sets, in any
    spelling sbatch reads (the instruction's own check already refused it: the client
    is not trusted, so again here, before sbatch)."""
    words = []
    for name, value in sorted(options.items()):
        if problem := why_refused(name):
            raise Rejected(f"expected {problem}", f"resources.sbatch.{name}")
        words.append(f"--{name}={value}")
    return words


def slurm_tasks_per_node(task: TaskSpec) -> int:
    if task.runtime["launcher"] in ("srun", "mpirun"):
        return processes_per_node(task.resources)
    return 1


def base_options(
    task: TaskSpec,
    job_dir: Path,
    config: SbatchDefaults,
    per_gpu_defaults: tuple[bool, bool] = (True, True),
) -> dict[str, str | None]:
    """The sbatch options of the task as written, before any scheduling plug-in.
    `per_gpu_defaults`: whether the partition has DefCpuPerGPU and DefMemPerGPU (the
    agent knows; tcloud's dry run assumes it)."""
    res = task.resources
    cpus = cpus_and_memory.cpu_option(res, per_gpu_defaults[0])
    memory = cpus_and_memory.memory_option(res, per_gpu_defaults[1])
    options: dict[str, str | None] = {
        "job-name": task.name,
        "nodes": str(res["nodes"]),
        # One Slurm task per process (srun, mpirun's slots); torchrun starts its own.
        "ntasks-per-node": str(slurm_tasks_per_node(task)),
        **dict(option for option in (cpus, memory) if option),
        "time": res["time"] or config.default_time_limit,
        "requeue": None,
        "chdir": str(job_dir),
        "output": f"{job_dir}/logs/job.log",
        "open-mode": "append",
        "export": f"ALL,TACC_WORKDIR={job_dir}",
    }
    if res["gpus_per_node"]:
        options["gres"] = f"gpu:{res['gpus_per_node']}"
    for key in ("partition", "qos", "account"):
        if res[key]:
            options[key] = res[key]
    if res["priority"] is not None:
        options["nice"] = str(res["priority"])
    return options


def checkpoint_signal(
    options: dict[str, str | None], config: SbatchDefaults, mpirun_task: bool = False
) -> None:
    """The checkpoint signal reaches every rank's program before the time limit (set
    last: a plug-in may have changed the limit)."""
    limit = time_seconds(options["time"] or config.default_time_limit)
    warn = (
        config.checkpoint_signal_seconds
        if limit is None
        else min(config.checkpoint_signal_seconds, max(limit // 2, 1))
    )
    # mpirun runs in the batch step (B:), and passes the signal on to its ranks.
    batch = "B:" if mpirun_task else ""
    options["signal"] = f"{batch}USR1@{warn}"


def sbatch_argv(
    task: TaskSpec, job_dir: Path, config: SbatchDefaults, options: dict | None = None
) -> list[str]:
    """sbatch's argv: the task's extra sbatch options, then `options` as the scheduling
    plug-ins left them (default: the task's own), then the batch script. The extras come
    first: sbatch takes the last of an option given twice, so even a spelling of an
    agent's option that the check does not know cannot override it."""
    options = dict(base_options(task, job_dir, config) if options is None else options)
    checkpoint_signal(options, config, task.runtime["launcher"] == "mpirun")
    words = [f"--{k}" if v is None else f"--{k}={v}" for k, v in options.items()]
    extra = extra_options(task.resources["sbatch"] or {})
    return ["sbatch", *extra, "--parsable", *words, str(job_dir / SCRIPT)]
