"""The queue tick's requeue action (Queue.requeue): checkpoint a running job and put it
back in the queue, as its owner's `tcloud halt` then `tcloud resume` would; and its
resize (Queue.resize): the same at a new node count.

The tick runs as root on the controller. Who owns a job, where it runs, its state and
size come from Slurm. From the owner's own files it reads the job's opt-in and node
range, which her submit recorded in the job's status/submit.json
(plugin_data.<plug-in>.opt_in: ["preemptible", "resize"]; plugin_data.elastic.range).
That read follows no link, takes only a regular file of the job's owner (Slurm's
UserId) in a directory of theirs, at most MAX_RECORD_BYTES of JSON, and keeps only the
known words: an opt-in can only let the cluster requeue that owner's own job. Where
root may not read it (NFS root_squash), the same read is made as the owner.

The range is the owner's to write, so it is never taken on her word: a resize uses the
range root recorded for the job (tasks/schedule/node_ranges.py: the owner's range, its maximum
no higher than the one Slurm kept from her submit, recorded the first time root reads
the job pending), refuses any other range her file gives, and grows a job only as far
as Slurm's limits allow it (tasks/schedule/node_limits.py: the partition's MaxNodes, the TRES
limits of its QOS, its partition's QOS and its association tree), which Slurm does not
apply to root's own update; checked again once the job is held, as others' jobs may have
started in the meantime.

The halt and resume themselves run as the owner (runuser -u OWNER -- tacc-agent job
halt/resume): every event and record file is written by them, never by root, and
Slurm's hold is theirs to release. Root only sets a held job's size.

Sweeps (array tasks, trial directories) are out of scope: they are never opted in.
"""

from __future__ import annotations

import errno
import json
import os
import pwd
import re
import stat
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.self_command import AGENT
from tacc_agent.tasks.jobs import job_tags
from tacc_agent.tasks.schedule import node_limits, node_ranges
from tacc_agent.tasks.schedule.reasons import MAX_REASON_CHARS, checked_reason
from tacc_contract.jobs import SCRIPT
from tacc_contract.verbs import JOB_HALT, JOB_RESUME

KNOWN_OPT_INS = frozenset({"preemptible", "resize"})
MAX_RECORD_BYTES = 1 << 20
JOB_ID = re.compile(r"\d+")
USER_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\$?")
SEARCH_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PLAIN_ENVIRONMENT = {"PATH": SEARCH_PATH, "LANG": "C.UTF-8"}
MARGIN_SECONDS = 30  # the owner's agent starting, reading its records, answering
MAX_REREADS = 10  # jobs read again alone in one tick (job_records)

# (argv, timeout) -> (exit code, what it printed)
Runner = Callable[[list[str], float], tuple[int, str]]
Note = Callable[[str], None]

# How long a halted job may take to show waiting again (held_record), and how often it is read.
REQUEUE_SETTLE_SECONDS = 15.0
REQUEUE_SETTLE_POLL_SECONDS = 0.5


@dataclass(frozen=True)
class JobRecord:
    """What Slurm (scontrol show job, as root) says of a job: read from a record that
    names no key twice (slurm.oneliner.job_record_of), one job's own when read alone."""

    job_id: str
    uid: int
    user: str
    state: str
    job_dir: Path  # WorkDir: a tacc job runs in its job directory (sbatch --chdir)
    array: bool  # a task of an array job: a sweep's trial
    run_seconds: int = 0  # RunTime: how long it ran (the whole run, once it ended)
    tasks_per_node: int = 0  # --ntasks-per-node (NtasksPerN); 0 when not given
    cpus_per_task: int = 0  # --cpus-per-task (CPUs/Task); 0 when not read
    nodes: int = 0  # NumNodes: what it holds; while pending, the fewest it asks for
    max_nodes: int = 0  # the most it asks for, shown while pending only; 0: not shown
    partitions: tuple[str, ...] = ()  # where it counts against Slurm's limits (() unread)
    qos: str = ""
    account: str = ""
    tres: str = ""  # TRES: what it holds or asks for (cpu=8,node=2,gres/gpu=4)


def record_of(info: dict[str, str]) -> JobRecord | None:
    """One scontrol record as a JobRecord; None without an owner or a directory."""
    owner = job_tags.USER_ID.fullmatch(info.get("UserId", ""))
    work_dir = info.get("WorkDir", "")
    if not owner or not work_dir.startswith("/"):
        return None
    array = bool(info.get("ArrayTaskId")) or bool(info.get("ArrayJobId"))
    job_id = info.get("JobId", "")
    if array and info.get("ArrayTaskId", "").isdigit():
        job_id = f"{info.get('ArrayJobId', '')}_{info['ArrayTaskId']}"
    per_node = info.get("NtasksPerN:B:S:C", "").split(":")[0]
    per_task = info.get("CPUs/Task", "")
    state = info.get("JobState", "")
    nodes, max_nodes = slurm.jobs.node_counts(info.get("NumNodes", ""), state)
    return JobRecord(
        job_id,
        int(owner.group(1)),
        info["UserId"].partition("(")[0],
        state,
        Path(work_dir),
        array,
        slurm.times.elapsed_seconds(info.get("RunTime", "")),
        int(per_node) if per_node.isdigit() else 0,
        int(per_task) if per_task.isdigit() else 0,
        nodes,
        max_nodes,
        slurm.jobs.partitions_of(info.get("Partition", "")),
        slurm.jobs.known(info.get("QOS", "")),
        slurm.jobs.known(info.get("Account", "")),
        slurm.jobs.tres_of(info),
    )


def job_record(job_id: str, config: AgentConfig) -> JobRecord | None:
    """Slurm's record of one job (`scontrol show job -o JOB`, one line: slurm.jobs.job_alone);
    None when Slurm does not know it, prints more than one line for it, or cannot be asked
    (the tick goes on)."""
    try:
        info = slurm.jobs.job_alone(job_id, config.slurm_timeout_seconds)
    except AgentError:
        return None
    record = record_of(info) if info else None
    return record if record and record.job_id == job_id else None


def job_records(config: AgentConfig, skip: Collection[str] = frozenset()) -> dict[str, JobRecord]:
    """Every job Slurm knows but those in `skip` (ids as scontrol's JobId), by squeue's
    id (array tasks as JOB_I): one scontrol call.
    A job's name may hold line breaks (Slurm allows any text in it), so a line of that
    output may be a record its owner wrote, claiming another job's id: an id that two
    records claim is read again alone (`job_record`: that job's own lines only), at most
    MAX_REREADS a tick; the others are left out of this tick."""
    found = slurm.jobs.job_records(config.slurm_timeout_seconds, skip)
    claims: dict[str, list[JobRecord]] = {}
    for record in filter(None, map(record_of, found)):
        claims.setdefault(record.job_id, []).append(record)
    known = {job_id: records[0] for job_id, records in claims.items() if len(records) == 1}
    claimed_twice = [job_id for job_id, records in claims.items() if len(records) > 1]
    for job_id in claimed_twice[:MAX_REREADS]:
        record = job_record(job_id, config)
        if record is not None:
            known[job_id] = record
    return known


def open_owned(name: str, uid: int, flags: int, dir_fd: int | None = None) -> int:
    """An fd of `name` (no link followed) owned by uid; OSError otherwise."""
    fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        wanted = stat.S_ISDIR if flags & os.O_DIRECTORY else stat.S_ISREG
        if info.st_uid != uid or not wanted(info.st_mode):
            raise PermissionError(f"{name}: not the job owner's (uid {uid})")
        if info.st_mode & 0o022:  # another user could have written the owner's record
            raise PermissionError(f"{name}: writable by others than its owner")
        return fd
    except BaseException:
        os.close(fd)
        raise


# Run as the job's owner where root may not read (NFS root_squash): the record, opened as
# root would open it (no link followed, a FIFO does not block, a regular file only), at
# most MAX_RECORD_BYTES + 1 bytes to stdout.
OWNER_READ = (
    "import os, stat, sys\n"
    "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)\n"
    "if stat.S_ISREG(os.fstat(fd).st_mode):\n"
    "    sys.stdout.buffer.write(os.read(fd, int(sys.argv[2])))\n"
)
OWNER_READ_SECONDS = 5.0


def read_submit_record(job: JobRecord, run: Runner | None = None) -> dict:
    """The job's status/submit.json, read as root with care: the job directory, status/
    and the file each the owner's, no link followed (a FIFO does not block: O_NONBLOCK),
    at most MAX_RECORD_BYTES; {} for anything else. Where root may not read them (the
    users' directories on NFS with root_squash), the same read is made as the owner."""
    if job.uid == 0:
        return {}
    fds: list[int] = []
    try:
        fds.append(open_owned(str(job.job_dir), job.uid, os.O_RDONLY | os.O_DIRECTORY))
        fds.append(open_owned("status", job.uid, os.O_RDONLY | os.O_DIRECTORY, fds[-1]))
        fds.append(open_owned("submit.json", job.uid, os.O_RDONLY, fds[-1]))
        with os.fdopen(os.dup(fds[-1]), "rb") as handle:
            data = handle.read(MAX_RECORD_BYTES + 1)
        if len(data) > MAX_RECORD_BYTES:
            return {}
        record = json.loads(data.decode())
    except PermissionError as exc:
        # The kernel's refusal (errno set), not one of open_owned's own (none): squashed.
        squashed = exc.errno in (errno.EACCES, errno.EPERM)
        return read_as_owner(job, run or run_command) if squashed else {}
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}
    finally:
        for fd in fds:
            os.close(fd)
    return record if isinstance(record, dict) else {}


def read_as_owner(job: JobRecord, run: Runner) -> dict:
    """read_submit_record's read, made by the job's owner (their own file, with their
    own rights: nothing root could read that they could not)."""
    name = owner_name(job)
    if name is None:
        return {}
    path = job.job_dir / "status" / "submit.json"
    argv = [
        "runuser",
        "-u",
        name,
        "--",
        sys.executable,
        "-I",
        "-c",
        OWNER_READ,
        str(path),
        str(MAX_RECORD_BYTES + 1),
    ]
    code, output = run(argv, OWNER_READ_SECONDS)
    if code != 0 or len(output) > MAX_RECORD_BYTES:
        return {}
    try:
        record = json.loads(output)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def opt_ins_of(record: dict) -> frozenset[str]:
    """The known words of the record's own opt_in list (the task's, written at submit
    whichever plug-ins were on then: resources.preemptible) and of every
    plugin_data.<plug-in>.opt_in list."""
    lists = [record.get("opt_in")]
    plugin_data = record.get("plugin_data")
    for data in plugin_data.values() if isinstance(plugin_data, dict) else ():
        lists.append(data.get("opt_in") if isinstance(data, dict) else None)
    words: set[str] = set()
    for opt_in in lists:
        if isinstance(opt_in, list):
            words.update(w for w in opt_in if isinstance(w, str) and w in KNOWN_OPT_INS)
    return frozenset(words)


def node_range_of(record: dict) -> tuple[int, int] | None:
    """The node range the task gave (plugin_data.elastic.range: [low, high]), checked;
    None for anything else."""
    data = record.get("plugin_data")
    elastic = data.get("elastic") if isinstance(data, dict) else None
    found = elastic.get("range") if isinstance(elastic, dict) else None
    if (
        not isinstance(found, list)
        or len(found) != 2
        or not all(isinstance(n, int) and not isinstance(n, bool) for n in found)
    ):
        return None
    low, high = found
    return (low, high) if 1 <= low <= high <= node_limits.MAX_NODES else None


def allowed_job(job: JobRecord | None) -> tuple[frozenset[str], tuple[int, int] | None]:
    """What the job's owner allowed, and its node range (see the module's docstring),
    from one read of its record; never raises."""
    if job is None or job.array:
        return frozenset(), None
    record = read_submit_record(job)
    return opt_ins_of(record), node_range_of(record)


def opted_in_job(job: JobRecord | None) -> frozenset[str]:
    return allowed_job(job)[0]


def opted_in(job_id: str, config: AgentConfig) -> frozenset[str]:
    return opted_in_job(job_record(job_id, config))


def usable_reason(reason: object) -> bool:
    """The verbs' own rule (tasks/schedule/reasons.py: one printable line of 1 to 120
    characters), and no leading "-": it goes on the owner's command line."""
    if not isinstance(reason, str) or reason.startswith("-"):
        return False
    try:
        checked_reason(reason)
    except Rejected:
        return False
    return True


def owner_name(job: JobRecord) -> str | None:
    """Slurm's owner name, when it is the system's name for Slurm's uid."""
    try:
        name = pwd.getpwuid(job.uid).pw_name
    except KeyError:
        return None
    return name if name == job.user and USER_NAME.fullmatch(name) else None


def run_command(argv: list[str], timeout: float) -> tuple[int, str]:
    """Run argv (no shell) through the one runner (slurm.run), from /, with a plain PATH
    and no agent settings inherited; (exit status, what it printed), as a shell and
    timeout(1) would say a missing (127) or hung (124) command."""
    try:
        done = slurm.run.command(argv, timeout, environment=PLAIN_ENVIRONMENT, cwd="/")
    except slurm.run.NotFound:
        return 127, f"{argv[0]} not found"
    except slurm.run.NoAnswer:
        return 124, f"no answer within {timeout:g} s"
    return done.code, done.stdout + done.stderr


def failure(output: str) -> str:
    """The agent's error line ({"error": ...}) or the output's last line, short."""
    for line in reversed(output.strip().splitlines()):
        try:
            answer = json.loads(line)
        except ValueError:
            continue
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            return answer["error"][:200]
    lines = output.strip().splitlines()
    return lines[-1][:200] if lines else "no output"


def owner_argv(job: JobRecord, name: str, words: list[str]) -> list[str]:
    """tacc-agent VERB as the job's owner, in the user directory that holds the job
    (<user dir>/jobs/<job dir>), with the cluster's default settings."""
    user_dir = job.job_dir.parent.parent
    return ["runuser", "-u", name, "--", *AGENT, f"--userdir={user_dir}", *words]


def refusal(
    job_id: str, reason: object, config: AgentConfig, nodes: int | None = None
) -> tuple[JobRecord | None, str]:
    """(the job, "") when it may be requeued now (at `nodes`, when given); else (None,
    why not)."""
    if not JOB_ID.fullmatch(job_id):
        return None, "not a single job (a sweep's trials are never requeued)"
    if not usable_reason(reason):
        return None, f"the reason is not one printable line of 1 to {MAX_REASON_CHARS} characters"
    job = job_record(job_id, config)
    if job is None or job.array:
        return None, "Slurm has no single job by that id"
    states = ("RUNNING",) if nodes is None else ("RUNNING", "PENDING")
    if job.state not in states:
        return None, f"it is {job.state or 'in no known state'}, not {' or '.join(states)}"
    opt_ins, claimed = allowed_job(job)
    needed = "preemptible" if nodes is None else "resize"
    if needed not in opt_ins:
        return None, f"its task did not opt in ({needed})"
    if nodes is not None:
        why = range_refusal(job, claimed, nodes, config) or limit_refusal(job, nodes, config)
        if why:
            return None, why
    if owner_name(job) is None or job.job_dir.parent.name != "jobs":
        return None, "its owner or job directory is not a tacc user's"
    return job, ""


def recorded_range(
    job: JobRecord, claimed: tuple[int, int], config: AgentConfig
) -> tuple[int, int] | None:
    """The range root recorded for the job (tasks/schedule/node_ranges.py); recorded now where
    none is yet: the range it was submitted with (Slurm's accounting keeps sbatch's
    --nodes, slurm.accounting.submitted_nodes), else, without accounting, the owner's range capped
    at the maximum Slurm shows while it waits (a job that ran shows only what it held).
    None while none is recorded. OSError when the record cannot be written."""
    path = node_ranges.store_path(config.queue_state_dir)
    key = (job.job_id, job.uid, str(job.job_dir))
    bounds = node_ranges.recorded(path, key)
    if bounds is None:
        script = str(job.job_dir / SCRIPT)
        bounds = slurm.accounting.submitted_nodes(job.job_id, script, config.slurm_timeout_seconds)
    if bounds is None and job.state in slurm.jobs.WAITING_STATES and job.max_nodes:
        bounds = (min(claimed[0], job.max_nodes), min(claimed[1], job.max_nodes))
    if bounds is not None:
        node_ranges.record(path, key, bounds, time.time())  # kept while it is used
    return bounds


def range_refusal(
    job: JobRecord, claimed: tuple[int, int] | None, nodes: int, config: AgentConfig
) -> str:
    """Why `nodes` is not within the job's range ("" when it is): the owner's range
    must be the one root recorded, once one is (until then it is checked again once
    the job is held: `requeue`)."""
    if claimed is None:
        return f"{nodes} node(s) is outside its task's range (none)"
    bounds = recorded_range(job, claimed, config)
    if bounds is not None and bounds != claimed:
        recorded = f"{bounds[0]}-{bounds[1]}"
        return (
            f"its record's range ({claimed[0]}-{claimed[1]}) is not the one recorded ({recorded})"
        )
    low, high = bounds or claimed
    if not low <= nodes <= high:
        return f"{nodes} node(s) is outside its task's range ({low}-{high})"
    return ""


def limit_refusal(job: JobRecord, nodes: int, config: AgentConfig) -> str:
    """Why growing the job to `nodes` would break Slurm's limits ("" when it would not,
    or it does not grow): tasks/schedule/node_limits.py."""
    if nodes <= job.nodes:
        return ""
    place = node_limits.JobPlace(job.job_id, job.user, job.partitions, job.qos, job.account)
    if not job.tres:
        return "Slurm's limits on it could not be read: its record shows no TRES Slurm prints"
    timeout = config.slurm_timeout_seconds
    try:
        limits = node_limits.read_limits(place, timeout)
        running = slurm.queue.running_jobs(timeout) if limits.over_many_jobs() else []
        tres = slurm.tres.counts(job.tres, f"job {job.job_id}'s TRES")
        most, limit = node_limits.ceiling(
            limits, node_limits.per_node(tres, job.nodes), running, job.job_id
        )
    except AgentError as exc:
        return f"Slurm's limits on it could not be read: {exc}"
    if nodes > most:
        return f"{nodes} node(s) is more than Slurm's limits allow it ({most}: {limit})"
    return ""


def held_record(job_id: str, config: AgentConfig) -> JobRecord | None:
    """The halted job's record once Slurm shows it waiting: right after the halt, a
    loaded controller may still show it ending (COMPLETING, REQUEUED) for a few seconds.
    The last record read when it does not wait within REQUEUE_SETTLE_SECONDS."""
    deadline = time.monotonic() + REQUEUE_SETTLE_SECONDS
    while True:
        held = job_record(job_id, config)
        if held is None or held.state in slurm.jobs.WAITING_STATES:
            return held
        if time.monotonic() >= deadline:
            return held
        time.sleep(REQUEUE_SETTLE_POLL_SECONDS)


def held_refusal(job_id: str, nodes: int, config: AgentConfig) -> str:
    """The range and limit checks again, on the held job (halted: it waits), where root
    may record its range from Slurm's maximum, and where the owner's (or anyone's) jobs
    that started during the halt's grace period count against the limits; "" when
    `nodes` is within both."""
    held = held_record(job_id, config)
    if held is None or held.state not in slurm.jobs.WAITING_STATES:
        return "Slurm shows it neither pending nor held: its size is left alone"
    try:
        why = range_refusal(held, allowed_job(held)[1], nodes, config)
    except OSError as exc:  # the job is held: it must still be resumed
        return f"its range could not be recorded: {exc}"
    return why or limit_refusal(held, nodes, config)


def set_size(job: JobRecord, nodes: int) -> list[str]:
    """Minimum and maximum both: the job runs on exactly `nodes` (NumNodes=K alone sets
    the minimum, and Slurm may give a range's maximum); and its task and CPU counts with
    them (Slurm keeps the old size's otherwise, and a smaller job asking for the larger
    one's CPUs fits on no node: seen in the lab)."""
    words = ["scontrol", "update", f"JobId={job.job_id}", f"NumNodes={nodes}-{nodes}"]
    if job.tasks_per_node:
        words.append(f"NumTasks={nodes * job.tasks_per_node}")
        if job.cpus_per_task:
            words.append(f"NumCPUs={nodes * job.tasks_per_node * job.cpus_per_task}")
    return words


def requeue(
    job_id: str,
    reason: str,
    config: AgentConfig,
    note: Note | None = None,
    run: Runner = run_command,
    nodes: int | None = None,
) -> bool:
    """Checkpoint and requeue a running job whose task opted in: its owner's `job halt`
    (USR1, the grace period, requeue on hold), then `job resume`; with `nodes` (a
    resize: its task opted in to "resize", and the size is within its range), root sets
    the held job's node count in between. True when both did; else False, and `note`
    gets why. Never raises."""
    say = note or (lambda text: None)
    try:
        job, why = refusal(job_id, reason, config, nodes)
        if job is None:
            say(f"agent: job {job_id} not requeued: {why}")
            return False
        name = owner_name(job) or ""
        if job.state == "PENDING":  # a resize back while it waits: its size alone
            code, output = run(set_size(job, nodes or 0), config.slurm_timeout_seconds)
            say(
                f"agent: job {job_id} of {name} now asks for {nodes} node(s) ({reason})"
                if code == 0
                else f"agent: job {job_id}: its size not changed: {failure(output)}"
            )
            return code == 0
        grace = config.halt_grace_seconds
        slurm_calls = 4 * config.slurm_timeout_seconds
        halt = owner_argv(job, name, JOB_HALT.request(job=job_id, grace=grace, reason=reason))
        code, output = run(halt, grace + slurm_calls + MARGIN_SECONDS)
        if code != 0:
            say(f"agent: job {job_id} not requeued: its halt failed: {failure(output)}")
            return False
        resized = ""
        if nodes is not None:
            why = held_refusal(job_id, nodes, config)
            code, output = (
                (1, why) if why else run(set_size(job, nodes), config.slurm_timeout_seconds)
            )
            resized = f" at {nodes} node(s)" if code == 0 else ""
            if code != 0:  # it goes back at its old size: still requeued, as asked
                say(f"agent: job {job_id}: its size not changed: {failure(output)}")
        code, output = run(
            owner_argv(job, name, JOB_RESUME.request(job=job_id, reason=reason)),
            slurm_calls + MARGIN_SECONDS,
        )
        if code != 0:
            say(f"agent: job {job_id} halted but left held: its resume failed: {failure(output)}")
            return False
        say(f"agent: job {job_id} of {name} checkpointed and requeued{resized} ({reason})")
        return nodes is None or bool(resized)
    except Exception as exc:  # a tick goes on: one job's failure is a note
        say(f"agent: job {job_id} not requeued: {type(exc).__name__}: {exc}")
        return False
