"""Where a tcloud command's time goes, for the bench (bench/task_workflow.py): with the
environment variable TCLOUD_TIMING set to a file, each step appends one JSON line
{"step": name, "start": time.time(), "end": time.time()} (also when the step fails).
Steps: "connect" (SSH, with its ProxyJump), "session" (the agent's start and its hello),
each agent verb by its words ("job status", "store"), and the upload's own steps."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

ENVIRONMENT = "TCLOUD_TIMING"


def record(name: str, start: float, end: float) -> None:
    """Append one step to the TCLOUD_TIMING file; nothing when it is not set."""
    path = os.environ.get(ENVIRONMENT)
    if not path:
        return
    line = json.dumps({"step": name, "start": start, "end": end}) + "\n"
    # A file that cannot be written loses the bench its numbers, never the command its
    # result (or its own error).
    with contextlib.suppress(OSError), open(path, "a", encoding="utf-8") as out:
        out.write(line)  # one write: lines of processes interleave whole


@contextmanager
def step(name: str) -> Iterator[None]:
    """Time the block as one step (recorded only when TCLOUD_TIMING is set)."""
    start = time.time()
    try:
        yield
    finally:
        record(name, start, time.time())
