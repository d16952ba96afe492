"""`scontrol show KIND --oneliner`: one record a line, Key=Value words, read as dicts.
The typed readers (jobs.py, nodes.py) read their kinds through here."""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Mapping

from tacc_agent.errors import AgentError
from tacc_agent.slurm import run

KEY = re.compile(r"[A-Z][A-Za-z0-9_:/]*")


@functools.lru_cache(maxsize=4096)  # bounded: words before "=" in names are users' text
def is_key(name: str) -> bool:
    """A word's text before "=" has a key's shape (the same few dozen names in every
    record of a kind: looked up, not matched again, for 10,000 records a tick)."""
    return KEY.fullmatch(name) is not None


def read_words(line: str) -> tuple[dict[str, str], str]:
    """One `scontrol show ... --oneliner` record's Key=Value words as a dict, and the
    first key it names twice ("" for none), in one pass. A value may hold spaces
    (Reason=disk swap [root@...], OS=Linux 6.1 #1 SMP): a word that does not start a new
    Key= continues the value before it; a key seen before does not start a new one
    either, it goes on the value before it."""
    fields: dict[str, str] = {}
    key, repeated = "", ""
    for word in line.split():
        name, sep, value = word.partition("=")
        if sep and is_key(name):
            if name not in fields:
                key, fields[name] = name, value
                continue
            repeated = repeated or name
        if key:
            fields[key] += " " + word
    return fields, repeated


def parse_oneliner(line: str) -> dict[str, str]:
    """One `scontrol show ... --oneliner` record (Key=Value words) as a dict (read_words).
    scontrol prints each key once: free text written after a key (`Comment=x
    UserId=alice(1001)`) forges nothing. Free text written BEFORE a key can: a job's name
    comes second, before UserId and the rest, so read job records with `job_record_of`,
    which refuses a record that names a key twice."""
    return read_words(line)[0]


def repeated_key(line: str) -> str:
    """The first Key= word a one-liner holds twice ("" for none). scontrol prints each
    key of a record once, so a repeat is free text (a job's name, its comment) written to
    look like a field."""
    return read_words(line)[1]


def job_record_of(line: str) -> dict[str, str] | None:
    """One `scontrol show job --oneliner` record, or None when it cannot be read for sure:
    the job's name comes before UserId, JobState, Restarts, the times and WorkDir, and
    Slurm allows any text in it, so a name such as `x UserId=bob(1002) Restarts=0` would
    be read first. A record that names a key twice is refused whole (the job is read as
    unknown): only its owner can name her job so, and only her own job is then unseen."""
    fields, repeated = read_words(line)
    return None if repeated else fields


def show_lines(
    kind: str, name: str = "", timeout: float = run.TIMEOUT, env: Mapping[str, str] | None = None
) -> list[str]:
    """`scontrol show KIND [NAME] --oneliner`'s lines; [] when NAME is an unknown job."""
    argv = ["scontrol", "show", kind, "--oneliner", *([name] if name else [])]
    try:
        out = run.output(argv, timeout, env=env)
    except AgentError as exc:
        if "Invalid job id" in str(exc):  # Slurm no longer remembers the job
            return []
        raise
    return [line for line in out.splitlines() if line.strip()]


def job_lines(lines: list[str]) -> list[str]:
    """`scontrol show job --oneliner`'s lines, one a record: Slurm (22.05 and 24.11)
    prints a job's name as it is, so a line break in it starts a line that is no
    record's start (not JobId=...), the rest of the record before it."""
    joined: list[str] = []
    for line in lines:
        if joined and not line.startswith("JobId="):
            joined[-1] += "\n" + line
        else:
            joined.append(line)
    return joined


def show(
    kind: str, name: str = "", timeout: float = run.TIMEOUT, skip: Collection[str] = frozenset()
) -> list[dict[str, str]]:
    """`scontrol show KIND [NAME] --oneliner` records; [] when NAME is unknown. A job
    record is read whole (job_lines); one that names a key twice is left out
    (job_record_of), and so is one whose JobId (its first word: its owner's text comes
    after it) is in `skip`, not even parsed."""
    lines = show_lines(kind, name, timeout)
    if kind != "job":
        return [parse_oneliner(line) for line in lines]
    records = job_lines(lines)
    wanted = (line for line in records if line.split(" ", 1)[0].removeprefix("JobId=") not in skip)
    return [record for record in map(job_record_of, wanted) if record is not None]
