"""Into a running job (docs/interactive.md): where it runs (`job target`), a command or
a shell on one of its nodes inside its allocation (`job attach`, which execs srun on the
login node; `enter`, which srun runs on the node), and `job stop-on-disconnect`.

STUB: filled in by the attach work (helper H1)."""

from __future__ import annotations

from pathlib import Path

from tacc_agent.config import AgentConfig


def target(user_dir: Path, job_id: str, config: AgentConfig, rank: int | None = None) -> dict:
    """JOB_TARGET: the caller's running job's nodes by rank (host, rank, address)."""
    raise NotImplementedError


def attach(user_dir: Path, job_id: str, config: AgentConfig, rank: int, command: list[str],
           pty: bool) -> int:  # fmt: skip
    """Checks, then execs `srun --jobid --overlap ... tacc-agent enter JOBDIR` (no return)."""
    raise NotImplementedError


def stop_on_disconnect(user_dir: Path, job_id: str, config: AgentConfig) -> int:
    raise NotImplementedError


def enter(job_dir: Path, rank: int, command: list[str], config: AgentConfig) -> int:
    """On the node, inside the step: exec the command in the job's environment."""
    raise NotImplementedError
