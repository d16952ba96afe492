"""What both sides say when something is wrong: the exit codes of `tcloud` and of the
agent's verbs, a problem in a task file (file:line:column: field: what is expected),
and the refusal a plug-in or the agent raises. Never shown as a traceback."""

from __future__ import annotations

import json
from dataclasses import dataclass

# Exit codes of `tcloud` (documented in docs/tcloud.md).
EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug in tcloud: reported in one line, never as a traceback
EXIT_USAGE = 2
EXIT_INVALID_TASK = 3
EXIT_CLUSTER = 4

# The wire's one error numbering: a failed agent verb exits with its kind's number, and
# its error line names the kind. Each side maps a kind to its own exit code in one table:
# the agent exits with these numbers; tcloud's table is tcloud.errors.EXIT_OF_KIND.
ERROR_KINDS = {
    "failed": 1,  # the job or check itself failed
    "rejected": 2,  # bad request: invalid instruction, impossible resources, not your job
    "cluster": 3,  # Slurm or the filesystem did not answer as expected
}
KIND_OF_NUMBER = {number: kind for kind, number in ERROR_KINDS.items()}
AGENT_OK = 0
AGENT_FAILED = ERROR_KINDS["failed"]
AGENT_REJECTED = ERROR_KINDS["rejected"]
AGENT_CLUSTER = ERROR_KINDS["cluster"]

# How a verb reports a failure: one JSON line {"error": "...", "field": "...", "kind":
# "..."} (on stdout); "field" names the task field at fault ("" when none).
ERROR_KEY = "error"


def error_line(message: str, field: str = "", number: int = AGENT_REJECTED) -> str:
    kind = KIND_OF_NUMBER.get(number, "cluster")
    return json.dumps({ERROR_KEY: message, "field": field, "kind": kind})


def kind_of(number: int, answer: object = None) -> str:
    """The kind of a failed verb: its error line's, else its exit number's."""
    if isinstance(answer, dict) and answer.get("kind") in ERROR_KINDS:
        return answer["kind"]
    return KIND_OF_NUMBER.get(number, "cluster")


class TaccError(Exception):
    """An error with a message for the user and the tcloud exit code it maps to."""

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
        # A problem in a build file has a line only (file:line).
        where = self.path
        if self.line:
            where += f":{self.line}:{self.column}" if self.column else f":{self.line}"
        if self.field:
            return f"{where}: {self.field}: {self.message}"
        return f"{where}: {self.message}"


class TaskFileError(TaccError):
    """A task file that cannot be used; carries every problem found, in file order."""

    exit_code = EXIT_INVALID_TASK

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column))
        super().__init__("\n".join(str(p) for p in self.problems))


class AgentError(Exception):
    """What an agent verb answers when it fails: a message and its exit code."""

    def __init__(self, message: str, exit_code: int = AGENT_REJECTED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class Rejected(AgentError):
    """A request the cluster refuses (bad instruction, resources it can never give);
    what a plug-in raises to refuse a task, naming the field when it can."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message, AGENT_REJECTED)
        self.field = field
