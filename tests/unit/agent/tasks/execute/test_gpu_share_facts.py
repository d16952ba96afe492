"""Issue [22] point 6: what the wrapper tells the gpu_share plug-in about a share Slurm
served by CUDA MPS (its limits are taken from the GPU's memory, from nvidia-smi)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent import gpu_memory
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.execute.launch import gpu_share_facts

SMI = "#!/bin/sh\necho 46068\necho 81559\n"


def fake_smi(tmp_path: Path, script: str = SMI) -> str:
    path = tmp_path / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)
    return str(path)


def share_task(share: float | None) -> SimpleNamespace:
    """What gpu_share_facts reads of a task: its resources."""
    return SimpleNamespace(resources={"gpu_share": share} if share else {})


def test_the_smallest_gpus_memory_is_the_share_base(tmp_path):
    assert gpu_memory.smallest_mib(fake_smi(tmp_path), 5) == 46068
    assert gpu_memory.smallest_mib(fake_smi(tmp_path, "#!/bin/sh\nexit 9\n"), 5) is None
    assert gpu_memory.smallest_mib(str(tmp_path / "missing"), 5) is None


def test_an_mps_served_share_reads_the_gpu_memory_and_others_read_nothing(tmp_path, monkeypatch):
    config = AgentConfig(nvidia_smi=fake_smi(tmp_path))
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")  # what Slurm sets (gres/mps)
    assert gpu_share_facts(share_task(0.25), config) == {
        "gpu_sharing": "mps",
        "slurm_mps_percentage": 25,
        "gpu_memory_mib": 46068,
        "mps_daemon": False,  # no root-owned /tmp/nvidia-mps/control here
    }
    assert gpu_share_facts(share_task(None), config) == {}  # whole GPUs: no MPS limits
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    assert gpu_share_facts(share_task(0.25), config) == {}  # served as shards


@pytest.fixture(autouse=True)
def _no_mps(monkeypatch):
    monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)


@pytest.mark.security
def test_only_a_root_owned_control_pipe_counts_as_the_mps_daemon(tmp_path, monkeypatch):
    """Anyone may create /tmp/nvidia-mps: a user's own "control" file must not make the
    notes claim that MPS limits bind."""
    pipes = tmp_path / "pipes"
    pipes.mkdir()
    (pipes / "control").write_text("")
    monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "25")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    config = AgentConfig(nvidia_smi=fake_smi(tmp_path))
    if os.geteuid() == 0:  # CI: a root-owned pipe counts, one handed to nobody does not
        assert gpu_share_facts(share_task(0.25), config)["mps_daemon"] is True
        os.chown(pipes / "control", 65534, 65534)
    assert gpu_share_facts(share_task(0.25), config)["mps_daemon"] is False
