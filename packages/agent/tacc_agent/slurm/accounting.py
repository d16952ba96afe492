"""Slurm's accounting (slurmdbd) as sacct, sacctmgr and sshare print it with
--parsable2: one line a row, "|" between the fields (parsable). The typed readers: jobs'
allocations over a window (usage reports), a job's submit line (its node range), where
ended jobs ran, the caller's jobs since a moment; sacctmgr's and sshare's tables."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime

from tacc_agent.errors import AgentError
from tacc_agent.slurm import run, tres
from tacc_agent.slurm.nodes import NO_NODE_LIST

SACCT = ("sacct", "--noheader", "--parsable2")
SACCTMGR_SHOW = ("sacctmgr", "--noheader", "--parsable2", "show")
SACCT_TIME = "%Y-%m-%dT%H:%M:%S"  # sacct's times with SACCT_ENV
# sacct prints times as SLURM_TIME_FORMAT says; a user's own setting must not change them.
SACCT_ENV = {"SLURM_TIME_FORMAT": "standard"}
WHOLE = re.compile(r"[0-9]+")


def parsable(text: str) -> list[list[str]]:
    """--parsable2 lines, each split at "|"; blank lines left out."""
    return [line.split("|") for line in text.splitlines() if line.strip()]


def named(rows: list[list[str]], columns: tuple[str, ...]) -> list[dict[str, str]]:
    """Rows as {column: value}; a row with fewer values than columns is left out."""
    return [dict(zip(columns, row, strict=False)) for row in rows if len(row) >= len(columns)]


def sacctmgr_show(words: list[str], columns: tuple[str, ...], timeout: float) -> list[list[str]]:
    """`sacctmgr show WORDS format=COLUMNS`' rows."""
    argv = [*SACCTMGR_SHOW, *words, "format=" + ",".join(columns)]
    return parsable(run.output(argv, timeout))


def shares(user: str, columns: tuple[str, ...], timeout: float) -> list[list[str]]:
    """`sshare`'s rows of one user."""
    argv = ["sshare", "--noheader", "--parsable2", "--users", user]
    return parsable(run.output([*argv, "--format=" + ",".join(columns)], timeout))


# --- allocations (usage reports) ------------------------------------------------------------

ALLOCATION_FIELDS = (
    "JobIDRaw",
    "User",
    "Account",
    "Partition",
    "State",
    "Start",
    "End",
    "AllocCPUS",
    "AllocTRES",
)


@dataclass(frozen=True)
class Allocation:
    """One run of one job as sacct reports it (--allocations --duplicates)."""

    job_id: str
    user: str
    account: str
    partition: str
    state: str
    start: datetime
    end: datetime | None  # None: still running
    cpus: int
    gpus: int

    def span(self, since: datetime, until: datetime) -> tuple[datetime, datetime] | None:
        """The part of its run inside [since, until) (a running job: up to until)."""
        start = max(self.start, since)
        end = min(self.end or until, until)
        return (start, end) if start <= end else None


def whole(text: str) -> int:
    return int(text) if WHOLE.fullmatch(text) else 0


def moment(text: str) -> datetime | None:
    """A sacct time; None for Unknown, None or anything else that is not one."""
    try:
        return datetime.strptime(text.strip(), SACCT_TIME)
    except ValueError:
        return None


def parse_allocation(line: str) -> Allocation | None:
    """One sacct line (ALLOCATION_FIELDS, '|' between them); None for a job that never
    started or a line that is not one."""
    values = line.split("|")
    if len(values) != len(ALLOCATION_FIELDS):
        return None
    row = dict(zip(ALLOCATION_FIELDS, values, strict=True))
    start = moment(row["Start"])
    if start is None or not WHOLE.fullmatch(row["JobIDRaw"]):
        return None
    counts = tres.items(row["AllocTRES"])
    cpus = whole(counts.get("cpu", "")) or whole(row["AllocCPUS"])
    return Allocation(
        job_id=row["JobIDRaw"],
        user=row["User"],
        account=row["Account"],
        partition=row["Partition"],
        state=row["State"].split(" ")[0],
        start=start,
        end=moment(row["End"]),
        cpus=cpus,
        gpus=tres.gpus(row["AllocTRES"]) or 0,
    )


def allocations_argv(scope: list[str], since: datetime, until: datetime) -> list[str]:
    """scope: ["--user=UID"] (a researcher's own report) or ["--allusers"] (ops)."""
    return [
        *SACCT,
        "--allocations",
        "--duplicates",
        *scope,
        f"--starttime={since.strftime(SACCT_TIME)}",
        f"--endtime={until.strftime(SACCT_TIME)}",
        "--format=" + ",".join(ALLOCATION_FIELDS),
    ]


def allocations(
    scope: list[str], since: datetime, until: datetime, timeout: float, hint: str = ""
) -> list[Allocation]:
    """Every run in [since, until) of the jobs scope names, in sacct's order; AgentError
    (exit 3, `hint` said) when sacct fails, hangs or is missing."""
    argv = allocations_argv(scope, since, until)
    out = run.output(argv, timeout, env=SACCT_ENV, hint=hint)
    found = (parse_allocation(line) for line in out.splitlines() if line.strip())
    return [allocation for allocation in found if allocation is not None]


# --- submit lines, where jobs ran, the caller's jobs since a moment -----------------------------

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


def submitted_nodes(
    job_id: str, script: str, timeout: float = run.TIMEOUT
) -> tuple[int, int] | None:
    """The node range job_id was submitted with, from Slurm's accounting (SubmitLine:
    what sbatch was given, which no one changes afterwards); None without accounting or
    without one clear range (parse_submitted_nodes). Slurm's job record loses the range
    once the job starts."""
    argv = [*SACCT, "--allocations", f"--jobs={job_id}", "--format=JobID,SubmitLine"]
    try:
        out = run.output(argv, timeout)
    except AgentError:
        return None
    lines = [line.partition("|") for line in out.splitlines()]
    found = {parse_submitted_nodes(line, script) for job, _, line in lines if job == job_id}
    return found.pop() if len(found) == 1 else None


def parse_job_nodes(out: str, job_ids: list[str]) -> dict[str, str]:
    """Where each of job_ids ran, from `--format=JobID,NodeList` lines: the last line
    that names nodes (the latest run); a job that ran nowhere is left out."""
    found = {}
    for line in out.splitlines():
        job_id, _, nodes = line.partition("|")
        if job_id in job_ids and nodes.strip() not in NO_NODE_LIST:
            found[job_id] = nodes.strip()
    return found


def own_job_nodes(job_ids: list[str], timeout: float = run.TIMEOUT) -> dict[str, str]:
    """Where the caller's jobs ran, by job id (one sacct call, the caller's own jobs
    only); AgentError without accounting."""
    argv = [*SACCT, "--allocations", "--format=JobID,NodeList", f"--user={os.getuid()}"]
    return parse_job_nodes(run.output([*argv, "--jobs=" + ",".join(job_ids)], timeout), job_ids)


def parse_job_places(out: str) -> list[tuple[str, str, str]]:
    """(job id, work directory, comment) of `--format=JobID,WorkDir,Comment` lines; the
    comment last (free text its owner wrote, which keeps any "|")."""
    places = []
    for line in out.splitlines():
        job_id, _, rest = line.partition("|")
        workdir, _, comment = rest.partition("|")
        places.append((job_id, workdir, comment))
    return places


def own_jobs_since(start: str, timeout: float = run.TIMEOUT) -> list[tuple[str, str, str]]:
    """(job id, work directory, comment) of the caller's jobs since `start` (sacct's
    time: YYYY-MM-DDTHH:MM:SS); [] when accounting does not answer them."""
    argv = [*SACCT, "--allocations", f"--user={os.getuid()}", f"--starttime={start}"]
    return parse_job_places(run.output([*argv, "--format=JobID,WorkDir,Comment"], timeout, False))


# --- associations (tacc_agent/accounts: accounts that follow the directory) ----------------

ASSOCIATION_FIELDS = ("Account", "User", "Fairshare", "QOS", "DefaultQOS", "MaxSubmit")


@dataclass(frozen=True)
class Association:
    """One association of an account: the account's own (user "") or a user's."""

    account: str
    user: str
    fairshare: str
    qos: frozenset[str]
    default_qos: str
    max_submit: str  # "" none; "0": no new jobs


def parse_associations(text: str) -> list[Association]:
    """`associations`' rows (ASSOCIATION_FIELDS, --parsable2); a row of another shape is
    an error: an association not read would be one the sync adds again, or never ends."""
    found = []
    for row in parsable(text):
        if len(row) != len(ASSOCIATION_FIELDS):
            raise AgentError(f"sacctmgr: an association's line not understood: {'|'.join(row)!r}")
        account, user, fairshare, qos, default_qos, max_submit = row
        names = frozenset(name for name in qos.split(",") if name)
        found.append(Association(account, user, fairshare, names, default_qos, max_submit))
    return found


def associations(cluster: str, of: str, names: list[str], timeout: float) -> list[Association]:
    """The associations on `cluster` of `names`, which are `of` "accounts" (theirs and
    their users') or "users" (theirs, whatever the account)."""
    if not names:
        return []
    where = ["assoc", "where", f"cluster={cluster}", f"{of}={','.join(names)}"]
    argv = [*SACCTMGR_SHOW, *where, "format=" + ",".join(ASSOCIATION_FIELDS)]
    return parse_associations(run.output(argv, timeout))


def default_accounts(users: list[str], timeout: float) -> dict[str, str]:
    """The default account of each of `users` that Slurm knows."""
    if not users:
        return {}
    where = ["user", "where", f"names={','.join(users)}"]
    rows = sacctmgr_show(where, ("User", "DefaultAccount"), timeout)
    return {row[0]: row[1] for row in rows if len(row) == 2}
