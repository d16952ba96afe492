"""`tacc-agent session`: every verb of one tcloud connection in this one process, so a
command costs one Python start on the login node, not one per verb.

On the exec channel, one JSON object per line (tacc_contract.protocol):
  agent -> tcloud  the hello answer first (the handshake costs no round trip), then one
                   {"rc": exit code, "answer": the verb's JSON or its error object} per request;
  tcloud -> agent  {"verb": [words after `tacc-agent`], "stdin": text or null}; after a
                   `store receive` request, its framed binary stream on the same stdin.
EOF on stdin ends the session (exit 0). A line that is not a request answers an error
(rc 2) and the session goes on; a failed `store receive` ends it after its answer (the
rest of its stream could not be told from the next request).

What runs a request is the caller's (tacc_agent.cli: the same code the one-shot verbs
run); this module only keeps the lines.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import BinaryIO

from tacc_contract import protocol, verbs
from tacc_contract.errors import AGENT_CLUSTER, AGENT_OK, AGENT_REJECTED, error_line
from tacc_contract.wire import ProtocolError

# (words after `tacc-agent`, the request's stdin, the session's reader) -> (rc, answer)
Handler = Callable[[list[str], bytes, BinaryIO], tuple[int, object]]

# What a session imports while it waits for its first request (issue [23]): tcloud's
# connection master keeps spare sessions started, so the modules of the verbs a
# researcher waits on (`job target` before shell, exec and forward; `store` of a submit;
# ps, status, logs) are loaded before they are asked for. cli.py imports each verb's
# modules when it runs; these are only loaded sooner (about 70 ms on a bench login node).
WARM_MODULES = (
    "tacc_agent.tasks.interactive.attach",
    "tacc_agent.tasks.schedule.submit",
    "tacc_agent.tasks.store.delta",
    "tacc_agent.tasks.jobs.verbs",
)


def warm_up(modules: Sequence[str] = WARM_MODULES) -> threading.Thread:
    """Import modules on a thread of their own; a request that needs one meanwhile waits
    for it on Python's import lock, as it would have imported it itself."""

    def load() -> None:
        for name in modules:
            with contextlib.suppress(Exception):  # the verb that needs it says what failed
                importlib.import_module(name)

    thread = threading.Thread(target=load, name="session-warm-up", daemon=True)
    thread.start()
    return thread


def error_answer(rc: int, message: str) -> dict:
    return {"rc": rc, "answer": json.loads(error_line(message, "", rc))}


def read_request(line: bytes) -> tuple[dict | None, str]:
    """(the request, "") or (None, why the line is not one)."""
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
        return None, f"session: a request is one JSON object per line: {exc}"
    try:
        protocol.session_stdin(protocol.SESSION_REQUEST.check(request))
    except ProtocolError as exc:
        return None, f"session: not a request ({exc.problem})"
    except UnicodeEncodeError:  # a lone surrogate: no bytes of any stdin
        return None, "session: not a request (stdin: text that is not UTF-8)"
    return request, ""


def reads_the_stream(words: list[str]) -> bool:
    """Whether a request may have been followed by a stream: any words that could parse
    as `store receive` (`store -- receive` too). When it failed, the rest of the stream
    cannot be told from requests, so the session ends."""
    return all(word in words for word in verbs.STORE_RECEIVE.words)


def write_line(writer: BinaryIO, answer: dict) -> None:
    try:
        line = json.dumps(answer, sort_keys=True)
    except (TypeError, ValueError) as exc:  # a verb answered what JSON cannot carry
        line = json.dumps(error_answer(AGENT_CLUSTER, f"internal error: {exc}"))
    writer.write(line.encode() + b"\n")
    writer.flush()


def serve(hello: dict, handle: Handler, reader: BinaryIO, writer: BinaryIO) -> int:
    """Answer request lines from reader until it ends. reader is the one buffered reader
    of stdin: the request lines and a `store receive` stream come out of the same buffer."""
    write_line(writer, hello)
    while line := reader.readline():
        request, problem = read_request(line)
        if request is None:
            write_line(writer, error_answer(AGENT_REJECTED, problem))
            continue
        words = request["verb"]
        rc, answer = handle(words, protocol.session_stdin(request), reader)
        write_line(writer, {"rc": rc, "answer": answer})
        if rc != AGENT_OK and reads_the_stream(words):
            return rc
    return AGENT_OK


def private_stdio() -> tuple[BinaryIO, BinaryIO]:
    """The session's own copies of stdin and stdout. Descriptor 0 then reads /dev/null
    and 1 writes to stderr: a child process (sbatch) cannot take a request's bytes and a
    stray print cannot break a line. The copies are not inherited (PEP 446)."""
    sys.stdout.flush()
    reader = os.fdopen(os.dup(0), "rb")
    writer = os.fdopen(os.dup(1), "wb")
    nothing = os.open(os.devnull, os.O_RDONLY)
    os.dup2(nothing, 0)
    os.close(nothing)
    os.dup2(2, 1)
    return reader, writer


def serve_stdio(hello: dict, handle: Handler) -> int:
    reader, writer = private_stdio()
    warm_up()
    with reader, writer:
        return serve(hello, handle, reader, writer)
