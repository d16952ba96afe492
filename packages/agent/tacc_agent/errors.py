"""The agent's errors: reported as one JSON line on stdout (never a traceback). The
error kinds and their numbers (the agent's exit codes) and the error types are the
protocol's (tacc_contract.errors); the agent uses them under the contract's own names,
AGENT_* (tcloud's exit codes are the contract's EXIT_*)."""

from __future__ import annotations

from tacc_contract.errors import (
    AGENT_CLUSTER,
    AGENT_FAILED,
    AGENT_OK,
    AGENT_REJECTED,
    AgentError,
    Rejected,
)

__all__ = ["AGENT_CLUSTER", "AGENT_FAILED", "AGENT_OK", "AGENT_REJECTED", "AgentError", "Rejected"]
