"""Jobs as `scontrol show job` prints them: one job's record, every job's, a job read
alone (for acting on it as root), the fields read from a record (NumNodes, Partition,
QOS, Account, its TRES), and the node groups of its detailed record (-d)."""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

from tacc_agent.errors import AgentError
from tacc_agent.slurm import oneliner, queue, run

# One node group of `scontrol show job -d --oneliner`: its hosts, CPU ids and GRES.
NODE_GROUP = re.compile(r"(?:^|\s)Nodes=(\S+) CPU_IDs=(\S+) Mem=\d+ GRES=(\S*)")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # a user, QOS, account or partition
WAITING_STATES = ("PENDING", "REQUEUE_HOLD")  # a held requeued job may show either
NICE_BATCH = 500  # job ids per `scontrol update JobId=a,b,... Nice=N`: ~5 KiB of argv
NICE_SECONDS_PER_JOB = 0.05  # more time per update in one call (0.74 ms each measured)


def job_record(job_id: str, timeout: float = run.TIMEOUT) -> dict[str, str] | None:
    """Slurm's record of job_id (the first one scontrol prints; an array job's first
    task); None when Slurm does not know it."""
    found = oneliner.show("job", job_id, timeout)
    return found[0] if found else None


def job_records(
    timeout: float = run.TIMEOUT, skip: Collection[str] = frozenset()
) -> list[dict[str, str]]:
    """Every job Slurm knows, from one `scontrol show job`; records that name a key twice
    are left out (oneliner.job_record_of), and so are those whose JobId, the first word
    of a record (its owner's text comes after it), is in `skip`: not parsed at all (at
    10,000 jobs the parse was most of a queue tick)."""
    return oneliner.show("job", "", timeout, skip)


def job_alone(
    job_id: str, timeout: float = run.TIMEOUT, env: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """One plain job's record, for acting on it as root; None unless scontrol printed
    exactly one line for it. A job's name may hold line breaks, and its owner may rename
    it at any time: a name such as "x UserId=alice(1001) NumNodes=64 ...<newline>JobId=9
    JobName=" makes the first line a whole forged record with no key twice, the real
    fields on a line of their own. A plain job prints one line; an array or a
    heterogeneous job prints several and is never acted on this way."""
    lines = oneliner.show_lines("job", job_id, timeout, env)
    return oneliner.job_record_of(lines[0]) if len(lines) == 1 else None


def set_nice(job_ids: Sequence[str], nice: int, timeout: float = run.TIMEOUT) -> list[str]:
    """Give every one of job_ids this nice: one `scontrol update JobId=a,b,... Nice=N` per
    NICE_BATCH of them (scontrol updates the rest of a list when one job has ended, and
    names that one; it refuses a whole list with an id it cannot read, so only ids of
    squeue's shape go in one). Each call's timeout grows with its jobs (one update each,
    one after another). What scontrol said about the jobs it did not update; [] when none."""
    wanted: list[str] = []
    problems: list[str] = []
    for job_id in job_ids:
        if queue.DETAIL_JOB.fullmatch(job_id):
            wanted.append(job_id)
        else:
            problems.append(f"not a job id: {job_id[:40]!r}")
    for start in range(0, len(wanted), NICE_BATCH):
        batch = wanted[start : start + NICE_BATCH]
        argv = ["scontrol", "update", "JobId=" + ",".join(batch), f"Nice={nice}"]
        try:
            done = run.command(argv, timeout + NICE_SECONDS_PER_JOB * len(batch))
        except AgentError as exc:  # no answer: the next tick sets them again
            problems.append(str(exc))
            continue
        if done.code != 0:
            problems.append(str(run.failure(argv, done)))
    return problems


def node_counts(num_nodes: str, state: str) -> tuple[int, int]:
    """(nodes, max_nodes) of a record's NumNodes: "2-4" (a pending job's range), "2" (a
    pending job's one size, or what a running job holds: no maximum shown)."""
    low, _, high = num_nodes.partition("-")
    if not low.isdigit():
        return 0, 0
    if high.isdigit():
        return int(low), int(high)
    return int(low), int(low) if state in WAITING_STATES else 0


def known(name: str) -> str:
    """A record's QOS, Account or Partition as Slurm printed it; "" for none ((null))."""
    return name if NAME.fullmatch(name) else ""


NEW_TRES_KEYS = ("ReqTRES", "AllocTRES")  # Slurm 23.02 and later; 22.05 prints TRES=


def tres_of(record: Mapping[str, str]) -> str:
    """What the job holds (running) or asks for (pending), as a TRES string; "" when the
    record does not read as one Slurm prints it. Slurm 22.05 prints `TRES=` alone; 23.02
    and later print `ReqTRES=` and `AllocTRES=` together (AllocTRES `(null)` until the
    job has nodes), never TRES=. A record holding both spellings, or one of the pair
    alone, has a key a user wrote (a job name, a comment): a 22.05 record never repeats
    an AllocTRES= a name forged, so oneliner's repeat check cannot catch it."""
    new = [key for key in NEW_TRES_KEYS if key in record]
    if "TRES" in record and not new:
        value = record["TRES"]
    elif "TRES" not in record and len(new) == len(NEW_TRES_KEYS):
        value = record["AllocTRES"]
        if value == "(null)":
            value = record["ReqTRES"]
    else:
        return ""
    return "" if value == "(null)" else value


def partitions_of(text: str) -> tuple[str, ...]:
    """A record's Partition= ("batch", or "a,b" for a pending job that may run in
    either); () when any is not a name."""
    names = tuple(text.split(","))
    return names if all(NAME.fullmatch(name) for name in names) else ()


def node_groups(line: str) -> list[tuple[str, str, str]]:
    """(hostlist, CPU_IDs, GRES) of each node group of one `scontrol show job -d -o` line.
    Slurm prints them between JOB_GRES= and MinCPUsNode=; a job's name, comment or paths
    are free text a user writes (a JobName may hold a whole forged group), so a line with
    either word more than once is not trusted: no groups."""
    if line.count("JOB_GRES=") != 1 or line.count("MinCPUsNode=") != 1:
        return []
    start, end = line.index("JOB_GRES="), line.index("MinCPUsNode=")
    return NODE_GROUP.findall(line[start:end]) if start < end else []


def detailed_line(job_id: str, timeout: float, scontrol: str = "scontrol") -> str | None:
    """The line of `scontrol show job -d -o JOB` that is the job's own (JobId=JOB ...);
    None when scontrol failed, hung, is missing or printed none."""
    try:
        done = run.command([scontrol, "show", "job", "-d", "-o", job_id], timeout)
    except AgentError:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith(f"JobId={job_id} ")]
    return lines[0] if done.code == 0 and lines else None
