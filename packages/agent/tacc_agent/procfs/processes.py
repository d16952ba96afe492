"""This node's processes, from /proc/PID: the stat line (parent, terminal, CPU ticks,
start), owner, command line, environment, memory, I/O counts and the sockets a process
holds; the whole table, the tree below a process, and the uids of everyone running.

Another user's process is readable only in part (its environment, fds and I/O counts
not without CAP_SYS_PTRACE): a reader answers None, or leaves the process out, for what
it may not read. What the root daemon reads of a user's process is bounded: a task
controls its own command line and environment (up to ARG_MAX, 2 MiB, each, per process,
every second), so no more is read than the figures need."""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from tacc_agent.procfs import PROC, read_bytes
from tacc_agent.procfs.system import uptime_seconds

# A step daemon's title ("slurmstepd: [123456789.4294967294]") fits in 64 bytes; an
# environment the daemon reads, in 1 MiB.
TITLE_BYTES = 64
MOST_BYTES = 1 << 20
UID_LINE = re.compile(rb"^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)", re.MULTILINE)
SOCKET_LINK = re.compile(r"socket:\[(\d+)\]")
IO_CHARS = re.compile(rb"^(rchar|wchar):\s+(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class Stat:
    """What the agent reads of /proc/PID/stat (proc(5) fields 4, 7, 14-17 and 22)."""

    ppid: int
    tty_nr: int  # the controlling terminal's device number; 0: none
    cpu_ticks: int  # utime + stime, in clock ticks
    reaped_ticks: int  # cutime + cstime: of the children it waited for
    started: int  # starttime, clock ticks after boot: with the pid, names one process


def parse_stat(text: bytes) -> Stat | None:
    """One stat line; the command name, in parentheses, may hold spaces and parentheses
    itself, so the fields are counted from the last ')'."""
    fields = text[text.rfind(b")") + 1 :].split()
    # fields[0] is field 3 (state): ppid is field 4, tty_nr 7, utime 14, stime 15,
    # cutime 16, cstime 17, starttime 22.
    try:
        return Stat(
            ppid=int(fields[1]),
            tty_nr=int(fields[4]),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            reaped_ticks=int(fields[13]) + int(fields[14]),
            started=int(fields[19]),
        )
    except (IndexError, ValueError):
        return None


def base(proc_root: str, pid: int) -> str:
    return os.path.join(proc_root, str(pid))


def pids(proc_root: str = PROC) -> list[int]:
    """Every process's pid; OSError when the /proc root cannot be listed."""
    with os.scandir(proc_root) as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def exists(pid: int, proc_root: str = PROC) -> bool:
    return os.path.exists(base(proc_root, pid))


def stat(proc_root: str, pid: int) -> Stat | None:
    found = read_bytes(f"{base(proc_root, pid)}/stat", MOST_BYTES)
    return None if found is None else parse_stat(found)


def owner(proc_root: str, pid: int) -> int | None:
    """The uid /proc/PID belongs to: the process's effective uid (root's while it is
    not dumpable); None when it ended."""
    try:
        return os.stat(base(proc_root, pid)).st_uid
    except OSError:
        return None


def uids(proc_root: str, pid: int) -> tuple[int, int, int, int] | None:
    """Real, effective, saved and filesystem uid (the Uid: line of /proc/PID/status)."""
    found = UID_LINE.search(read_bytes(f"{base(proc_root, pid)}/status", MOST_BYTES) or b"")
    if found is None:
        return None
    real, effective, saved, filesystem = (int(uid) for uid in found.groups())
    return real, effective, saved, filesystem


def command_line(proc_root: str, pid: int, most: int = -1) -> bytes | None:
    """/proc/PID/cmdline: the argv, each word ended by a NUL (a process may rewrite it
    into a title, as slurmstepd does); at most `most` bytes."""
    return read_bytes(f"{base(proc_root, pid)}/cmdline", most)


def environment(proc_root: str, pid: int, most: int = -1) -> dict[str, str] | None:
    """The environment a process started with (at most `most` bytes of it); a name set
    twice has its first value, as getenv(3) finds it. None when unreadable (another
    user's)."""
    raw = read_bytes(f"{base(proc_root, pid)}/environ", most)
    if raw is None:
        return None
    found: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            found.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return found


def memory_bytes(proc_root: str, pid: int) -> int:
    """Pss (shared pages split among their users, so a sum counts them once), else RSS;
    0 when neither can be read."""
    for name, key in (("smaps_rollup", rb"^Pss:\s+(\d+) kB"), ("status", rb"^VmRSS:\s+(\d+) kB")):
        text = read_bytes(f"{base(proc_root, pid)}/{name}", MOST_BYTES) or b""
        found = re.search(key, text, re.MULTILINE)
        if found:
            return int(found.group(1)) * 1024
    return 0


def io_chars(proc_root: str, pid: int) -> tuple[int, int] | None:
    """(rchar, wchar) of /proc/PID/io: the bytes it passed to read(2) and write(2) and
    their kin, all threads together, pipes and sockets read or written that way
    included (recv/send on a socket are not counted). None when unreadable."""
    found = dict(IO_CHARS.findall(read_bytes(f"{base(proc_root, pid)}/io") or b""))
    if b"rchar" not in found or b"wchar" not in found:
        return None
    return int(found[b"rchar"]), int(found[b"wchar"])


def socket_holders(proc_root: str, inodes: set[int], uid: int) -> dict[int, set[int]]:
    """Socket inode -> the pids of `uid`'s processes with it open (their /proc/PID/fd
    links, readable for one's own processes), for the inodes asked about."""
    holders: dict[int, set[int]] = {}
    if not inodes:
        return holders
    for pid in pids(proc_root):
        if owner(proc_root, pid) != uid:
            continue
        fd_dir = f"{base(proc_root, pid)}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:  # ended meanwhile, or not ours to read
            continue
        for name in names:
            try:
                link = SOCKET_LINK.fullmatch(os.readlink(f"{fd_dir}/{name}"))
            except OSError:
                continue
            if link and int(link.group(1)) in inodes:
                holders.setdefault(int(link.group(1)), set()).add(pid)
    return holders


@dataclass
class Process:
    """One process as the job usage figures read it."""

    pid: int
    ppid: int
    uid: int  # the real uid
    cpu_seconds: float  # its own and its reaped children's
    title: bytes  # the first TITLE_BYTES of its command line


def process(proc_root: str, pid: int, ticks: int) -> Process | None:
    """One process from /proc/PID/{stat,status,cmdline}; None when it ended."""
    found, owners = stat(proc_root, pid), uids(proc_root, pid)
    if found is None or owners is None:
        return None
    title = command_line(proc_root, pid, TITLE_BYTES) or b""
    cpu_seconds = (found.cpu_ticks + found.reaped_ticks) / ticks
    return Process(pid, found.ppid, owners[0], cpu_seconds, title)


def process_table(proc_root: str = PROC) -> dict[int, Process]:
    """pid -> Process of every process; OSError when the /proc root cannot be listed."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids(proc_root):
        if proc := process(proc_root, pid, ticks):
            found[pid] = proc
    return found


def process_tree(proc_root: str = PROC) -> dict[int, list[int]]:
    """Parent pid -> its children's pids ({} when the /proc root cannot be listed)."""
    tree: dict[int, list[int]] = {}
    try:
        listed = pids(proc_root)
    except OSError:
        return tree
    for pid in listed:
        found = stat(proc_root, pid)
        if found is not None:
            tree.setdefault(found.ppid, []).append(pid)
    return tree


def process_uids(proc_root: str = PROC) -> set[int] | None:
    """Real, effective, saved and filesystem uids of every process; None when no
    process could be read (the root unlisted, or every status hidden)."""
    try:
        listed = pids(proc_root)
    except OSError:
        return None
    found: set[int] = set()
    read = 0
    for pid in listed:
        owners = uids(proc_root, pid)
        if owners is not None:
            found.update(owners)
            read += 1
    return found if read else None


def started_at(pid: int | None = None, proc_root: str = PROC) -> float | None:
    """When this process (or pid) was started, as a clock time (10 ms resolution): its
    age is the time since boot less its starttime (both on the kernel's boot clock), so
    the time is right even where /proc/stat's whole-second btime is not. None when
    /proc does not say."""
    found = stat(proc_root, pid or os.getpid())
    if found is None:
        return None
    try:
        now = time.time()
        uptime = uptime_seconds(proc_root)
    except (OSError, ValueError, IndexError):
        return None
    return now - (uptime - found.started / os.sysconf("SC_CLK_TCK"))


def own_fd_path(fd: int) -> str:
    """A path naming this process's open file fd (its /proc/self/fd link: linkat(2)
    with AT_SYMLINK_FOLLOW links the open file itself, whatever its path names now)."""
    return f"{PROC}/self/fd/{fd}"
