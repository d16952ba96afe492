"""An interactive session's idle watchdog (docs/interactive.md), run by the batch step on
the job's first node while the run lines run. Every interval it samples this node:

- forwarded traffic: TCP connections ESTABLISHED on one of the session's ports whose
  other end is a socket of the job's owner on this node (its uid in /proc/net/tcp{,6}):
  a new connection, or bytes moved by the owner's processes that hold that other end
  (their read/write counts in /proc/PID/io). `tcloud forward` connects from the owner's
  own process here (`tacc-agent relay`, over loopback), which reads and writes nothing
  but the connection's bytes; another user's connection, or one from another host
  (whose uid this node cannot know), never keeps the session alive;
- a busy process: the job's processes here (this uid, SLURM_JOB_ID in their environment,
  the watchdog's own process left out) used >= 5% of one CPU over the interval;
- typing: a job process's terminal (/dev/pts/N) was read or written (its atime/mtime,
  as `w` computes IDLE).

Nothing of these for the session's idle_timeout: the job is scancel'ed (the user's own
job; tried again a few times), which stops it as a cancel does, then recorded CANCELLED
with why; a scancel that never succeeds leaves no such record and the watch goes on.
Each sampler is a function over its inputs (a /proc root, a clock) so tests drive it;
the watchdog stops watching, and never cancels, when it cannot read what it needs.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.errors import AgentError
from tacc_agent.procfs import PROC, processes
from tacc_agent.procfs.sockets import ESTABLISHED, Endpoint, TcpSocket, tcp_sockets
from tacc_agent.tasks.jobs import records
from tacc_contract.slurm_time import time_seconds

MIN_INTERVAL_SECONDS = 2.0
MAX_INTERVAL_SECONDS = 30.0
BUSY_CPU_SHARE = 0.05  # of one CPU, over the interval
SAMPLE_SECONDS = 10  # how long stop() waits for a sample under way, past the interval
SCANCEL_RETRY_DELAYS = (2.0, 4.0, 8.0, 16.0)  # 5 tries over ~30 s
IDLE_WHY = "no forwarded traffic, no busy process, no typing"
# Linux's Unix98 pty slaves (/dev/pts/N): majors 136-143 (Documentation/admin-guide/devices.txt).
PTS_MAJORS = range(136, 144)
JOB_VARIABLE = "SLURM_JOB_ID"

# What the processes holding the owner's end of a connection read and wrote (rchar, wchar).
Connection = tuple[int, int]


class WatchError(Exception):
    """What the watchdog cannot read: it stops watching rather than cancel blind."""


def idle_seconds(idle_timeout: str) -> int | None:
    """The session's idle limit in seconds; None: never idle-stopped ("0", UNLIMITED)."""
    if idle_timeout.strip() == "0":
        return None
    seconds = time_seconds(idle_timeout.strip())
    return seconds or None


def interval_for(idle: float) -> float:
    """How often to sample: a sixth of the idle limit, from 2 s to 30 s."""
    return min(max(idle / 6, MIN_INTERVAL_SECONDS), MAX_INTERVAL_SECONDS)


# ---------------------------------------------------------------- forwarded traffic
def endpoint_text(end: Endpoint) -> str:
    address, port = end
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def owners_ends(sockets: Iterable[TcpSocket], ports: Iterable[int], owner: int) -> dict[str, int]:
    """The connections ESTABLISHED on one of `ports` whose other end is a socket of
    `owner` on this node: "session end, other end" -> the inode of the owner's end. A
    peer on another host has no socket here, so it is not the owner's."""
    wanted = set(ports)
    established = [found for found in sockets if found.state == ESTABLISHED]
    by_ends = {(found.local, found.remote): found for found in established}
    ends = {}
    for found in established:
        other = by_ends.get((found.remote, found.local))
        if found.local[1] in wanted and other is not None and other.uid == owner:
            ends[f"{endpoint_text(found.local)} {endpoint_text(found.remote)}"] = other.inode
    return ends


def moved(proc_root: str, holders: Iterable[int]) -> Connection:
    """What the processes holding a connection's end have read and written so far (one
    that ended meanwhile, or whose counts cannot be read, adds nothing)."""
    read = written = 0
    for pid in holders:
        counts = processes.io_chars(proc_root, pid)
        if counts is not None:
            read, written = read + counts[0], written + counts[1]
    return read, written


def read_connections(
    ports: list[int], owner: int | None = None, proc_root: Path = Path(PROC)
) -> dict[str, Connection]:
    """The session's connections that count (owners_ends; owner: this uid), each with
    what its owner's end moved."""
    if not ports:
        return {}
    uid = os.getuid() if owner is None else owner
    root = str(proc_root)
    try:
        ends = owners_ends(tcp_sockets(root, strict=True), ports, uid)
        holders = processes.socket_holders(root, set(ends.values()), uid)
    except OSError as exc:
        raise WatchError(f"cannot list this node's connections: {exc}") from None
    return {name: moved(root, holders.get(inode, ())) for name, inode in ends.items()}


# ---------------------------------------------------------------- the job's processes
@dataclass(frozen=True)
class JobProcess:
    pid: int
    started: int  # clock ticks after boot: with pid, names one process (pids are reused)
    cpu_ticks: int  # user + system
    tty_nr: int


def job_processes(
    proc_root: Path, job_id: str, uid: int, exclude: Iterable[int] = ()
) -> list[JobProcess]:
    """The processes of `job_id` under `proc_root` that `uid` runs (others' environments
    are not readable anyway), without `exclude`. A process that exits meanwhile, or whose
    environment cannot be read, is not the job's."""
    root, left_out = str(proc_root), set(exclude)
    found = []
    for pid in processes.pids(root):
        if pid in left_out or processes.owner(root, pid) != uid:
            continue
        variables = processes.environment(root, pid)
        if variables is None or variables.get(JOB_VARIABLE) != job_id:
            continue
        stat = processes.stat(root, pid)
        if stat is not None:
            found.append(JobProcess(pid, stat.started, stat.cpu_ticks, stat.tty_nr))
    return found


def terminal_path(tty_nr: int, dev_root: Path) -> Path | None:
    """/dev/pts/N of a controlling terminal number, None for none or another kind."""
    major = (tty_nr >> 8) & 0xFFF
    minor = (tty_nr & 0xFF) | ((tty_nr >> 12) & 0xFFF00)
    if tty_nr == 0 or major not in PTS_MAJORS:
        return None
    return dev_root / "pts" / str((major - PTS_MAJORS.start) * 256 + minor)


def terminal_times(processes: Iterable[JobProcess], dev_root: Path) -> dict[str, float]:
    """Each job terminal's last read or write (the later of its atime and mtime)."""
    times: dict[str, float] = {}
    for process in processes:
        path = terminal_path(process.tty_nr, dev_root)
        if path is None or str(path) in times:
            continue
        try:
            info = path.stat()
        except OSError:
            continue
        times[str(path)] = max(info.st_atime, info.st_mtime)
    return times


# ---------------------------------------------------------------- one sample, the decision
@dataclass(frozen=True)
class Sample:
    time: float
    connections: dict[str, Connection] = field(default_factory=dict)
    cpu_ticks: dict[tuple[int, int], int] = field(default_factory=dict)
    terminals: dict[str, float] = field(default_factory=dict)


def sample_of(
    now: float,
    connections: dict[str, Connection],
    processes: list[JobProcess],
    terminals: dict[str, float],
) -> Sample:
    ticks = {(p.pid, p.started): p.cpu_ticks for p in processes}
    return Sample(now, dict(connections), ticks, dict(terminals))


def activity(before: Sample, after: Sample, ticks_per_second: float) -> list[str]:
    """What used the session between two samples (empty: nothing)."""
    found = []
    if any(before.connections.get(key) != counters for key, counters in after.connections.items()):
        found.append("forwarded traffic")
    # A process new since the last sample used all its ticks in between.
    used = sum(ticks - before.cpu_ticks.get(key, 0) for key, ticks in after.cpu_ticks.items())
    seconds = max(after.time - before.time, 1e-9)
    if used / ticks_per_second / seconds >= BUSY_CPU_SHARE:
        found.append("a busy process")
    if any(before.terminals.get(tty) != at for tty, at in after.terminals.items()):
        found.append("typing")
    return found


# ---------------------------------------------------------------- the watchdog
@dataclass
class Watchdog:
    """Samples every `interval` until stopped or the session has been idle for `idle`
    seconds; then `cancel`, which says whether it cancelled (if not, the watch goes on
    and the next sample tries again). `clock` and `wait` (an Event's wait: True when
    stopped) are the only sources of time, so tests run it on a fake one."""

    idle: float
    take_sample: Callable[[float], Sample]
    cancel: Callable[[float], bool]
    clock: Callable[[], float] = time.monotonic
    wait: Callable[[float], bool] = field(default_factory=lambda: threading.Event().wait)
    ticks_per_second: float = float(os.sysconf("SC_CLK_TCK"))
    say: Callable[[str], None] = print

    def run(self) -> bool:
        """True when it cancelled the session."""
        interval = interval_for(self.idle)
        try:
            last = self.take_sample(self.clock())
            active_at = last.time
            while not self.wait(interval):
                now = self.clock()
                current = self.take_sample(now)
                if activity(last, current, self.ticks_per_second):
                    active_at = now
                last = current
                if now - active_at >= self.idle and self.cancel(now - active_at):
                    return True
        except WatchError as exc:
            self.say(f"idle watchdog: {exc}; this session is not stopped when idle")
        return False


def idle_text(seconds: float) -> str:
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def canceller(
    job_dir: Path,
    job_id: str,
    timeout: float,
    say: Callable[[str], None],
    wait: Callable[[float], bool] | None = None,
    retry_delays: Sequence[float] = SCANCEL_RETRY_DELAYS,
) -> Callable[[float], bool]:
    """Scancels the job (Slurm stops every step, as for `tcloud cancel`), tried again
    after each of retry_delays; only once Slurm took it, records CANCELLED with why
    (never a CANCELLED record over a running job). True when it cancelled; False when
    scancel never succeeded (said in the job's log) or `wait` was stopped meanwhile."""
    pause = wait or threading.Event().wait

    def cancel(idle_for: float) -> bool:
        reason = f"session idle for {idle_text(idle_for)}: {IDLE_WHY}"
        say(reason)
        for delay in (*retry_delays, None):
            try:
                slurm.run.output(["scancel", job_id], timeout)
            except AgentError as exc:
                if delay is None:
                    say(
                        f"idle watchdog: scancel failed ({exc}); the session keeps running, "
                        "tried again at the next sample"
                    )
                    return False
                say(f"idle watchdog: scancel failed ({exc}); again in {delay:g} s")
                if pause(delay):
                    return False  # the run ended meanwhile
                continue
            records.add_event(job_dir, "CANCELLED", reason=reason)
            return True
        return False

    return cancel


def node_sampler(
    ports: list[int], job_id: str, proc_root: Path = Path(PROC), dev_root: Path = Path("/dev")
) -> Callable[[float], Sample]:
    """This node's sample: the session's connections, the job's processes and terminals
    (this process, the watchdog's own, left out)."""
    uid, own = os.getuid(), os.getpid()

    def take(now: float) -> Sample:
        connections = read_connections(ports, owner=uid, proc_root=proc_root)
        try:
            processes = job_processes(proc_root, job_id, uid, exclude=[own])
        except OSError as exc:
            raise WatchError(f"cannot list this node's processes: {exc}") from None
        return sample_of(now, connections, processes, terminal_times(processes, dev_root))

    return take


@dataclass
class Running:
    """A started watchdog: stop() ends it (the run is over) and waits for it."""

    thread: threading.Thread
    stopped: threading.Event

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=MAX_INTERVAL_SECONDS + SAMPLE_SECONDS)


def start(
    session: dict | None, job_dir: Path, job_id: str, timeout: float, say: Callable[[str], None]
) -> Running | None:
    """The watchdog of a session with an idle limit, in a thread of this (the batch
    step's) process; None for an ordinary job, a session that is never idle-stopped, or
    outside Slurm."""
    idle = idle_seconds(str(session.get("idle_timeout", "30"))) if session else None
    if idle is None or not job_id:
        return None
    stopped = threading.Event()
    watchdog = Watchdog(
        idle=idle,
        take_sample=node_sampler(list(session.get("ports") or []), job_id),
        cancel=canceller(job_dir, job_id, timeout, say, wait=stopped.wait),
        wait=stopped.wait,
        say=say,
    )
    thread = threading.Thread(target=watchdog.run, name="idle-watchdog", daemon=True)
    thread.start()
    say(f"idle watchdog: stops this session after {idle_text(idle)} of no use")
    return Running(thread, stopped)
