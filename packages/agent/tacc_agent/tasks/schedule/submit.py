"""Layer 3, scheduling: a compiled instruction becomes one `sbatch` submission.

Requests the cluster can never satisfy (an unknown partition, more GPUs, CPUs or memory
per node than any node of the partition has, more nodes than it has) are refused before
anything reaches Slurm, with the field and the reason. The sbatch options are then
shaped by the scheduling plug-ins that are on (tacc_plugins: GPU shares, node ranges,
GPU types, predicted time limits, ...), and their notes go into status/submit.json.
What they see of the cluster comes on the Submission: the nodes and partitions, the
partition's load and the caller's earlier jobs, read here.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute import containers
from tacc_agent.tasks.images import registry
from tacc_agent.tasks.jobs import job_tags, records, sweeps
from tacc_agent.tasks.schedule import found_again as submitting
from tacc_agent.tasks.schedule.cluster_shape import read_nodes, scheduling_partitions
from tacc_agent.tasks.schedule.instruction import load
from tacc_agent.tasks.store import workspace
from tacc_contract import cpus_and_memory
from tacc_contract.instruction import digest_of
from tacc_contract.jobs import SCRIPT
from tacc_contract.plugins import (
    NOT_WAITING_FOR_NODES,
    Node,
    Partition,
    PartitionLoad,
    Plugin,
    Submission,
)
from tacc_contract.registry import PluginError, in_layer, select
from tacc_contract.sbatch import base_options, sbatch_argv, slurm_tasks_per_node
from tacc_contract.schema import TaskSpec
from tacc_plugins.elastic import min_nodes

SIZE = re.compile(r"(\d+)([KMGT]?)")
UNITS_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


def memory_mb(text: str) -> float:
    match = SIZE.fullmatch(text)
    return int(match.group(1)) * UNITS_MB[match.group(2)] if match else 0


def wanted_cpus(task: TaskSpec, partition: Partition) -> tuple[str, float, str]:
    """(field, CPUs per node, what they are) the job will hold on each node; 0 when the
    partition's per-GPU default decides and it has none (Slurm's own then)."""
    res, gpus = task.resources, cpus_and_memory.whole_gpus(task.resources)
    option = cpus_and_memory.cpu_option(res, partition.cpus_per_gpu > 0)
    if option is None:
        return "gpus_per_node", gpus * partition.cpus_per_gpu, f"CPUs ({gpus} GPUs x DefCpuPerGPU)"
    if option[0] == "cpus-per-gpu":
        return "cpus_per_gpu", gpus * int(option[1]), f"CPUs ({gpus} GPUs x {option[1]})"
    tasks = slurm_tasks_per_node(task)  # each Slurm task gets `cpus` CPUs
    what = "CPUs" if tasks == 1 else f"CPUs ({tasks} processes x {option[1]})"
    return "cpus", int(option[1]) * tasks, what


def wanted_memory(task: TaskSpec, partition: Partition) -> tuple[str, float, str]:
    """(field, MB per node, what they are) as wanted_cpus."""
    res, gpus = task.resources, cpus_and_memory.whole_gpus(task.resources)
    option = cpus_and_memory.memory_option(res, partition.mem_per_gpu_mb > 0)
    if option is None:
        return "gpus_per_node", gpus * partition.mem_per_gpu_mb, "MB of memory (DefMemPerGPU)"
    if option[0] == "mem-per-gpu":
        return "mem_per_gpu", gpus * memory_mb(option[1]), f"MB of memory ({gpus} GPUs)"
    return "mem", memory_mb(option[1]), "MB of memory"


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
    in_partition = set(partition.nodes)
    members = [n for n in nodes if n.name in in_partition]
    limits = (
        ("gpus_per_node", res["gpus_per_node"], "GPUs", lambda n: n.gpus),
        (*wanted_cpus(task, partition), lambda n: n.cpus),
        (*wanted_memory(task, partition), lambda n: n.memory_mb),
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
    if min_nodes(res) > len(fitting):
        raise Rejected(
            f"{res['nodes']} nodes requested, but partition {partition.name!r} has "
            f"{len(fitting)} node(s) that fit the per-node request",
            "resources.nodes",
        )
    return partition.name


# The partitions and nodes a submit is planned against (two scontrol calls, every node's
# record: read once per request, for its check and its sbatch).
Shape = tuple[list[Partition], list[Node]]


def cluster_shape(timeout: float) -> Shape:
    nodes = read_nodes(timeout)
    return scheduling_partitions(slurm.nodes.all_partitions(timeout), nodes), nodes


def waiting_jobs(reasons: list[str]) -> int:
    """Pending jobs (their reasons: slurm.queue.pending_reasons) that wait for nodes."""
    return sum(1 for reason in reasons if not reason.startswith(NOT_WAITING_FOR_NODES))


def partition_load(partition: str, timeout: float) -> PartitionLoad:
    """Idle nodes and jobs waiting for nodes in a partition, from Slurm
    (`Submission.partition_load`)."""
    return PartitionLoad(
        slurm.nodes.idle_count(partition, timeout),
        waiting_jobs(slurm.queue.pending_reasons(partition, timeout)),
    )


def cluster_plugins(task: TaskSpec, config: AgentConfig) -> list[Plugin]:
    """The plug-ins on for this job: the defaults, then ops' selection (agent config
    `plugins`), then the task's own words (which cannot turn off cluster policy)."""
    try:
        return select(config.plugins, task=task.plugins, policy_from=config.plugins)
    except PluginError as exc:
        raise Rejected(str(exc), "plugins") from None


def check_container(task: TaskSpec, allowed_registries: tuple[str, ...] = ()) -> None:
    """A task in an image: from a registry the cluster takes images from (its image or
    its build's base), and every dataset's cluster path bindable into it (refused at
    submit, not when the job starts)."""
    registry.check_task(task.image, task.image_build, allowed_registries)
    if task.image:
        for dataset in task.datasets:
            if dataset.cluster:
                containers.bindable(dataset.cluster)


def plan(
    task: TaskSpec,
    job_dir: Path,
    config: AgentConfig,
    user_dir: Path | None = None,
    digest: str = "",
    shape: Shape | None = None,
) -> Submission:
    """Check the task against the cluster (`shape`, else read now), then let the
    scheduling plug-ins shape it."""
    check_container(task, config.image_registries)
    partitions, nodes = shape or cluster_shape(config.slurm_timeout_seconds)
    partitions, nodes = list(partitions), list(nodes)  # a plug-in's changes stay its own
    partition = check_feasible(task, partitions, nodes)
    chosen = next(p for p in partitions if p.name == partition)
    per_gpu_defaults = (chosen.cpus_per_gpu > 0, chosen.mem_per_gpu_mb > 0)
    submission = Submission(
        task=task,
        options=base_options(task, job_dir, config, per_gpu_defaults),
        partition=partition,
        partitions=partitions,
        nodes=nodes,
        user_dir=user_dir,
        digest=digest,
        config=config,
        partition_load=lambda name: partition_load(name, config.slurm_timeout_seconds),
    )
    if user_dir is not None:
        submission.history = lambda count: records.past_jobs(user_dir, count)
    for plugin in in_layer(cluster_plugins(task, config), "schedule"):
        plugin.schedule(submission)
    return submission


def batch_script(task: TaskSpec, job_dir: Path, digest: str) -> str:
    command = shlex.join([sys.executable, "-I", "-m", "tacc_agent", "batch", str(job_dir)])
    return (
        "#!/bin/sh\n"
        f"# tacc-agent batch step of task {task.name}, instruction {digest}.\n"
        "# Slurm options: status/submit.json. Each node runs `tacc-agent exec` (layer 4).\n"
        f"exec {command}\n"
    )


def check(task: TaskSpec, config: AgentConfig, shape: Shape | None = None) -> str:
    """The partition the task would go to; Rejected (with the field) when the cluster or
    a scheduling plug-in refuses it."""
    return plan(task, Path("/nonexistent"), config, shape=shape).partition


def submit(user_dir: Path, job_dir: Path, config: AgentConfig, shape: Shape | None = None) -> dict:
    """sbatch the job in job_dir (built by `store commit`); on refusal remove job_dir.
    Under the job's submission lock: a second submit of it waits, then is refused."""
    job_dir = job_dir.resolve()
    if job_dir.parent != (user_dir / "jobs").resolve() or not (job_dir / "status").is_dir():
        raise Rejected(f"{job_dir} is not one of your job directories")
    with submitting.locked(job_dir, wait=True):
        if (job_dir / "status" / "submit.json").exists() or records.history(job_dir):
            raise Rejected(f"{job_dir} was submitted already; submit the task again for a new job")
        return sbatch_job(user_dir, job_dir, config, shape)


def discard(user_dir: Path, job_dir: Path) -> None:
    """A refused job: nothing of it is left."""
    workspace.drop_submitting(user_dir, job_dir)
    shutil.rmtree(job_dir, ignore_errors=True)


def sbatch_job(
    user_dir: Path, job_dir: Path, config: AgentConfig, shape: Shape | None = None
) -> dict:
    """Plan, record, sbatch. The job is recorded and indexed as submitting, with its tag
    (sbatch --comment), before sbatch runs: if this process dies or sbatch times out
    before the id is indexed, the next ps/status/cancel finds the job in Slurm by its tag
    (tacc_agent/submitting.py)."""
    try:
        task = load(job_dir)
        document = records.read_json(job_dir / "instruction.json") or {}
        digest = digest_of(document)
        submission = plan(task, job_dir, config, user_dir, digest, shape)
        partition = submission.partition
        submission.options["comment"] = job_tags.new_tag(job_dir)
        argv = sbatch_argv(task, job_dir, config, submission.options)
        script = job_dir / SCRIPT
        script.write_text(batch_script(task, job_dir, digest))
        trials = submission.data.get("sweep", {}).get("trials", 0)
        if trials:
            sweeps.make_trials(job_dir, trials)
        script.chmod(0o700)
        submitting.begin(
            user_dir,
            job_dir,
            {
                "name": task.name,
                "sbatch": argv,
                "digest": digest,
                "options": submission.options,
                "plugins": submission.notes,
                "plugin_data": submission.data,
                "tag": submission.options["comment"],
                "entrypoint": submission.data.get("entrypoint", ""),
                # What the task lets the cluster do to the job, whichever scheduling
                # policies are on now (tasks/schedule/preempt.py reads it at a tick).
                "opt_in": ["preemptible"] if task.resources.get("preemptible") else [],
            },
        )
        # First: the job's own events (PROVISIONING, ...) must come after this one.
        records.add_event(job_dir, "QUEUED")
        out = slurm.run.output(argv, config.slurm_timeout_seconds)
    except AgentError as exc:
        if "did not answer" not in str(exc):  # refused: nothing of the job is left
            discard(user_dir, job_dir)
            raise
        raise AgentError(
            f"{exc}; if Slurm took the job, `tcloud ps` finds it (and its id) once Slurm "
            "answers again",
            exc.exit_code,
        ) from None
    except Exception:
        discard(user_dir, job_dir)
        raise
    job_id = out.strip().split(";")[0]
    submitting.finish(user_dir, job_dir, job_id)
    return {
        "job_id": job_id,
        "name": task.name,
        "workdir": str(job_dir),
        "partition": partition,
        "plugins": submission.notes,
    }
