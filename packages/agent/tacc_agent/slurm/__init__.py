"""Slurm as the agent uses it: one runner of its commands (run.py: argv only, bounded,
failures as AgentError), and one typed reader per output shape the agent asks for:

- oneliner.py: `scontrol show KIND --oneliner` records;
- jobs.py: `scontrol show job` (one job, every job, a job alone, -d node groups);
- queue.py: squeue, one reader per format the agent asks for;
- nodes.py: `scontrol show node|partition`, sinfo, host lists, drain and resume;
- reservations.py: `scontrol show|create|delete reservation`;
- controller.py: `scontrol ping` and `scontrol show config`;
- accounting.py: sacct, sacctmgr and sshare (--parsable2);
- tres.py, gres.py, times.py: the TRES and GRES strings and the times in all of them.

`from tacc_agent import slurm` gives them all: slurm.queue.running_jobs(...). Each is
imported on its first use (PEP 562's module __getattr__), so a verb pays only for the
readers it calls: a job step's start reads no sacct, sinfo or reservation module."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tacc_agent.slurm import (
        accounting,
        controller,
        gres,
        jobs,
        nodes,
        oneliner,
        queue,
        reservations,
        run,
        times,
        tres,
    )

__all__ = [
    "accounting",
    "controller",
    "gres",
    "jobs",
    "nodes",
    "oneliner",
    "queue",
    "reservations",
    "run",
    "times",
    "tres",
]


def __getattr__(name: str) -> ModuleType:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return importlib.import_module(f"{__name__}.{name}")
