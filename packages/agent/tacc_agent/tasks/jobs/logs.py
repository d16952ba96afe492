"""`tacc-agent job logs`: every node's lines, each prefixed `[host:rank]` (the batch
step's own lines `[job]`), interleaved as they arrive; with follow, until the job ends.
Files on shared storage are polled every 0.1 s, so a printed line shows within ~0.2 s.

Memory stays the same whatever a log's size: files are read READ_CHUNK_BYTES at a time
and each line printed as soon as it is complete; a line longer than LONGEST_LINE_BYTES (a
progress bar redrawn with \r for hours) is printed in pieces of that size, each with the
prefix."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tacc_agent.tasks.jobs import records, sweeps

POLL_SECONDS = 0.1
STATE_CHECK_SECONDS = 1.0
READ_CHUNK_BYTES = 1 << 20
LONGEST_LINE_BYTES = 1 << 20
TAIL_WINDOW_BYTES = 64 * 1024  # --tail N looks this far back for the last N lines


def tail_offset(path: Path, count: int) -> int:
    """Where the last `count` lines of `path` start (within its last TAIL_WINDOW_BYTES);
    0 for a file that is not there (yet)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            start = handle.seek(max(0, size - TAIL_WINDOW_BYTES))
            data = handle.read(size - start)
    except OSError:
        return 0
    cut = len(data) - 1 if data.endswith(b"\n") else len(data)  # the last line's own end
    for _ in range(count):
        cut = data.rfind(b"\n", 0, cut)
        if cut < 0:
            return start
    return start + cut + 1 if count else start + len(data)


def utf8_start(data: bytes, at: int) -> int:
    """`at`, moved back (at most 3 bytes) to the first byte of a UTF-8 character, so that
    a line cut there decodes as it would whole."""
    for back in range(4):
        if at - back > 0 and data[at - back] & 0xC0 != 0x80:
            return at - back
    return at


class Source:
    def __init__(self, path: Path, prefix: str, tail: int | None) -> None:
        self.path, self.prefix, self.offset, self.pending = path, prefix, 0, b""
        if tail is not None:
            self.offset = tail_offset(path, tail)

    def line(self, raw: bytes) -> str:
        return f"{self.prefix} {raw.decode(errors='replace')}"

    def read(self, final: bool) -> Iterator[str]:
        """Every line completed since the last read, up to the file's size now (a log
        that keeps growing waits for the next round, so other files get their turn);
        with final, the unfinished last line too."""
        try:
            handle = self.path.open("rb")
        except OSError:
            return
        with handle:
            end = os.fstat(handle.fileno()).st_size
            handle.seek(self.offset)
            while self.offset < end:
                data = handle.read(min(READ_CHUNK_BYTES, end - self.offset))
                if not data:  # truncated meanwhile
                    break
                self.offset += len(data)
                yield from self.complete_lines(data)
        if final and self.pending:
            yield self.line(self.pending)
            self.pending = b""

    def complete_lines(self, data: bytes) -> Iterator[str]:
        *complete, self.pending = (self.pending + data).split(b"\n")
        for raw in complete:
            yield self.line(raw)
        while len(self.pending) > LONGEST_LINE_BYTES:
            cut = utf8_start(self.pending, LONGEST_LINE_BYTES)
            piece, self.pending = self.pending[:cut], self.pending[cut:]
            yield self.line(piece)


def job_files(job_dir: Path, rank: int | None, label: str = "") -> list[tuple[Path, str]]:
    wanted = [] if rank is not None else [(job_dir / "logs" / "job.log", f"[{label}job]")]
    wanted += [
        (p, f"[{label}{h}:{r}]") for r, h, p in records.rank_logs(job_dir) if rank in (None, r)
    ]
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
