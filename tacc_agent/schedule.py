"""Layer 3, scheduling: a compiled instruction becomes one `sbatch` submission.

Requests the cluster can never satisfy (an unknown partition, more GPUs, CPUs or memory
per node than any node of the partition has, more nodes than it has) are refused before
anything reaches Slurm, with the field and the reason.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from tacc_agent import records, slurm, workspace
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.instruction import digest_of, load
from tcloud.schema import TaskSpec

# sbatch options a task may not override: the agent owns the job's layout and env.
RESERVED_OPTIONS = {
    "chdir", "error", "export", "input", "output", "open-mode", "parsable", "wrap",
    "signal", "ntasks-per-node", "job-name", "requeue", "no-requeue", "array",
}  # fmt: skip
OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*")
SIZE = re.compile(r"(\d+)([KMGT]?)")
UNITS_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


@dataclass(frozen=True)
class Node:
    name: str
    cpus: int
    memory_mb: int
    gpus: int
    partitions: tuple[str, ...]


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: tuple[str, ...]


def gpu_count(gres: str) -> int:
    """GPUs in a node's Gres= (gpu:a100:8(S:0-1),gpu:2 ...); 0 for (null)."""
    total = 0
    for entry in re.sub(r"\([^)]*\)", "", gres).split(","):
        parts = entry.split(":")
        if parts[0] == "gpu" and len(parts) > 1 and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_nodes(records_: list[dict[str, str]]) -> list[Node]:
    return [
        Node(
            name=r["NodeName"],
            cpus=int(r.get("CPUTot", "0") or 0),
            memory_mb=int(r.get("RealMemory", "0") or 0),
            gpus=gpu_count(r.get("Gres", "")),
            partitions=tuple(p for p in r.get("Partitions", "").split(",") if p),
        )
        for r in records_
        if "NodeName" in r
    ]


def parse_partitions(records_: list[dict[str, str]], nodes: list[Node]) -> list[Partition]:
    return [
        Partition(
            name=r["PartitionName"],
            default=r.get("Default") == "YES",
            nodes=tuple(n.name for n in nodes if r["PartitionName"] in n.partitions),
        )
        for r in records_
        if "PartitionName" in r
    ]


def memory_mb(text: str) -> float:
    match = SIZE.fullmatch(text)
    return int(match.group(1)) * UNITS_MB[match.group(2)] if match else 0


def time_seconds(text: str) -> int | None:
    """Slurm's time formats (M, M:S, H:M:S, D-H, D-H:M, D-H:M:S); None when unlimited."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return None
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:
        hours, minutes, seconds = [*parts, 0, 0][:3]
    elif len(parts) == 1:
        hours, minutes, seconds = 0, parts[0], 0
    elif len(parts) == 2:
        hours, (minutes, seconds) = 0, parts
    else:
        hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


def check_feasible(task: TaskSpec, partitions: list[Partition], nodes: list[Node]) -> str:
    """The partition the job goes to; Rejected when no state of the cluster could run it."""
    res = task.resources
    names = [p.name for p in partitions]
    if res["partition"]:
        if res["partition"] not in names:
            known = ", ".join(names) or "none"
            raise Rejected(
                f"unknown partition {res['partition']!r}; this cluster has: {known}",
                "resources.partition",
            )
        partition = next(p for p in partitions if p.name == res["partition"])
    else:
        defaults = [p for p in partitions if p.default]
        if not defaults:
            raise Rejected(
                "no default partition on this cluster; set resources.partition to one of: "
                + ", ".join(names),
                "resources.partition",
            )
        partition = defaults[0]
    members = [n for n in nodes if n.name in partition.nodes]
    want_mem = memory_mb(res["mem"])
    limits = (
        ("gpus_per_node", res["gpus_per_node"], "GPUs", lambda n: n.gpus),
        ("cpus", res["cpus"], "CPUs", lambda n: n.cpus),
        ("mem", want_mem, "MB of memory", lambda n: n.memory_mb),
    )
    for field, wanted, what, have in limits:
        most = max((have(n) for n in members), default=0)
        if wanted > most:
            raise Rejected(
                f"{wanted:g} {what} per node requested, but the most any node in partition "
                f"{partition.name!r} has is {most:g}",
                f"resources.{field}",
            )
    fitting = [n for n in members if all(have(n) >= wanted for _, wanted, _, have in limits)]
    if res["nodes"] > len(fitting):
        raise Rejected(
            f"{res['nodes']} nodes requested, but partition {partition.name!r} has "
            f"{len(fitting)} node(s) that fit the per-node request",
            "resources.nodes",
        )
    return partition.name


def cluster_shape(timeout: float) -> tuple[list[Partition], list[Node]]:
    nodes = parse_nodes(slurm.show("node", timeout=timeout))
    return parse_partitions(slurm.show("partition", timeout=timeout), nodes), nodes


def extra_options(options: dict[str, str]) -> list[str]:
    words = []
    for name, value in sorted(options.items()):
        # sbatch accepts unambiguous prefixes (--outp): refuse those too.
        if not OPTION_NAME.fullmatch(name) or any(r.startswith(name) for r in RESERVED_OPTIONS):
            raise Rejected(
                f"sbatch option {name!r} cannot be set by a task (the agent sets it)",
                f"resources.sbatch.{name}",
            )
        words.append(f"--{name}={value}")
    return words


def sbatch_argv(task: TaskSpec, job_dir: Path, config: AgentConfig) -> list[str]:
    res = task.resources
    limit = time_seconds(res["time"])
    warn = config.checkpoint_signal_seconds if limit is None else min(
        config.checkpoint_signal_seconds, max(limit // 2, 1)
    )  # fmt: skip
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={task.name}",
        f"--nodes={res['nodes']}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={res['cpus']}",
        f"--mem={res['mem']}",
        f"--time={res['time']}",
        "--requeue",
        # The checkpoint signal reaches every rank's program before the time limit.
        f"--signal=USR1@{warn}",
        f"--chdir={job_dir}",
        f"--output={job_dir}/logs/job.log",
        "--open-mode=append",
        f"--export=ALL,TACC_WORKDIR={job_dir}",
    ]
    if res["gpus_per_node"]:
        argv.append(f"--gres=gpu:{res['gpus_per_node']}")
    for key in ("partition", "qos", "account"):
        if res[key]:
            argv.append(f"--{key}={res[key]}")
    if res["priority"] is not None:
        argv.append(f"--nice={res['priority']}")
    return [*argv, *extra_options(res["sbatch"] or {}), str(job_dir / "job.sh")]


def batch_script(task: TaskSpec, job_dir: Path, digest: str) -> str:
    command = shlex.join([sys.executable, "-I", "-m", "tacc_agent", "batch", str(job_dir)])
    return (
        "#!/bin/sh\n"
        f"# tacc-agent batch step of task {task.name}, instruction {digest}.\n"
        "# Slurm options: status/submit.json. Each node runs `tacc-agent exec` (layer 4).\n"
        f"exec {command}\n"
    )


def check(task: TaskSpec, config: AgentConfig) -> str:
    partitions, nodes = cluster_shape(config.slurm_timeout_seconds)
    return check_feasible(task, partitions, nodes)


def submit(user_dir: Path, job_dir: Path, config: AgentConfig) -> dict:
    """sbatch the job in job_dir (built by `store commit`); on refusal remove job_dir."""
    job_dir = job_dir.resolve()
    if job_dir.parent != (user_dir / "jobs").resolve() or not job_dir.is_dir():
        raise Rejected(f"{job_dir} is not one of your job directories")
    if (job_dir / "status" / "submit.json").exists() or records.history(job_dir):
        raise Rejected(f"{job_dir} was submitted already; submit the task again for a new job")
    try:
        task = load(job_dir)
        partition = check(task, config)
        argv = sbatch_argv(task, job_dir, config)
        document = records.read_json(job_dir / "instruction.json") or {}
        script = job_dir / "job.sh"
        script.write_text(batch_script(task, job_dir, digest_of(document)))
        script.chmod(0o700)
        # First: the job's own events (PROVISIONING, ...) must come after this one.
        records.add_event(job_dir, "QUEUED")
        out = slurm.slurm(argv, config.slurm_timeout_seconds)
    except AgentError as exc:
        if "did not answer" not in str(exc):  # refused: nothing of the job is left
            shutil.rmtree(job_dir, ignore_errors=True)
        raise
    except Exception:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    job_id = out.strip().split(";")[0]
    workspace.register(user_dir, job_id, job_dir)
    records.write_json(
        job_dir / "status" / "submit.json", {"job_id": job_id, "name": task.name, "sbatch": argv}
    )
    return {"job_id": job_id, "name": task.name, "workdir": str(job_dir), "partition": partition}
