"""GRES strings and index lists (tacc_agent/slurm/gres.py): a node's Gres= (scontrol) and
gres/gres_used (sinfo --json), a job's per-node GRES (scontrol show job -d)."""

from __future__ import annotations

import pytest

from tacc_agent.slurm import gres


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("", 0),
        ("(null)", 0),
        ("gpu:4", 4),
        ("gpu:a100:4(S:0-1)", 4),  # scontrol's Gres=
        ("gpu:a100:8(S:0-1)", 8),
        ("gpu:a100:2(IDX:0-1),gpu:v100:1(IDX:3)", 3),  # sinfo's gres_used
        ("gpu:2,gpu:l40s:1,nic:1", 3),
        ("shard:8,gpu:2", 2),
        ("gpu", 1),
        ("gpu:a100", 1),
        ("mps:100", 0),
    ],
)
def test_gpus_of_a_gres_string(text, count):
    assert gres.count(text) == count


def test_shards_and_typed_gpus():
    assert gres.count("gpu:a100:8(S:0-1),shard:16", "shard") == 16
    assert gres.gpu_kinds("gpu:h100:4(S:0-1),gpu:l40s:2,gpu:2,shard:8") == (
        ("h100", 4),
        ("l40s", 2),
    )
    assert gres.gpu_kinds("(null)") == ()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0,1", {0, 1}),
        ("0-3", {0, 1, 2, 3}),
        ("2,4-5", {2, 4, 5}),
        ("", set()),
        ("N/A", set()),
        ("gpu:1", set()),
    ],
)
def test_index_lists(text, expected):
    assert gres.indices(text) == expected


@pytest.mark.security
def test_a_huge_range_names_no_index():
    """SLURM_STEP_GPUS=0-4000000000 in a task's own environment (job_usage reads it with
    this reader): no GPU (it built a set of 4e9 numbers in the root daemon before: seconds
    and gigabytes; how long it takes now is measured in bench/unit_timing.py)."""
    assert gres.indices("0-4000000000") == set()
    assert gres.indices("0-1,3,2000-2001") == {0, 1, 3}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:2(IDX:0-1)", {0, 1}),
        ("gpu:a100:1(IDX:3),shard:2(2/10,0/10)", {3}),
        ("gpu:tesla:2(IDX:1,3),mps:100(0/100)", {1, 3}),
        ("shard:2(2/10,0/10,0/10)", set()),
        ("", set()),
    ],
)
def test_the_gpus_of_a_jobs_node_group(text, expected):
    assert gres.gpu_indices(text) == expected
