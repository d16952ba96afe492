"""Elastic size (Elastic-KubeFlow's point): a task may give a node range
(`nodes: 2-4`). At submit the scheduling hook picks the size from the partition's
state: the whole range's maximum while there are that many idle nodes and nothing
waits in the queue (grow when the cluster is idle), the minimum when jobs are pending
(shrink when the queue waits), else as many as are idle. Slurm gets `--nodes=SIZE-MAX`
(it allocates the smallest count it can, so the size is the plug-in's choice, and
Slurm keeps the range in the job record); the execution layer tells the program the
size it got (TACC_NUM_NODES, WORLD_SIZE, torchrun --nnodes).
"""

from __future__ import annotations

import re
from typing import ClassVar

from tacc_contract.fields import Field
from tacc_contract.plugins import Launch, Plugin, Submission

RANGE = re.compile(r"(\d+)-(\d+)")
EXPECTED = "a node count >= 1, or a range like 2-4"


def node_range(value: object) -> tuple[int, int] | None:
    """(min, max) of a node count (3) or range ("2-4"); None when it is neither."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (value, value) if value >= 1 else None
    match = RANGE.fullmatch(str(value).strip())
    if not match:
        return None
    low, high = int(match.group(1)), int(match.group(2))
    return (low, high) if 1 <= low <= high else None


def check_nodes(value: object) -> str | None:
    return None if node_range(value) else EXPECTED


def min_nodes(resources: dict) -> int:
    found = node_range(resources.get("nodes", 1))
    return found[0] if found else 1


# Pending for a reason no node could end: a hold (a halted job), a dependency, a start
# time. Such a job does not wait for nodes, so it must not shrink an elastic job.
NOT_WAITING_FOR_NODES = ("JobHeld", "Dependency", "BeginTime")


def waiting_jobs(squeue_out: str) -> int:
    """Pending jobs (squeue `%i|%r` lines) that wait for nodes."""
    reasons = [line.partition("|")[2] for line in squeue_out.splitlines() if "|" in line]
    return sum(1 for reason in reasons if not reason.startswith(NOT_WAITING_FOR_NODES))


def partition_load(submission: Submission) -> tuple[int, int]:
    """(idle nodes, jobs waiting for nodes) of the submission's partition, from Slurm."""
    from tacc_agent import slurm

    timeout = submission.config.slurm_timeout_seconds
    part = f"--partition={submission.partition}"
    idle = slurm.slurm(["sinfo", "--noheader", part, "--states=idle", "--format=%D"], timeout)
    pending = slurm.slurm(["squeue", "--noheader", part, "--states=PENDING", "--format=%i|%r"],
                          timeout)  # fmt: skip
    return sum(int(n) for n in idle.split() if n.isdigit()), waiting_jobs(pending)


class Elastic(Plugin):
    name = "elastic"
    order = 20
    layers = ("schema", "schedule", "execute")
    summary = "nodes: 2-4 -> sbatch --nodes=2-4; the program learns the size it got"
    fields: ClassVar[dict[str, Field]] = {
        "resources.nodes": Field("any", default=1, check=check_nodes, expected=EXPECTED)
    }

    def check(self, task, problem) -> None:
        res = task["resources"]
        low, high = node_range(res["nodes"]) or (1, 1)
        res["nodes"] = low if low == high else f"{low}-{high}"

    def schedule(self, submission: Submission) -> None:
        nodes = submission.task.resources["nodes"]
        if not isinstance(nodes, str):
            return
        low, high = node_range(nodes) or (1, 1)
        idle, pending = partition_load(submission)
        size = low if pending else max(low, min(high, idle))
        submission.options["nodes"] = f"{size}-{high}"
        why = f"{pending} job(s) waiting" if pending else f"{idle} idle node(s)"
        submission.note(self.name, f"{size} of {nodes} nodes ({why})")

    def execute(self, launch: Launch) -> None:
        nodes = launch.task.resources["nodes"]
        if isinstance(nodes, str):
            low, high = node_range(nodes) or (1, 1)
            launch.env.update(TACC_NODES_MIN=str(low), TACC_NODES_MAX=str(high))
            launch.note(self.name, f"{len(launch.nodes)} node(s) of {nodes}")
