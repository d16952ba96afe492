"""What every check returns, and the bounded subprocess and state files they share."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from tacc_contract import jsonfiles

OK, FAIL, ABSENT, STUCK = "ok", "fail", "absent", "stuck"
STATUSES = (OK, FAIL, ABSENT, STUCK)


class Sample(NamedTuple):
    """One figure for /metrics: name (without the tacc_agent_ prefix), labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Result:
    check: str
    status: str  # ok | fail | absent (no such hardware/software here) | stuck
    detail: str = ""
    seconds: float = 0.0
    samples: list[Sample] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.status in (FAIL, STUCK)


def timed(name: str, run: Callable[[], Result]) -> Result:
    """Run a check; an unexpected error is a failure of that check, never a crash."""
    start = time.monotonic()
    try:
        result = run()
    except Exception as exc:  # a check must never take the agent down
        result = Result(name, FAIL, f"check crashed: {type(exc).__name__}: {exc}")
    result.seconds = round(time.monotonic() - start, 4)
    return result


@dataclass(frozen=True)
class Output:
    code: int | None  # None: not found or timed out
    stdout: str
    problem: str = ""


def command(argv: list[str], timeout: float) -> Output:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return Output(None, "", f"{argv[0]} not found")
    except subprocess.TimeoutExpired:
        return Output(None, "", f"{argv[0]} did not answer within {timeout:g} s")
    return Output(proc.returncode, proc.stdout, proc.stderr.strip())


def read_state(path: Path) -> dict:
    """A state file (RDMA counters, Xids, a stuck probe), {} when missing or unreadable."""
    data = jsonfiles.read_json(path)
    return data if isinstance(data, dict) else {}


def write_state(path: Path, data: dict, mode: int | None = None) -> None:
    """Atomically: `check` (HealthCheckProgram) and `serve` share the state dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    jsonfiles.write_json(path, data, mode)
