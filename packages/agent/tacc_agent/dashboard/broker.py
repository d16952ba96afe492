"""The dashboard's broker: POST /dashboard on the monitoring host's agent (serve.py, when
the config's dashboard_broker is on), run as root beside the Prometheus it asks on
127.0.0.1. A researcher's dashboard server on a login node asks it for Prometheus figures
(dashboard/broker_client.py); the broker decides whose figures they may be.

The body is a MUNGE credential (at most MOST_BODY_BYTES) made by the asking process; its
payload is one JSON request ({"ask": "job" | "cluster" | "alerts" | "queue", ...},
dashboard/broker_asks.py). munged vouches for the uid that made it and refuses it when
expired, replayed (each credential is good for one request) or forged; the uid's passwd
name is the only user a "job" answer is filtered by, and "cluster", "alerts" and "queue"
answer only a member of dashboard_admin_group (or root). Nothing of the request is
trusted before the credential is.

Answers are JSON: 200 the answer; 400 a request not understood (what is expected); 401
the credential refused (why); 403 an unknown user, or not an admin; 405 not a POST; 413
a body over the limit; 503 munged not answering here. Every refusal is
{"error": "<one line>"}. Once the credential is good, the request's deadline on this
server is moved to ANSWER_DEADLINE_SECONDS (Prometheus and squeue take their time).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable

from tacc_agent.config import AgentConfig
from tacc_agent.dashboard import broker_asks, munge
from tacc_agent.dashboard.broker_asks import BadRequest, who

PATH = "/dashboard"
MOST_BODY_BYTES = 64 << 10
ANSWER_DEADLINE_SECONDS = 15.0
# The WSGI environ key of a callable that moves this request's deadline (serve.py).
EXTEND_DEADLINE = "tacc.extend_deadline"
CREDENTIAL = re.compile(rb"MUNGE:[A-Za-z0-9+/=]+:")
ADMIN_ASKS = {
    "cluster": broker_asks.cluster,
    "alerts": broker_asks.alerts,
    "queue": broker_asks.jobs,
}
ASKS = ("job", *ADMIN_ASKS)


class Refused(Exception):
    """A request the broker does not answer: its HTTP status and one line why."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status


def app(config: AgentConfig) -> Callable[[dict, Callable], Iterable[bytes]]:
    """The WSGI app of POST /dashboard."""

    def answer(environ: dict, start_response: Callable) -> Iterable[bytes]:
        try:
            status, reply = "200 OK", respond(config, environ)
        except Refused as exc:
            status, reply = exc.status, {"error": str(exc)}
        body = json.dumps(reply).encode()
        start_response(
            status,
            [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
        )
        return [body]

    return answer


def respond(config: AgentConfig, environ: dict) -> dict:
    """The answer to one request; Refused when there is none to give."""
    if environ.get("REQUEST_METHOD") != "POST":
        raise Refused("405 Method Not Allowed", f"only POST {PATH}")
    credential = body(environ)
    try:
        decoded = munge.decode(credential)
    except munge.CredentialRefused as exc:
        raise Refused("401 Unauthorized", str(exc)) from None
    except munge.MungeError as exc:
        raise Refused("503 Service Unavailable", f"cannot check credentials here: {exc}") from None
    extend = environ.get(EXTEND_DEADLINE)
    if callable(extend) and not extend(ANSWER_DEADLINE_SECONDS, f"uid:{decoded.uid}"):
        raise Refused(
            "429 Too Many Requests",
            f"uid {decoded.uid} has as many requests in flight here as one caller may; ask again",
        )
    caller = who(decoded.uid, config.dashboard_admin_group)
    if caller is None:
        raise Refused("403 Forbidden", f"uid {decoded.uid} has no account on the monitoring host")
    request = parsed(decoded.payload)
    try:
        if request["ask"] == "job":
            return broker_asks.job_usage(config, caller, request)
        if not caller.admin:
            raise Refused(
                "403 Forbidden",
                f"{caller.name} is not in the group {config.dashboard_admin_group}: "
                f'"{request["ask"]}" is for admins',
            )
        return ADMIN_ASKS[request["ask"]](config)
    except BadRequest as exc:
        raise Refused("400 Bad Request", str(exc)) from None


def body(environ: dict) -> bytes:
    """The request's credential: its whole body, at most MOST_BODY_BYTES."""
    length = str(environ.get("CONTENT_LENGTH") or "").strip()
    if not (length.isascii() and length.isdigit()):
        raise Refused(
            "400 Bad Request", "expected a MUNGE credential as the body, with its Content-Length"
        )
    if int(length) > MOST_BODY_BYTES:
        raise Refused(
            "413 Content Too Large", f"the body is over {MOST_BODY_BYTES} bytes: not a credential"
        )
    credential = environ["wsgi.input"].read(int(length)).strip()
    if not CREDENTIAL.fullmatch(credential):
        raise Refused("401 Unauthorized", "credential refused: invalid (not a MUNGE credential)")
    return credential


def parsed(payload: bytes) -> dict:
    """The credential's payload: a JSON object whose "ask" is one of ASKS."""
    expected = f'expected a JSON object with "ask": {", ".join(ASKS)}'
    try:
        request = json.loads(payload)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        raise Refused("400 Bad Request", f"{expected}; the payload is not JSON") from None
    if not isinstance(request, dict) or request.get("ask") not in ASKS:
        asked = request.get("ask") if isinstance(request, dict) else request
        raise Refused("400 Bad Request", f"{expected}, not {asked!r:.60}")
    return request
