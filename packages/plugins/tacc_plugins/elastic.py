"""Elastic size (Elastic-KubeFlow's point): a task may give a node range
(`nodes: 2-4`). At submit the scheduling hook picks the size from the partition's
state (`Submission.partition_load`, which the agent reads from Slurm): the whole
range's maximum while there are that many idle nodes and nothing waits for nodes (grow
when the cluster is idle), the minimum when jobs wait for nodes (shrink when the queue
waits), else as many as are idle. Slurm gets `--nodes=SIZE-MAX --use-min-nodes` (the
smallest count it can: the size is the plug-in's choice, and Slurm keeps the range in
the job record); the execution layer tells the program the size it got
(TACC_NUM_NODES, WORLD_SIZE, torchrun --nnodes).

Running jobs change size too, where ops turn it on and the task allows it
(`resources.resize: true`): the tick in elastic_resize.py.
"""

from __future__ import annotations

import re
from typing import ClassVar

from tacc_contract.fields import Field
from tacc_contract.plugins import Launch, Plugin, Queue, Submission
from tacc_plugins import elastic_resize

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


class Elastic(Plugin):
    name = "elastic"
    order = 20
    layers = ("schema", "schedule", "execute")
    summary = (
        "nodes: 2-4 -> sbatch --nodes=2-4; the program learns the size it got; "
        "resize: true -> grown and shrunk while running (plugin_settings.elastic)"
    )
    fields: ClassVar[dict[str, Field]] = {
        "resources.nodes": Field("any", default=1, check=check_nodes, expected=EXPECTED),
        "resources.resize": Field("bool", default=False),
    }

    def check(self, task, problem) -> None:
        res = task["resources"]
        low, high = node_range(res["nodes"]) or (1, 1)
        res["nodes"] = low if low == high else f"{low}-{high}"
        if res.get("resize") and low == high:
            problem("resources.resize", "resizing needs a node range: set nodes: MIN-MAX")

    def tick(self, queue: Queue) -> None:
        elastic_resize.tick(queue)

    def schedule(self, submission: Submission) -> None:
        nodes = submission.task.resources["nodes"]
        if not isinstance(nodes, str):
            return
        low, high = node_range(nodes) or (1, 1)
        load = submission.partition_load(submission.partition)
        idle, pending = load.idle_nodes, load.waiting_jobs
        size = low if pending else max(low, min(high, idle))
        submission.options["nodes"] = f"{size}-{high}"
        submission.options["use-min-nodes"] = None  # else Slurm gives as many as are free
        if submission.task.resources.get("resize"):
            submission.data[self.name] = {"opt_in": [elastic_resize.RESIZE], "range": [low, high]}
        why = f"{pending} job(s) waiting" if pending else f"{idle} idle node(s)"
        submission.note(self.name, f"{size} of {nodes} nodes ({why})")

    def execute(self, launch: Launch) -> None:
        nodes = launch.task.resources["nodes"]
        if isinstance(nodes, str):
            low, high = node_range(nodes) or (1, 1)
            launch.env.update(TACC_NODES_MIN=str(low), TACC_NODES_MAX=str(high))
            launch.note(self.name, f"{len(launch.nodes)} node(s) of {nodes}")
