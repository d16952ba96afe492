"""TRES lists as Slurm prints them (cpu=8,mem=16G,node=2,billing=8,gres/gpu=4): in
sacct's AllocTRES, squeue's tres-alloc, scontrol's TRES=, sacctmgr's limits; and the
tres-per-* requests (gres:gpu:2, gres/gpu:a100:2). The one reader of each."""

from __future__ import annotations

import functools
import math
import re

from tacc_agent.errors import AgentError

COUNT = re.compile(r"\d+")
SIZE = re.compile(r"(\d+)([KMGTP])")  # Slurm's sizes (mem=512G), counted in megabytes
MEGABYTES = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2, "P": 1024**3}


def items(text: str) -> dict[str, str]:
    """A TRES list as {name: value}, as printed (no value checked); a word without a
    name and "=" is left out."""
    pairs = (item.partition("=") for item in text.split(","))
    return {name.strip(): value.strip() for name, sep, value in pairs if sep and name.strip()}


def counts(text: str, what: str = "TRES") -> dict[str, int]:
    """The counts of a TRES list ("cpu=8,mem=4G,node=2,gres/gpu=4"), sizes in megabytes
    (mem=4G -> 4096; a K rounded up). AgentError naming `what` and the item for anything
    else: a count not read is a limit not kept."""
    found: dict[str, int] = {}
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        size = SIZE.fullmatch(value)
        if not item.strip():
            continue
        if not (sep and name) or not (COUNT.fullmatch(value) or size):
            raise AgentError(f"{what}: {item.strip()[:80]!r} is not a TRES count it reads")
        number = int(size.group(1)) * MEGABYTES[size.group(2)] if size else int(value)
        found[name] = math.ceil(number)
    return found


def gres_name(key: str) -> list[str]:
    """A TRES or gres name without its "gres" part: gres/gpu:a100 -> [gpu, a100]."""
    parts = key.strip().replace("/", ":").split(":")
    return parts[1:] if parts[0] == "gres" else parts


def gpus(text: str) -> int | None:
    """GPUs in a TRES list ("cpu=8,node=2,gres/gpu=8,gres/gpu:a100=8"): the untyped total,
    else the typed counts summed (Slurm may name only typed GPUs); None when it names no
    GPU count."""
    total, typed = None, None
    for item in text.split(","):
        key, sep, value = item.partition("=")
        name = gres_name(key)
        if not sep or name[0] != "gpu" or not COUNT.fullmatch(value.strip()):
            continue
        if len(name) == 1:
            total = (total or 0) + int(value)
        else:
            typed = (typed or 0) + int(value)
    return total if total is not None else typed


def requested_gpus(spec: str) -> int:
    """GPUs in one tres-per-* request ("gres:gpu:2", "gres/gpu:a100:2", "gpu", "N/A")."""
    count = 0
    for item in spec.split(","):
        name = gres_name(item)
        if name[0] == "gpu":
            count += int(name[-1]) if len(name) > 1 and COUNT.fullmatch(name[-1]) else 1
    return count


@functools.lru_cache(maxsize=4096)  # most of a big queue asks alike: parsed once a shape
def job_gpus(alloc: str, per_job: str, per_node: str, per_task: str, nodes: int, tasks: int) -> int:
    """A job's GPUs on all its nodes from squeue's tres-alloc and tres-per-job, -node and
    -task, whichever way they were asked for."""
    allocated = gpus(alloc)
    if allocated is not None:
        return allocated
    return max(
        requested_gpus(per_job), requested_gpus(per_node) * nodes, requested_gpus(per_task) * tasks
    )
