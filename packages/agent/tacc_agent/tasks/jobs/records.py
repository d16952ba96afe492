"""The job record in the job directory, readable by tcloud through `tacc-agent job`:

status/events/<n>.json            one file per state change, numbered in the order they
                                  were written: a per-job sequence (add_event), so a
                                  node whose clock is off cannot reorder them; each
                                  event's `time` is for display only
status/events/<ns>-<STATE>.json   the same, written before the sequence: read in time
                                  order, before every numbered event
status/rank-<r>.json              each rank's host, state, exit code, signal
status/submit.json                the sbatch argv and the Slurm job id
status/agreed/<topic>.json        what rank 0 decided for every rank (the transport)
logs/job.log                      the batch step's own lines (environment, setup)
logs/rank-<r>-<host>.log          every line a rank printed
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from pathlib import Path

from tacc_contract.jobs import FINAL_STATES as TERMINAL
from tacc_contract.jobs import JOB_STATES as STATES
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugins import PastJob


def event_order(name: str) -> tuple[int, int, str]:
    """Sort key of an event file: the ones from before the sequence (<ns>-<STATE>.json)
    by their time, then the numbered ones by number."""
    stem = name.removesuffix(".json")
    return (1, int(stem), "") if stem.isdigit() else (0, 0, name)


def next_sequence(events: Path) -> int:
    return max((int(p.stem) for p in events.glob("*.json") if p.stem.isdigit()), default=0) + 1


def add_event(job_dir: Path, state: str, **detail: object) -> None:
    """Record a state change as the job's next event. The writer links its finished draft
    to the next free number (a link fails if the name exists, on NFS too): two writers
    never take one number, and a number taken after another event exists is above it,
    whatever either node's clock says. A stale directory listing only costs retries."""
    if state not in STATES:
        raise ValueError(f"unknown job state {state!r}")
    events = job_dir / "status" / "events"
    events.mkdir(mode=0o700, parents=True, exist_ok=True)
    record = {"state": state, "time": time.time(), "host": socket.gethostname(), **detail}
    draft = events / f".draft.{socket.gethostname()}.{os.getpid()}.{threading.get_ident()}"
    sequence = next_sequence(events)
    try:
        while True:
            draft.write_text(json.dumps(record | {"sequence": sequence}, sort_keys=True))
            try:
                os.link(draft, events / f"{sequence:08d}.json")
                return
            except FileExistsError:  # another writer took this number: the next one
                sequence += 1
    finally:
        draft.unlink(missing_ok=True)


def history(job_dir: Path) -> list[dict]:
    """The job's events in the order they were written."""
    events = job_dir / "status" / "events"
    names = (
        sorted((p.name for p in events.glob("*.json")), key=event_order)
        if (events.is_dir())
        else []
    )
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
    for path in (job_dir / "status" / "agreed").glob("*.json"):
        path.unlink(missing_ok=True)


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


def recent_job_dirs(jobs: Path) -> list[Path]:
    """The job directories in jobs/, newest first. Other submits of the same user rename
    and remove entries while this runs (.building-* trees become jobs/<digest12>-<n>):
    an entry that is gone by the time it is looked at is skipped, never an error."""
    try:
        entries = list(os.scandir(jobs))
    except (FileNotFoundError, NotADirectoryError):
        return []
    dated = []
    for entry in entries:
        if entry.name.startswith("."):  # a tree still being built, not a job
            continue
        with contextlib.suppress(FileNotFoundError):
            dated.append((entry.stat(follow_symlinks=False).st_mtime, Path(entry.path)))
    return [path for _, path in sorted(dated, reverse=True)]


def past_jobs(user_dir: Path, count: int) -> list[PastJob]:
    """The jobs among the user's `count` most recent job directories that were submitted
    (they have status/submit.json), newest first: the history scheduling plug-ins read
    (`Submission.history`)."""
    found = []
    for job_dir in recent_job_dirs(user_dir / "jobs")[:count]:
        submit = read_json(job_dir / "status" / "submit.json")
        if submit:
            found.append(PastJob(job_dir.name, submit, history(job_dir)))
    return found
