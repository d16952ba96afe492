"""Asking the dashboard's broker (dashboard/broker.py, POST /dashboard on the monitoring
host's agent) one question: the request as JSON in a MUNGE credential made here, so the
broker knows whose question it is; the answer is JSON. The per-user server on a login
node asks through here, as its user."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from tacc_agent.dashboard import munge
from tacc_agent.prometheus import DIRECT

MOST_BYTES = 16 << 20


class BrokerUnavailable(Exception):
    """The broker gave no answer: one line for a human says why. `status` is its HTTP
    status when it refused (401, 403, ...), 0 when it could not be asked at all."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def ask(url: str, request: dict, timeout: float = 10.0) -> dict:
    """The broker's JSON answer to `request` ({"ask": "job", ...}, docs/monitoring.md)."""
    if not url:
        raise BrokerUnavailable("no dashboard broker is set (the agent's dashboard_broker_url)")
    if not url.startswith(("http://", "https://")):
        raise BrokerUnavailable(f"the dashboard broker's address {url!r} is not http://")
    try:
        credential = munge.encode(json.dumps(request).encode())
    except munge.MungeError as exc:
        raise BrokerUnavailable(f"cannot vouch for this request with MUNGE: {exc}") from None
    post = urllib.request.Request(  # noqa: S310 (http or https: checked above)
        url,
        data=credential.encode("ascii"),
        headers={"Content-Type": "text/plain; charset=us-ascii"},
        method="POST",
    )
    where = f"the dashboard broker at {url}"
    try:
        with DIRECT.open(post, timeout=timeout) as answer:
            body = answer.read(MOST_BYTES)
    except urllib.error.HTTPError as exc:
        raise BrokerUnavailable(
            f"{where} refused (HTTP {exc.code}): {error_text(exc.read(MOST_BYTES), exc.reason)}",
            exc.code,
        ) from None
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, bad URL
        raise BrokerUnavailable(f"{where} did not answer: {getattr(exc, 'reason', exc)}") from None
    try:
        reply = json.loads(body)
    except ValueError:
        reply = None
    if not isinstance(reply, dict):
        raise BrokerUnavailable(f"{where} answered something that is not a JSON object")
    return reply


def error_text(body: bytes, fallback: object) -> str:
    """The "error" line of a refusal's JSON body, else `fallback` (HTTP's reason)."""
    try:
        reply = json.loads(body)
    except ValueError:
        reply = None
    error = reply.get("error") if isinstance(reply, dict) else None
    return str(error) if isinstance(error, str) and error else str(fallback)
