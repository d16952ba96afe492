"""Errors tcloud reports to the user (never as a traceback) and its exit codes."""

from __future__ import annotations

from dataclasses import dataclass

# Exit codes (documented in docs/tcloud.md).
EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug in tcloud: reported in one line, never as a traceback
EXIT_USAGE = 2
EXIT_INVALID_TASK = 3
EXIT_CLUSTER = 4


class TcloudError(Exception):
    """An error with a message for the user and the exit code it maps to."""

    exit_code = EXIT_CLUSTER


@dataclass(frozen=True)
class Problem:
    """One problem in a task file, at a position."""

    path: str
    line: int
    column: int
    field: str
    message: str

    def __str__(self) -> str:
        # A problem with a file as a whole (a local file to upload) has no position.
        where = f"{self.path}:{self.line}:{self.column}" if self.line else self.path
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class UsageError(TcloudError):
    """A command line tcloud refuses before contacting anything (exit 2)."""

    exit_code = EXIT_USAGE


class TaskFileError(TcloudError):
    """A task file that cannot be used; carries every problem found, in file order."""

    exit_code = EXIT_INVALID_TASK

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column))
        super().__init__("\n".join(str(p) for p in self.problems))
