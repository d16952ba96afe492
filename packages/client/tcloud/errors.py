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
    "Problem",
    "TaccError",
    "TaskFileError",
    "TcloudError",
    "UsageError",
]


class TcloudError(TaccError):
    """An error with a message for the user and the exit code it maps to."""

    exit_code = EXIT_CLUSTER


class UsageError(TcloudError):
    """A command line tcloud refuses before contacting anything (exit 2)."""

    exit_code = EXIT_USAGE
