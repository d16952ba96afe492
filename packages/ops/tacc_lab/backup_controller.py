"""A lab with a backup Slurm controller (`tacc-lab up --backup-controller`; issue [21]).

The lab's last numbered node when the option is first given (n3 of a 3-node lab) also
runs a backup slurmctld and is a second login host, so a researcher's tcloud can fall
back to it while n1, the primary's node, is powered off. The controllers share their
saved state through a host directory bind-mounted at NODE_DIR on every node: the lab's
stand-in for a NAS, apart from both controllers (a power cut of n1 leaves it reachable).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError

NODE_DIR = "/srv/tacc-controllers"
# The backup takes over once the primary has not answered for this long (Slurm's default
# is 120 s; the lab's failover test would wait that long for nothing).
SLURMCTLD_TIMEOUT = 15


def marker(cfg: LabConfig) -> Path:
    """Names the backup controller's node; absent: the lab has none."""
    return cfg.state_dir / "backup-controller"


def host_dir(cfg: LabConfig) -> Path:
    """The controllers' shared storage on this machine (removed with the lab)."""
    return cfg.state_dir / "controllers"


def backup_node(cfg: LabConfig) -> str | None:
    path = marker(cfg)
    return path.read_text().strip() if path.exists() else None


def choose(cfg: LabConfig, numbered: list[str]) -> str:
    """Record the backup controller's node (the last numbered one) once; a lab keeps it."""
    chosen = backup_node(cfg)
    if chosen:
        return chosen
    if len(numbered) < 2:
        raise LabError("--backup-controller needs at least 2 nodes (n1 is the primary)")
    chosen = numbered[-1]
    host_dir(cfg).mkdir(mode=0o755, parents=True, exist_ok=True)
    marker(cfg).write_text(chosen + "\n")
    return chosen


def remove(cfg: LabConfig) -> None:
    marker(cfg).unlink(missing_ok=True)
    shutil.rmtree(host_dir(cfg), ignore_errors=True)


def bind_argv(cfg: LabConfig) -> list[str]:
    """systemd-nspawn's bind of the shared storage, on every node of a lab with one."""
    return [f"--bind={host_dir(cfg)}:{NODE_DIR}"] if backup_node(cfg) else []


def inventory_vars() -> dict:
    """What the roles need for two controllers: the shared state folders and the lab's
    short takeover time."""
    return {
        "slurm_state_save_location": f"{NODE_DIR}/slurm-state",
        "tacc_agent_cluster_state_dir": f"{NODE_DIR}/tacc-agent",
        "slurm_slurmctld_timeout": SLURMCTLD_TIMEOUT,
    }
