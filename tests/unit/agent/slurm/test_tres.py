"""TRES lists and requests (tacc_agent/slurm/tres.py), as sacct's AllocTRES, squeue's
tres-alloc and tres-per-*, scontrol's TRES= and sacctmgr's limits print them."""

from __future__ import annotations

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import tres


def test_tres_strings_are_read_name_by_name():
    counts = tres.items("billing=8,cpu=8,gres/gpu=2,mem=32G,node=1")
    assert counts == {"billing": "8", "cpu": "8", "gres/gpu": "2", "mem": "32G", "node": "1"}
    assert tres.items("cpu=,=3,junk,gres/gpu=x") == {"cpu": "", "gres/gpu": "x"}


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("billing=8,cpu=8,gres/gpu=2,mem=32G,node=1", 2),  # sacct's AllocTRES
        ("cpu=1,gres/gpu:a100=2,gres/gpu:v100=1", 3),  # typed GPUs only: their sum
        ("cpu=1,gres/gpu:a100=1,gres/gpu=1", 1),  # typed and untyped: not twice
        ("cpu=16,mem=64G,node=2,billing=16,gres/gpu=8", 8),  # squeue's tres-alloc
        ("cpu=8,node=2,gres/gpu=8,gres/gpu:a100=8", 8),
        ("cpu=1,mem=4G,node=1,billing=1", None),  # no GPU named
        ("gres/gpu=x", None),
        ("", None),
    ],
)
def test_gpus_of_a_tres_list(text, gpus):
    assert tres.gpus(text) == gpus


def test_tres_counts_read_sizes_in_megabytes():
    assert tres.counts("cpu=8,mem=4G,node=2,gres/gpu=4,billing=8,fs/disk=1T") == {
        "cpu": 8,
        "mem": 4096,
        "node": 2,
        "gres/gpu": 4,
        "billing": 8,
        "fs/disk": 1024**2,
    }
    assert tres.counts("mem=1000M,bb/x=1K,") == {"mem": 1000, "bb/x": 1}
    assert tres.counts("") == {}  # sacctmgr's empty limit: none


@pytest.mark.bad_input
@pytest.mark.parametrize("text", ["mem=lots", "cpu=1.5", "x", "=4", "mem=4g", "N/A"])
def test_a_tres_count_not_understood_is_an_error_naming_it(text):
    with pytest.raises(AgentError, match=r"QOS q MaxTRES: .* is not a TRES count it reads"):
        tres.counts(text, "QOS q MaxTRES")


@pytest.mark.parametrize(
    ("spec", "gpus"),
    [
        ("gres:gpu:2", 2),  # tres-per-node of --gres=gpu:2
        ("gres/gpu:a100:2", 2),
        ("gres:gpu", 1),
        ("gpu", 1),
        ("N/A", 0),
    ],
)
def test_gpus_of_a_request(spec, gpus):
    assert tres.requested_gpus(spec) == gpus


def test_a_jobs_gpus_whichever_way_it_asked_for_them():
    assert tres.job_gpus("cpu=2,gres/gpu=4", "N/A", "gres:gpu:1", "N/A", 2, 2) == 4  # held
    assert tres.job_gpus("cpu=2,node=2", "gres:gpu:3", "N/A", "N/A", 2, 2) == 3  # --gpus
    assert tres.job_gpus("cpu=2,node=2", "N/A", "gres:gpu:2", "N/A", 2, 2) == 4  # per node
    assert tres.job_gpus("cpu=2,node=2", "N/A", "N/A", "gres:gpu:1", 2, 5) == 5  # per task
