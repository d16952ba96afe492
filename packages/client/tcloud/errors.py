"""Errors tcloud reports to the user (never as a traceback) and its exit codes; the
codes, task-file problems and their error are the contract's (tacc_contract.errors)."""

from __future__ import annotations

from tacc_contract.errors import (
    EXIT_CLUSTER,
    EXIT_INTERNAL,
    EXIT_INVALID_TASK,
    EXIT_OK,
    EXIT_USAGE,
    Problem,
    TaccError,
    TaskFileError,
)

__all__ = [
    "EXIT_CLUSTER",
    "EXIT_INTERNAL",
    "EXIT_INVALID_TASK",
    "EXIT_OK",
    "EXIT_USAGE",
    "AgentFailure",
    "Problem",
    "TaccError",
    "TaskFileError",
    "TcloudError",
    "UsageError",
    "agent_failure",
]


class TcloudError(TaccError):
    """An error with a message for the user and the exit code it maps to."""

    exit_code = EXIT_CLUSTER


class AgentFailure(TcloudError):
    """A verb the cluster's agent answered with an error: its kind (the wire's,
    tacc_contract.errors.ERROR_KINDS) and its exit code (EXIT_OF_KIND)."""

    def __init__(self, message: str, kind: str, exit_code: int) -> None:
        super().__init__(message)
        self.kind = kind
        self.exit_code = exit_code


# The agent's error kinds as tcloud's exit codes, in one table. A rejection of a verb
# whose request carries a task (Verb.task: the upload) is a problem of the task.
EXIT_OF_KIND = {
    "failed": EXIT_CLUSTER,
    "rejected": EXIT_CLUSTER,
    "cluster": EXIT_CLUSTER,
    "rejected task": EXIT_INVALID_TASK,
}


def agent_failure(message: str, kind: str, task: bool = False) -> AgentFailure:
    key = "rejected task" if task and kind == "rejected" else kind
    return AgentFailure(message, kind, EXIT_OF_KIND.get(key, EXIT_CLUSTER))


class UsageError(TcloudError):
    """A command line tcloud refuses before contacting anything (exit 2)."""

    exit_code = EXIT_USAGE
