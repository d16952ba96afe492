"""`tacc-agent job logs`: every node's lines, each prefixed `[host:rank]` (the batch
step's own lines `[job]`), interleaved as they arrive; with follow, until the job ends.
Files on shared storage are polled every 0.1 s, so a printed line shows within ~0.2 s."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

from tacc_agent import records, sweeps

POLL_SECONDS = 0.1
STATE_CHECK_SECONDS = 1.0


class Source:
    def __init__(self, path: Path, prefix: str, tail: int | None) -> None:
        self.path, self.prefix, self.offset, self.pending = path, prefix, 0, b""
        if tail is not None:
            size = path.stat().st_size if path.exists() else 0
            lines = records.tail_lines(path, tail) if tail else []
            self.offset = size - len("\n".join(lines).encode()) - (1 if lines else 0)
            self.offset = max(self.offset, 0)

    def read(self, final: bool) -> list[str]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        self.offset += len(data)
        *complete, self.pending = (self.pending + data).split(b"\n")
        if final and self.pending:
            complete, self.pending = [*complete, self.pending], b""
        return [f"{self.prefix} {raw.decode(errors='replace')}" for raw in complete]


def job_files(job_dir: Path, rank: int | None, label: str = "") -> list[tuple[Path, str]]:
    wanted = [] if rank is not None else [(job_dir / "logs" / "job.log", f"[{label}job]")]
    wanted += [(p, f"[{label}{h}:{r}]") for r, h, p in records.rank_logs(job_dir)
               if rank in (None, r)]  # fmt: skip
    return wanted


def sources(job_dir: Path, known: dict[Path, Source], rank: int | None, tail) -> list[Source]:
    if sweeps.is_sweep(job_dir):  # every trial's files, labelled with the trial
        wanted = [
            f
            for index in sweeps.trial_indexes(job_dir)
            for f in job_files(sweeps.trial_dir(job_dir, index), rank, f"trial {index} ")
        ]
    else:
        wanted = job_files(job_dir, rank)
    for path, prefix in wanted:
        if path not in known:
            known[path] = Source(path, prefix, tail)
    return list(known.values())


def stream(
    job_dir: Path,
    follow: bool,
    tail: int | None,
    rank: int | None,
    ended: Callable[[], bool],
    write=sys.stdout.write,
) -> None:
    known: dict[Path, Source] = {}
    last_check, done = 0.0, False
    while True:
        if follow and time.monotonic() - last_check >= STATE_CHECK_SECONDS:
            done, last_check = ended(), time.monotonic()
        final = done or not follow
        for source in sources(job_dir, known, rank, tail):
            for line in source.read(final):
                write(line + "\n")
        sys.stdout.flush()
        if final:
            return
        time.sleep(POLL_SECONDS)
