"""A fake /proc for the agent's procfs readers (tacc_agent/procfs): socket tables
written as the kernel writes /proc/net/tcp{,6}, a process's stat line, and what
`tacc-agent relay`-like processes hold (fd links to a socket, I/O counts)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

TCP_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid"


def hex_endpoint(address: str, port: int) -> str:
    """An IPv4 endpoint as /proc/net/tcp writes it (host byte order)."""
    raw = socket.inet_aton(address)
    return (raw[::-1] if sys.byteorder == "little" else raw).hex().upper() + f":{port:04X}"


def mapped_endpoint(address: str, port: int) -> str:
    """An IPv4 address as a dual-stack socket's end in /proc/net/tcp6 (::ffff:a.b.c.d)."""
    words = ("00000000", "00000000", "FFFF0000" if sys.byteorder == "little" else "0000FFFF")
    return "".join(words) + hex_endpoint(address, port)


def socket_table(
    proc: str | Path, rows: list[tuple[str, str, int, int]], table: str = "net/tcp"
) -> None:
    """net/tcp (or tcp6) of the fake /proc: (local, remote, uid, inode) per socket, each
    ESTABLISHED."""
    lines = [TCP_HEADER]
    lines += [
        f"   {n}: {local} {remote} 01 00000000:00000000 00:00000000 00000000 {uid:>5} "
        f"       0 {inode} 1 0000000000000000 20 4 30 10 -1"
        for n, (local, remote, uid, inode) in enumerate(rows)
    ]
    (Path(proc) / "net").mkdir(parents=True, exist_ok=True)
    (Path(proc) / table).write_text("\n".join(lines) + "\n")


def stat_line(
    pid: int,
    name: str = "python3",
    tty_nr: int = 0,
    utime: int = 0,
    stime: int = 0,
    start: int = 1000,
    ppid: int = 1,
) -> str:
    # Fields 1-22 of proc(5) stat: pid (comm) state ppid pgrp session tty_nr tpgid flags
    # minflt cminflt majflt cmajflt utime stime cutime cstime priority nice threads
    # itrealvalue starttime, then the rest.
    return (
        f"{pid} ({name}) S {ppid} {pid} {pid} {tty_nr} -1 4194560 100 0 0 0 {utime} {stime} 0 0 "
        f"20 0 1 0 {start} 1000000 200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 3\n"
    )


def holding_socket(proc: Path, pid: int, inode: int, read: int = 0, written: int = 0) -> None:
    """Process pid of the fake /proc holds socket `inode` (fd 3) and has read and written
    so much (/proc/PID/io); again: its counts move on."""
    fd_dir = proc / str(pid) / "fd"
    fd_dir.mkdir(parents=True, exist_ok=True)
    link = fd_dir / "3"
    if not link.is_symlink():
        link.symlink_to(f"socket:[{inode}]")
    (proc / str(pid) / "io").write_text(
        f"rchar: {read}\nwchar: {written}\nsyscr: 1\nsyscw: 1\nread_bytes: 0\n"
        "write_bytes: 0\ncancelled_write_bytes: 0\n"
    )
