"""GRES strings as Slurm prints them: a node's configured or used gres (scontrol's Gres=,
sinfo's gres and gres_used: "gpu:a100:4(S:0-1),shard:8", "gpu:a100:2(IDX:0-1)"), a
job's per-node GRES (scontrol show job -d: "gpu:2(IDX:0-1)"), and Slurm's index lists
("0-3,8"). The one reader of each."""

from __future__ import annotations

import re

from tacc_agent.hostlist import split_top_level

PAREN = re.compile(r"\([^()]*\)")
GRES_ITEM = re.compile(r"([^,(]+)\(([^)]*)\)")
# Indices past this are not a node's GPUs (a task may write SLURM_STEP_GPUS=0-4000000000
# into its own environment): such a range names none instead of building a huge set.
MAX_INDEX = 1024


def gres_items(gres: str) -> list[list[str]]:
    """A gres string's items as their words, the socket and index lists dropped
    (gpu:a100:8(S:0-1),shard:16 -> [gpu, a100, 8], [shard, 16])."""
    return [item.strip().split(":") for item in PAREN.sub("", gres or "").split(",")]


def count(gres: str, kind: str = "gpu") -> int:
    """How many of a kind (gpu, shard) a gres string names: the sum of its items'
    counts ("gpu:4(S:0-1)", "gpu:a100:2(IDX:0-1),shard:8"); an item without a count
    ("gpu", "gpu:a100") is one; other kinds (shards, MPS, nics) are not counted; 0 for
    (null) or ""."""
    total = 0
    for words in gres_items(gres):
        if words[0] != kind:
            continue
        if len(words) > 1 and words[-1].isdigit():
            total += int(words[-1])
        elif len(words) <= 2:  # "gpu" or "gpu:type": one
            total += 1
    return total


def gpu_kinds(gres: str) -> tuple[tuple[str, int], ...]:
    """The typed GPUs of a gres string (gpu:h100:4(S:0-1),gpu:l40s:2 -> (h100, 4),
    (l40s, 2)); untyped ones (gpu:2) are not named."""
    found: dict[str, int] = {}
    for words in gres_items(gres):
        if words[0] == "gpu" and len(words) == 3 and words[2].isdigit():
            found[words[1]] = found.get(words[1], 0) + int(words[2])
    return tuple(found.items())


def indices(text: str) -> set[int]:
    """Slurm's index list ("0,1", "0-3", "2,4-5": GPU indices, CPU ids); words that are
    not indices, and ranges past MAX_INDEX: none."""
    found: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            first, last = int(low), int(high or low)
            if last <= MAX_INDEX:
                found.update(range(first, last + 1))
    return found


def gpu_indices(gres: str) -> frozenset[int]:
    """The IDX of every gpu item of a job's per-node GRES (gpu:2(IDX:0-1),
    gpu:a100:1(IDX:3)); shards, MPS and other kinds name none."""
    found: set[int] = set()
    for item in split_top_level(gres, "(", ")"):
        match = GRES_ITEM.fullmatch(item.strip())
        if match and match.group(1).split(":")[0] == "gpu" and match.group(2).startswith("IDX:"):
            found |= indices(match.group(2)[len("IDX:") :])
    return frozenset(found)
