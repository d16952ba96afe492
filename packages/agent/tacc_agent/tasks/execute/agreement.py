"""One answer for all of a job's ranks (`Launch.agree`): every rank writes its facts
into its status record (status/rank-<r>.json); rank 0 waits until every rank has, lets
the plug-in decide from them, and writes the answer to status/agreed/<topic>.json;
the other ranks wait for that file. So all ranks agree, even if a rank's facts came
late. A rank that never sees the answer gets None (the plug-in falls back). A topic is
agreed once per run: a second `agree` on it (the same plug-in twice, or two plug-ins
choosing one topic) is refused, since ranks other than 0 would read the first answer."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

from tacc_agent.errors import AgentError
from tacc_agent.tasks.jobs import records
from tacc_contract.plugins import Decide

TOPIC = re.compile(r"[a-z][a-z0-9_]{0,63}")
# Rank 0 may wait the whole rendezvous timeout; the others wait this much longer.
ANSWER_GRACE_SECONDS = 10
# Polls of status/ start 10 ms apart (ranks started by one srun arrive within moments of
# each other) and back off to 100 ms, so a long wait reads the shared directory no more
# often than before.
FIRST_POLL_SECONDS = 0.01
LAST_POLL_SECONDS = 0.1


def poll_intervals() -> Iterator[float]:
    """10, 20, 40, 80 ms, then 100 ms for ever."""
    interval = FIRST_POLL_SECONDS
    while True:
        yield interval
        interval = min(interval * 2, LAST_POLL_SECONDS)


def rendezvous(job_dir: Path, count: int, timeout: float) -> list[dict]:
    """Every rank's status record, once all `count` ranks have written their facts (or
    the timeout passed: those that have)."""
    deadline = time.monotonic() + timeout
    intervals = poll_intervals()
    while True:
        found = [r for r in records.ranks(job_dir) if "rdma" in r]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(next(intervals))


class Agreement:
    """`agree(topic, decide)` for one rank of a job of `count` ranks."""

    def __init__(
        self,
        job_dir: Path,
        rank: int,
        count: int,
        timeout: float,
        grace: float = ANSWER_GRACE_SECONDS,
    ) -> None:
        self.job_dir, self.rank, self.count = job_dir, rank, count
        self.timeout, self.grace = timeout, grace
        self.used: set[str] = set()

    def path(self, topic: str) -> Path:
        if not TOPIC.fullmatch(topic):
            raise AgentError(f"agreement topic {topic!r}: expected a plug-in name (a-z0-9_)")
        return self.job_dir / "status" / "agreed" / f"{topic}.json"

    def __call__(self, topic: str, decide: Decide) -> dict | None:
        path = self.path(topic)
        if topic in self.used:
            raise AgentError(
                f"agreement topic {topic!r} is agreed once per run; a second agree() on it "
                "needs a topic of its own"
            )
        self.used.add(topic)
        if self.rank == 0:
            decided = decide(rendezvous(self.job_dir, self.count, self.timeout))
            if not isinstance(decided, dict):
                raise AgentError(
                    f"agreement topic {topic!r}: the decision must be a mapping, "
                    f"not {type(decided).__name__}"
                )
            path.parent.mkdir(mode=0o700, exist_ok=True)
            records.write_json(path, decided)
            return decided
        deadline = time.monotonic() + self.timeout + self.grace
        intervals = poll_intervals()
        while time.monotonic() < deadline:
            decided = records.read_json(path)
            if isinstance(decided, dict) and decided:
                return decided
            time.sleep(next(intervals))
        return None
