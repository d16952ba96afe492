"""The agent protocol's framing: how tcloud asks (`tacc-agent <verb> ...` over SSH, JSON
on stdin for `store` and `job check`) and what the agent answers (one JSON value on
stdout). The verbs themselves, their fields and answer types, are declared once in
tacc_contract.verbs; `job logs`, `job attach`, `job connect` and `job stop-on-disconnect`
stream instead: each keeps its own exec channel (an interactive command's stdin, PTY and
exit status are its own).

tcloud asks every verb of one SSH connection through one `tacc-agent session`: the agent
writes its hello answer as the first line, then answers each request line
(session_request) with one line {"rc": exit code, "answer": what the verb would print}
(SESSION_ANSWER); `job logs` streams text and keeps its own `tacc-agent` exec.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tacc_contract import answers, verbs
from tacc_contract.errors import ERROR_KEY
from tacc_contract.shapes import NULL, ListOf, Shape, shape_of
from tacc_contract.wire import AGENT, PROTOCOL_VERSION, BadArgument, ProtocolError

__all__ = ["AGENT", "PROTOCOL_VERSION", "BadArgument", "ProtocolError"]

BLOB_NAME = re.compile(r"[0-9a-f]{64}-[0-7]{3,4}")  # a file's content and mode in the store


def command(words: Sequence[str], userdir: str | None = None) -> list[str]:
    """The whole command line: `tacc-agent [--userdir DIR] VERB ...` (--userdir=DIR for
    a directory that starts with a dash, so it is never read as an option)."""
    if not userdir:
        return [AGENT, *words]
    option = [f"--userdir={userdir}"] if userdir.startswith("-") else ["--userdir", userdir]
    return [AGENT, *option, *words]


# --- the store's requests (stdin of `tacc-agent store`) ---------------------------------


def blob_name(sha256: str, mode: int) -> str:
    """A file's name in the store: its content and its mode (0o644 or 0o755)."""
    return f"{sha256}-{mode:o}"


def missing_request(blobs: Sequence[str], check: Mapping | None = None) -> dict:
    """Which of these blobs does the store lack? With check (an instruction document),
    the cluster first refuses a task it can never run."""
    request: dict = {"op": "missing", "blobs": sorted(blobs)}
    if check is not None:
        request["check"] = dict(check)
    return request


def commit_request(
    blobs: Sequence[str],
    manifest: Mapping[str, str],
    uploads: Mapping[str, str],
    digest: str,
    files: Mapping[str, str],
    submit: bool = False,
) -> dict:
    """Verify the uploaded blobs and build the job directory; with submit, sbatch it."""
    return {
        "op": "commit",
        "blobs": list(blobs),
        "manifest": dict(manifest),
        "uploads": dict(uploads),
        "submit": submit,
        "digest": digest,
        "files": dict(files),
    }


STORE_ANSWERS = {
    "missing": shape_of(answers.StoreMissing, "store"),
    "commit": shape_of(answers.StoreCommit, "store"),
}


def store_answer(request: Mapping, answer: object) -> dict:
    shape = STORE_ANSWERS.get(str(request.get("op")))
    if shape is None:
        raise BadArgument(f"store: unknown op {request.get('op')!r} (expected missing or commit)")
    return shape.check(answer, f"store ({request['op']})", "")


# --- the session's requests (one JSON line each) -----------------------------------------

TEXT_OR_NULL = (str, NULL)
JSON_VALUE = (dict, list, str, int, float, bool, NULL)
SESSION_REQUEST = Shape("session", {"verb": ListOf(str)}, {"stdin": TEXT_OR_NULL})
SESSION_ANSWER = Shape("session", {"rc": int, "answer": JSON_VALUE})
ERROR = Shape("error", {ERROR_KEY: str}, {"field": str, "kind": str})


def session_request(words: Sequence[str], userdir: str | None = None, stdin: bytes = b"") -> dict:
    """One request line of `tacc-agent session`: the words after `tacc-agent` (as
    Verb.request builds them) and the verb's stdin as text (bytes that are not UTF-8
    travel as surrogate escapes, so they arrive unchanged), null when there is none."""
    text = stdin.decode("utf-8", "surrogateescape") if stdin else None
    return {"verb": command(words, userdir)[1:], "stdin": text}


def session_stdin(request: Mapping) -> bytes:
    """The bytes a session request carries for its verb's stdin."""
    text = request.get("stdin")
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else b""


# --- answers both sides build -----------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """What `hello` answers: the protocol the agent speaks and its own version."""

    protocol: int
    agent_version: str

    @classmethod
    def parse(cls, answer: object) -> Hello:
        checked = verbs.HELLO.check_answer(answer)
        return cls(checked["protocol"], checked["agent_version"])

    def answer(self) -> answers.HelloAnswer:
        return {"protocol": self.protocol, "agent_version": self.agent_version}


def hello_answer(agent_version: str) -> answers.HelloAnswer:
    return Hello(PROTOCOL_VERSION, agent_version).answer()


def error_message(answer: object) -> str | None:
    """The message of an error answer; None when answer is not one."""
    if isinstance(answer, dict) and isinstance(answer.get(ERROR_KEY), str):
        return answer[ERROR_KEY]
    return None
