"""Why a halt or resume was asked for, as the job's events show it ("preempted by
tiresias: ..."): checked by the verbs and by the queue tick that asks for them."""

from __future__ import annotations

from tacc_agent.errors import Rejected

MAX_REASON_CHARS = 120


def checked_reason(reason: str | None) -> str | None:
    """One line of printable text, 120 characters at most (None: by the job's owner)."""
    if reason is None:
        return None
    if not reason.strip() or len(reason) > MAX_REASON_CHARS or not reason.isprintable():
        raise Rejected(
            f"--reason: expected one line of printable text, 1 to {MAX_REASON_CHARS} "
            f"characters, got {reason[:40]!r}{'...' if len(reason) > 40 else ''}",
            "reason",
        )
    return reason
