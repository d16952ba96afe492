"""Errors the agent reports as one JSON object on stdout (never a traceback)."""

from __future__ import annotations

# Exit codes of `tacc-agent` verbs (tcloud maps them to its own).
EXIT_OK = 0
EXIT_FAILED = 1  # the job or check itself failed
EXIT_REJECTED = 2  # bad request: invalid instruction, impossible resources, not your job
EXIT_CLUSTER = 3  # Slurm or the filesystem did not answer as expected


class AgentError(Exception):
    """A message for the user and the exit code it maps to."""

    def __init__(self, message: str, exit_code: int = EXIT_REJECTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Rejected(AgentError):
    """A request the cluster refuses (bad instruction, resources it can never give)."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message, EXIT_REJECTED)
        self.field = field
