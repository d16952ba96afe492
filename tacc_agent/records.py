"""The job record in the job directory, readable by tcloud through `tacc-agent job`:

status/events/<ns>-<STATE>.json   one file per state change (create-only, so writers
                                  on different nodes never clobber each other on NFS)
status/rank-<r>.json              each rank's host, state, exit code, signal
status/submit.json                the sbatch argv and the Slurm job id
logs/job.log                      the batch step's own lines (environment, setup)
logs/rank-<r>-<host>.log          every line a rank printed
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

STATES = ("QUEUED", "PROVISIONING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "HALTED")
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def write_json(path: Path, data: dict, mode: int | None = None) -> None:
    """Atomic replace (readers on other nodes never see half a file). `mode` overrides
    the agent's umask 077 for a file other users must read."""
    temporary = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}")
    temporary.write_text(json.dumps(data, sort_keys=True))
    if mode is not None:
        temporary.chmod(mode)
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def add_event(job_dir: Path, state: str, **detail: object) -> None:
    if state not in STATES:
        raise ValueError(f"unknown job state {state!r}")
    events = job_dir / "status" / "events"
    events.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = time.time_ns()
    record = {"state": state, "time": now / 1e9, "host": socket.gethostname(), **detail}
    write_json(events / f"{now:020d}-{state}.json", record)


def history(job_dir: Path) -> list[dict]:
    events = job_dir / "status" / "events"
    names = sorted(p.name for p in events.glob("*.json")) if events.is_dir() else []
    return [e for e in (read_json(events / n) for n in names) if e]


def current(entries: list[dict]) -> dict | None:
    """The event that says where the job is: within the latest run (from its last
    PROVISIONING on), the first final event wins, so a final state never changes;
    otherwise the last event."""
    starts = [i for i, e in enumerate(entries) if e["state"] == "PROVISIONING"]
    run = entries[starts[-1] :] if starts else entries
    final = next((e for e in run if e["state"] in TERMINAL), None)
    return final or (entries[-1] if entries else None)


def last_state(job_dir: Path) -> str | None:
    event = current(history(job_dir))
    return event["state"] if event else None


def rank_path(job_dir: Path, rank: int) -> Path:
    return job_dir / "status" / f"rank-{rank}.json"


def write_rank(job_dir: Path, rank: int, **state: object) -> dict:
    path = rank_path(job_dir, rank)
    record = {**(read_json(path) or {}), **state, "rank": rank, "updated": time.time()}
    write_json(path, record)
    return record


def ranks(job_dir: Path) -> list[dict]:
    found = [read_json(p) for p in (job_dir / "status").glob("rank-*.json")]
    return sorted((r for r in found if r), key=lambda r: r["rank"])


def clear_ranks(job_dir: Path) -> None:
    """A requeued run starts with no rank records of the previous one."""
    for path in (job_dir / "status").glob("rank-*.json"):
        path.unlink(missing_ok=True)
    (job_dir / "status" / "transport.json").unlink(missing_ok=True)


def rank_logs(job_dir: Path) -> list[tuple[int, str, Path]]:
    """(rank, host, path) of every rank log, in rank order."""
    found = []
    for path in (job_dir / "logs").glob("rank-*.log"):
        _, rank, host = path.stem.split("-", 2)
        found.append((int(rank), host, path))
    return sorted(found)


def tail_lines(path: Path, count: int) -> list[str]:
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read()
    except OSError:
        return []
    return data.decode(errors="replace").splitlines()[-count:]
