"""A lab with a backup Slurm controller (`tacc-lab up --backup-controller`; issue [21]).

The lab's last numbered node when the option is first given (n4 after `up --nodes 4
--backup-controller` on a 3-node lab) also runs a backup slurmctld and is a second login
host, so a researcher's tcloud can fall back to it while n1, the primary's node, is
powered off. The controllers share their saved state through a host directory that
every node of every lab has at NODE_DIR from its boot (so a running lab can gain a
backup controller without restarting n1): the lab's stand-in for a NAS, apart from both
controllers (a power cut of n1 leaves it reachable). Only root and slurm can enter the
folders the roles make there; a site exports its storage to the controllers alone.
"""

from __future__ import annotations

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
    marker(cfg).write_text(chosen + "\n")
    return chosen


def remove(cfg: LabConfig) -> None:
    marker(cfg).unlink(missing_ok=True)


def bind_argv(cfg: LabConfig) -> list[str]:
    """systemd-nspawn's bind of the shared storage (made if missing), on every node."""
    host_dir(cfg).mkdir(mode=0o755, parents=True, exist_ok=True)
    return [f"--bind={host_dir(cfg)}:{NODE_DIR}"]


def inventory_vars() -> dict:
    """What the roles need for two controllers: the shared state folders and the lab's
    short takeover time."""
    return {
        "slurm_state_save_location": f"{NODE_DIR}/slurm-state",
        "tacc_agent_cluster_state_dir": f"{NODE_DIR}/tacc-agent",
        "slurm_slurmctld_timeout": SLURMCTLD_TIMEOUT,
    }
