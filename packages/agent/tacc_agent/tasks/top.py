"""`job top`: a running job's live usage on each of its nodes, read from the node
daemons' per-job figures (tacc_agent.health.job_usage).

STUB: filled in by the usage work (helper H2)."""

from __future__ import annotations

from pathlib import Path

from tacc_agent.config import AgentConfig


def top(user_dir: Path, job_id: str, config: AgentConfig) -> dict:
    """JOB_TOP."""
    raise NotImplementedError
