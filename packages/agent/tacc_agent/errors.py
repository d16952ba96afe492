"""The agent's errors: reported as one JSON line on stdout (never a traceback). The
exit codes and the error types are the protocol's (tacc_contract.errors); these are
their names on this side."""

from __future__ import annotations

from tacc_contract.errors import AGENT_CLUSTER as EXIT_CLUSTER
from tacc_contract.errors import AGENT_FAILED as EXIT_FAILED
from tacc_contract.errors import AGENT_OK as EXIT_OK
from tacc_contract.errors import AGENT_REJECTED as EXIT_REJECTED
from tacc_contract.errors import AgentError, Rejected

__all__ = ["EXIT_CLUSTER", "EXIT_FAILED", "EXIT_OK", "EXIT_REJECTED", "AgentError", "Rejected"]
