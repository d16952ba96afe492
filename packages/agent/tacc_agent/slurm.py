"""Slurm's own commands, each bounded by a timeout, argv only (no shell)."""

from __future__ import annotations

import os
import re
import subprocess
from typing import NamedTuple

from tacc_agent.errors import EXIT_CLUSTER, AgentError

TIMEOUT = 15
# scontrol show node appends who set the reason and when: "... [root@2026-11-22T20:10:00]"
SET_BY = re.compile(r"\s*\[[^\]\s]+@[^\]\s]+\]$")


# Times as epoch seconds (glibc's strftime %s), whatever SLURM_TIME_FORMAT or TZ the
# caller's environment has: no local time to misread across a DST change.
EPOCH_TIMES = {"SLURM_TIME_FORMAT": "%s"}


def slurm(
    argv: list[str], timeout: float = TIMEOUT, check: bool = True, env: dict[str, str] | None = None
) -> str:
    """stdout of a Slurm command (with `env` added to the environment); AgentError when
    it fails, hangs or is missing."""
    try:
        # Free text users write (job names, comments) may hold any byte: never a crash.
        proc = subprocess.run(
            argv,
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=timeout,
            check=False,
            env={**os.environ, **env} if env else None,
        )
    except FileNotFoundError:
        raise AgentError(f"{argv[0]} not found: is this a Slurm node?", EXIT_CLUSTER) from None
    except subprocess.TimeoutExpired:
        raise AgentError(f"{argv[0]} did not answer within {timeout:g} s", EXIT_CLUSTER) from None
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip()
        raise AgentError(f"{argv[0]} failed: {message}", EXIT_CLUSTER)
    return proc.stdout


def elapsed_seconds(text: str) -> int:
    """A run time as Slurm prints it (squeue %M, scontrol RunTime, %l):
    [days-][hours:]minutes:seconds; 0 for UNLIMITED and the like."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(p) for p in rest.split(":") if p.isdigit()]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return (int(days) if days.isdigit() else 0) * 86400 + seconds


def epoch_seconds(text: str) -> float:
    """A time Slurm printed with EPOCH_TIMES ("1795587794") in seconds; 0 for N/A,
    Unknown and the like."""
    text = text.strip()
    return float(text) if ASCII_DIGITS.fullmatch(text) else 0.0  # "²".isdigit() is True


ASCII_DIGITS = re.compile(r"[0-9]+")


KEY = re.compile(r"[A-Z][A-Za-z0-9_:/]*")


def parse_oneliner(line: str) -> dict[str, str]:
    """One `scontrol show ... --oneliner` record (Key=Value words) as a dict. A value may
    hold spaces (Reason=disk swap [root@...], OS=Linux 6.1 #1 SMP): a word that does not
    start a new Key= continues the value before it. A key seen before does not start a
    new one either (scontrol prints each key once): free text written after a key
    (`Comment=x UserId=alice(1001)`) forges nothing. Free text written BEFORE a key can:
    a job's name comes second, before UserId and the rest, so read job records with
    `job_record_of`, which refuses a record that names a key twice."""
    fields: dict[str, str] = {}
    key = ""
    for word in line.split():
        name, sep, value = word.partition("=")
        if sep and KEY.fullmatch(name) and name not in fields:
            key, fields[name] = name, value
        elif key:
            fields[key] += " " + word
    return fields


def repeated_key(line: str) -> str:
    """The first Key= word a one-liner holds twice ("" for none). scontrol prints each
    key of a record once, so a repeat is free text (a job's name, its comment) written to
    look like a field."""
    seen: set[str] = set()
    for word in line.split():
        name, sep, _ = word.partition("=")
        if sep and KEY.fullmatch(name):
            if name in seen:
                return name
            seen.add(name)
    return ""


def job_record_of(line: str) -> dict[str, str] | None:
    """One `scontrol show job --oneliner` record, or None when it cannot be read for sure:
    the job's name comes before UserId, JobState, Restarts, the times and WorkDir, and
    Slurm allows any text in it, so a name such as `x UserId=bob(1002) Restarts=0` would
    be read first. A record that names a key twice is refused whole (the job is read as
    unknown): only its owner can name her job so, and only her own job is then unseen."""
    return None if repeated_key(line) else parse_oneliner(line)


def show_lines(kind: str, name: str = "", timeout: float = TIMEOUT) -> list[str]:
    """`scontrol show KIND [NAME] --oneliner`'s lines; [] when NAME is unknown."""
    argv = ["scontrol", "show", kind, "--oneliner", *([name] if name else [])]
    try:
        out = slurm(argv, timeout)
    except AgentError as exc:
        if "Invalid job id" in str(exc):  # Slurm no longer remembers the job
            return []
        raise
    return [line for line in out.splitlines() if line.strip()]


def show(kind: str, name: str = "", timeout: float = TIMEOUT) -> list[dict[str, str]]:
    """`scontrol show KIND [NAME] --oneliner` records; [] when NAME is unknown."""
    lines = show_lines(kind, name, timeout)
    if kind != "job":
        return [parse_oneliner(line) for line in lines]
    return [record for record in map(job_record_of, lines) if record is not None]


def job_alone(job_id: str, timeout: float = TIMEOUT) -> dict[str, str] | None:
    """One plain job's record, for acting on it as root; None unless scontrol printed
    exactly one line for it. A job's name may hold line breaks, and its owner may rename
    it at any time: a name such as "x UserId=alice(1001) NumNodes=64 ...<newline>JobId=9
    JobName=" makes the first line a whole forged record with no key twice, the real
    fields on a line of their own. A plain job prints one line; an array or a
    heterogeneous job prints several and is never acted on this way."""
    lines = show_lines("job", job_id, timeout)
    return job_record_of(lines[0]) if len(lines) == 1 else None


def hostnames(nodelist: str, timeout: float = TIMEOUT) -> list[str]:
    return slurm(["scontrol", "show", "hostnames", nodelist], timeout).split()


def strip_set_by(reason: str) -> str:
    """A node Reason without scontrol's "[user@time]" suffix."""
    return SET_BY.sub("", reason)


class RunningJob(NamedTuple):
    """One line of `running_jobs`: where a running job counts against Slurm's limits."""

    job_id: str
    user: str
    account: str
    qos: str
    partition: str
    tres: str  # tres-alloc: what it holds (cpu=8,mem=16G,node=2,gres/gpu=4)


# Only fields Slurm writes itself (no job name, comment or other free text a user could
# fill with a line of her own), each printed whole (size 0) and ended by "|".
RUNNING_FIELDS = ("JobArrayID", "UserName", "Account", "QOS", "Partition", "tres-alloc")
RUNNING_FORMAT = ",".join(f"{name}:0|" for name in RUNNING_FIELDS)
RUNNING_PATTERNS = (
    re.compile(r"\d+(?:_\d+)?(?:\+\d+)?"),  # a job, an array task, a heterogeneous job's part
    re.compile(r"[^\s|]+"),  # its owner's name
    re.compile(r"[^\s|]*"),  # account ("" or "(null)" for none)
    re.compile(r"[^\s|]*"),  # QOS
    re.compile(r"[^\s|]+"),  # partition
    re.compile(r"[^\s|]+"),  # TRES
)


def parse_running(text: str) -> list[RunningJob]:
    """`running_jobs`' lines; AgentError naming the first line that is not one: a job
    not read is a job whose use is not counted, so nothing is taken from such output."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        *fields, rest = [part.strip() for part in line.strip().split("|")]
        understood = len(fields) == len(RUNNING_PATTERNS) and not rest
        if not understood or not all(map(re.Pattern.fullmatch, RUNNING_PATTERNS, fields)):
            raise AgentError(f"squeue: a running job's line not understood: {line[:200]!r}")
        jobs.append(RunningJob(*fields))
    return jobs


def running_jobs(timeout: float = TIMEOUT) -> list[RunningJob]:
    """Every running (or suspended: it keeps its nodes) job of every user, array tasks
    one by one, from one squeue call (as root: every partition's)."""
    states = "--states=RUNNING,SUSPENDED"
    argv = ["squeue", "--noheader", "--all", "--array", states, f"--Format={RUNNING_FORMAT}"]
    return parse_running(slurm(argv, timeout))


# `sbatch --nodes=MIN[-MAX]` as Slurm's accounting keeps the submit command line.
NODE_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")


def parse_submitted_nodes(submit_line: str, script: str) -> tuple[int, int] | None:
    """(min, max) of the node range a submit line gave sbatch, when the line has the
    agent's own layout: `sbatch --OPTION=VALUE... SCRIPT`, long options only, the job's
    own script last, exactly one --nodes=MIN[-MAX]. None for anything else, never a
    guess: a short option (-N1, a bundle such as -vN1), a word after the script (an
    argument of the script, not of sbatch), a value with a space, two --nodes words."""
    words = submit_line.split()
    if len(words) < 2 or words[0] != "sbatch" or words[-1] != script:
        return None
    options = words[1:-1]
    if not all(word.startswith("--") for word in options):
        return None
    values = [word.removeprefix("--nodes=") for word in options if word.startswith("--nodes")]
    plain = NODE_RANGE.fullmatch(values[0]) if len(values) == 1 else None
    if plain is None:
        return None
    low, high = plain.groups()
    return int(low), int(high or low)


def submitted_nodes(job_id: str, script: str, timeout: float = TIMEOUT) -> tuple[int, int] | None:
    """The node range job_id was submitted with, from Slurm's accounting (SubmitLine:
    what sbatch was given, which no one changes afterwards); None without accounting or
    without one clear range (parse_submitted_nodes). Slurm's job record loses the range
    once the job starts."""
    argv = ["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}"]
    argv.append("--format=JobID,SubmitLine")
    try:
        out = slurm(argv, timeout)
    except AgentError:
        return None
    lines = [line.partition("|") for line in out.splitlines()]
    found = {parse_submitted_nodes(line, script) for job, _, line in lines if job == job_id}
    return found.pop() if len(found) == 1 else None
