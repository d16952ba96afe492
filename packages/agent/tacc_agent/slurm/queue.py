"""Slurm's queue as squeue prints it, one reader per output shape the agent asks for:

- `--Format=NAME:0|,...` (format_option): every field whole and ended by "|", the last
  one free text that keeps any "|" of its own: the queue tick's jobs (parse_queue) and
  the running jobs that count against Slurm's limits (parse_running);
- `-o "START %i %u %l %N %V %S %f %j"`: the tick's details, the job's name last
  (parse_details);
- `--format=%i|%T|%r|%M|%N|%Z|%k`: the caller's own jobs (parse_own);
- `--format=%F|%k`: the caller's jobs by tag (parse_tags);
- `--format=%i|%r`: pending jobs' reasons (parse_reasons);
- `-o "%P %T"`: jobs per partition and state (parse_partition_states);
- `--format=%U`: the uids of the jobs on a node (parse_uids);
- `--format=%u|%a|%T`: whose jobs wait or run, in which account (parse_owners).
"""

from __future__ import annotations

import functools
import re
import secrets
from collections import Counter
from typing import NamedTuple

from tacc_agent.errors import AgentError
from tacc_agent.hostlist import expand_hostlist
from tacc_agent.slurm import run, tres
from tacc_agent.slurm.times import elapsed_seconds, epoch_seconds
from tacc_contract.plugins import QueuedJob


def format_option(fields: tuple[str, ...]) -> str:
    """squeue's --Format for these fields, each printed whole (size 0) and ended by "|"."""
    return "--Format=" + ",".join(f"{name}:0|" for name in fields)


def format_fields(line: str, count: int) -> list[str]:
    """The fields of one line of `squeue --Format` (format_option) with `count` fields:
    each ended by "|"; the last keeps any "|" of its own (free text). Fewer when the
    line has fewer."""
    line = line.strip()
    line = line[:-1] if line.endswith("|") else line
    return [part.strip() for part in line.split("|", count - 1)]


# --- the queue tick's jobs ---------------------------------------------------------------

# A job's GPUs are spelled in one of four places: tres-alloc (what a running job holds,
# gres/gpu=N when Slurm accounts gres/gpu; what it asks for while pending), tres-per-job
# (--gpus), tres-per-node (--gres=gpu:N, --gpus-per-node) and tres-per-task
# (--gpus-per-task). Reason comes last: it is Slurm's reason word ("Resources") or, when
# Slurm has one, the job's state description, free text that may hold a "|".
QUEUE_FIELDS = (
    "JobArrayID",
    "UserName",
    "State",
    "Nice",
    "NumNodes",
    "NumTasks",
    "tres-alloc",
    "tres-per-job",
    "tres-per-node",
    "tres-per-task",
    "TimeUsed",
    "Partition",
    "Reason",
)
QUEUE_REQUIRED = 11  # fields up to TimeUsed: a line without the later ones still counts
QUEUE_FORMAT = format_option(QUEUE_FIELDS)


def parse_queue(text: str) -> list[QueuedJob]:
    """The queue tick's jobs (QUEUE_FORMAT lines); a line that is not one is skipped."""
    jobs = []
    for line in text.splitlines():
        parts = format_fields(line, len(QUEUE_FIELDS))
        if len(parts) < QUEUE_REQUIRED or not parts[4].isdigit():
            continue
        parts += [""] * (len(QUEUE_FIELDS) - len(parts))
        (
            job_id,
            user,
            state,
            nice,
            nodes,
            tasks,
            alloc,
            per_job,
            per_node,
            per_task,
            elapsed,
            partition,
            reason,
        ) = parts
        count = int(nodes)
        gpus = tres.job_gpus(
            alloc, per_job, per_node, per_task, count, int(tasks) if tasks.isdigit() else count
        )
        jobs.append(
            QueuedJob(
                job_id,
                user,
                state,
                int(nice) if nice.lstrip("-").isdigit() else 0,
                gpus,
                elapsed_seconds(elapsed),
                nodes=count,
                partition=partition,
                reason="" if reason == "None" else reason,
            )
        )
    return jobs


def queued_jobs(timeout: float = run.TIMEOUT, user: str = "") -> list[QueuedJob]:
    """Pending and running jobs (array tasks one by one), everybody's or `user`'s."""
    who = [f"--user={user}"] if user else []
    argv = ["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", *who, QUEUE_FORMAT]
    return parse_queue(run.output(argv, timeout))


# --- the queue tick's details -------------------------------------------------------------

# A second read, for what a constraint ("a100|h100") or a name would cut apart in the
# first: words split by a space (none of the first seven holds one), the name last (free
# text its owner wrote, which may hold line breaks). Each record starts with a word
# chosen afresh for each read, so no name can start a record of its own: a line without
# it continues the name before it. %V: submit time, %S: start time (a pending job's
# begin time while it waits for it), both read as epoch seconds (run.EPOCH_TIMES).
DETAILS = "%i %u %l %N %V %S %f %j"
# One job, one array task or one part of a heterogeneous job ("12", "12_3", "12+1"; not
# "12_[3-9]"), as %i prints them.
DETAIL_JOB = re.compile(r"\d+(?:_\d+|\+\d+)?")
DETAIL_USER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.$-]*")
DETAIL_NODES = re.compile(r"[A-Za-z0-9_.,\[\]-]*")
DETAIL_TIME = re.compile(r"[0-9]+|N/A|Unknown|None")


class Details(NamedTuple):
    user: str
    name: str
    features: str
    limit: int  # seconds
    nodes: tuple[str, ...]
    submit_time: float  # epoch seconds, 0 when not known
    start_time: float


@functools.lru_cache(maxsize=4096)  # pending jobs' "" and a few busy node lists, mostly
def node_names(nodelist: str) -> tuple[str, ...]:
    return tuple(expand_hostlist(nodelist))


def parse_details(text: str, start: str) -> dict[str, Details]:
    """job -> its Details from squeue -o "START DETAILS": a line starting with START
    begins a record, any other line goes on the name before it. A record whose fields
    are not what Slurm prints is left out."""
    records: list[list[str]] = []
    for line in text.split("\n"):
        if line.startswith(start + " "):
            records.append(line[len(start) + 1 :].split(" ", 7))
        elif records:
            records[-1][-1] += "\n" + line
    found: dict[str, Details] = {}
    for parts in records:
        if len(parts) < 8:
            continue
        job_id, user, limit, nodelist, submitted, starts, features, name = parts
        if not (
            DETAIL_JOB.fullmatch(job_id)
            and DETAIL_USER.fullmatch(user)
            and DETAIL_NODES.fullmatch(nodelist)
            and DETAIL_TIME.fullmatch(submitted)
            and DETAIL_TIME.fullmatch(starts)
        ):
            continue
        found[job_id] = Details(
            user,
            name.rstrip("\n"),
            "" if features == "(null)" else features,
            elapsed_seconds(limit),
            node_names(nodelist),
            epoch_seconds(submitted),
            epoch_seconds(starts),
        )
    return found


def queue_details(timeout: float = run.TIMEOUT) -> dict[str, Details]:
    """Each pending and running job's name, constraint, time limit, nodes and times."""
    start = secrets.token_hex(8)
    argv = ["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", "-o"]
    out = run.output([*argv, f"{start} {DETAILS}"], timeout, env=run.EPOCH_TIMES)
    return parse_details(out, start)


# --- running jobs, for Slurm's limits -------------------------------------------------------


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
        fields = format_fields(line, len(RUNNING_FIELDS))
        understood = line.strip().endswith("|") and len(fields) == len(RUNNING_PATTERNS)
        if not understood or not all(map(re.Pattern.fullmatch, RUNNING_PATTERNS, fields)):
            raise AgentError(f"squeue: a running job's line not understood: {line[:200]!r}")
        jobs.append(RunningJob(*fields))
    return jobs


def running_jobs(timeout: float = run.TIMEOUT) -> list[RunningJob]:
    """Every running (or suspended: it keeps its nodes) job of every user, array tasks
    one by one, from one squeue call (as root: every partition's)."""
    states = "--states=RUNNING,SUSPENDED"
    argv = ["squeue", "--noheader", "--all", "--array", states, format_option(RUNNING_FIELDS)]
    return parse_running(run.output(argv, timeout))


# --- the caller's own jobs ----------------------------------------------------------------

# The comment last, as the only column a user writes freely.
OWN_FORMAT = "--format=%i|%T|%r|%M|%N|%Z|%k"
OWN_KEYS = ("JobState", "Reason", "RunTime", "NodeList", "WorkDir", "Comment")


def parse_own(out: str) -> dict[str, dict[str, str]]:
    """OWN_FORMAT lines by job id, each as scontrol's keys (OWN_KEYS)."""
    queue = {}
    for line in out.splitlines():
        if line.count("|") < len(OWN_KEYS):
            continue
        job, *values = line.split("|", len(OWN_KEYS))
        queue[job] = dict(zip(OWN_KEYS, values, strict=True))
    return queue


def own_jobs(
    timeout: float = run.TIMEOUT, job_id: str = "", check: bool = True
) -> dict[str, dict[str, str]]:
    """The caller's jobs in the queue (squeue --me), array tasks one by one ("12_3"):
    every one, or job_id's (an array's tasks)."""
    jobs = [f"--jobs={job_id}"] if job_id else []
    argv = ["squeue", "--me", "--noheader", "--array", *jobs, OWN_FORMAT]
    return parse_own(run.output(argv, timeout, check=check))


def parse_tags(out: str) -> dict[str, str]:
    """{tag: job id} of `--format=%F|%k` lines (%F: the array's id for its tasks)."""
    pairs = (line.split("|", 1) for line in out.splitlines() if "|" in line)
    return {tag.strip(): job_id.strip() for job_id, tag in pairs}


def own_tags(timeout: float = run.TIMEOUT) -> dict[str, str]:
    """{tag (the job's comment): job id} of the caller's jobs still in the queue."""
    argv = ["squeue", "--me", "--noheader", "--format=%F|%k"]
    return parse_tags(run.output(argv, timeout))


# --- a partition's pending jobs, jobs per partition, jobs on a node -------------------------


def parse_reasons(out: str) -> list[str]:
    """The reasons of `--format=%i|%r` lines (Resources, Priority, JobHeldUser, ...)."""
    return [line.partition("|")[2] for line in out.splitlines() if "|" in line]


def pending_reasons(partition: str, timeout: float = run.TIMEOUT) -> list[str]:
    """Why each pending job of the partition waits."""
    argv = ["squeue", "--noheader", f"--partition={partition}", "--states=PENDING"]
    return parse_reasons(run.output([*argv, "--format=%i|%r"], timeout))


STATE_WORDS = ("PENDING", "RUNNING")


def parse_partition_states(text: str) -> Counter[tuple[str, str]]:
    """Jobs per (partition, PENDING or RUNNING) of `-o "%P %T"` lines; a pending job
    that names several partitions ("a,b") counts in each. AgentError for a line that is
    not one."""
    counts: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        words = line.split()
        if len(words) != 2 or words[1] not in STATE_WORDS:
            if line.strip():
                raise AgentError(f"squeue: unexpected line {line[:100]!r}")
            continue
        for partition in filter(None, words[0].split(",")):
            counts[partition, words[1]] += 1
    return counts


def parse_uids(out: str) -> set[int]:
    """The uids of `--format=%U` lines."""
    return {int(word) for word in out.split() if word.isdigit()}


def uids_on_node(node: str, states: str, timeout: float = run.TIMEOUT) -> set[int] | None:
    """The uids of the users with a job in `states` on `node`; None when Slurm did not
    say (it failed, hung or is missing)."""
    argv = ["squeue", "--noheader", f"--nodelist={node}", f"--states={states}", "--format=%U"]
    try:
        return parse_uids(run.output(argv, timeout))
    except AgentError:
        return None


# --- whose jobs wait or run, by account (tacc_agent/accounts) ------------------------------

OWNERS_FORMAT = "--format=%u|%a|%T"
OWNER_LINE = re.compile(r"([^\s|]+)\|([^\s|]*)\|([A-Z_]+)")


def parse_owners(out: str) -> set[tuple[str, str, str]]:
    """(user, account, state) of every line; AgentError naming a line that is not one:
    a job not seen would be an association removed under it."""
    owners = set()
    for line in out.splitlines():
        if not line.strip():
            continue
        match = OWNER_LINE.fullmatch(line.strip())
        if match is None:
            raise AgentError(f"squeue: a job's owner line not understood: {line[:200]!r}")
        owners.add((match.group(1), match.group(2), match.group(3)))
    return owners


def job_owners(timeout: float = run.TIMEOUT) -> set[tuple[str, str, str]]:
    """(user, account, state) of every job not ended (squeue's default states: pending,
    running, completing, ...; as root: every partition's)."""
    argv = ["squeue", "--noheader", "--all", "--array", OWNERS_FORMAT]
    return parse_owners(run.output(argv, timeout))
