"""The memory of a node's GPUs as nvidia-smi reports it: a job's share of a GPU under
CUDA MPS gets its part of it as a memory limit (tasks/execute/launch.py)."""

from __future__ import annotations

import subprocess

QUERY = ["--query-gpu=memory.total", "--format=csv,noheader,nounits"]


def smallest_mib(nvidia_smi: str, timeout: float) -> int | None:
    """The memory of the node's smallest GPU (MiB): what a share of "its GPU" is taken
    of, wherever Slurm puts the job; None when nvidia-smi does not say."""
    try:
        proc = subprocess.run(
            [nvidia_smi, *QUERY], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    sizes = [int(line.strip()) for line in proc.stdout.splitlines() if line.strip().isdigit()]
    return min(sizes) if sizes else None
