"""This node's processes from /proc/PID (tacc_agent/procfs/processes.py): the stat line
after an odd command name, a process's start as a clock time, the bounded reads of a
user's command line and environment, the sockets a process holds and its I/O counts,
the tree below a process; on fake trees and on the real /proc."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from tacc_agent.procfs import read_bytes
from tacc_agent.procfs.processes import (
    TITLE_BYTES,
    Stat,
    environment,
    io_chars,
    own_fd_path,
    parse_stat,
    pids,
    process_tree,
    process_uids,
    socket_holders,
    started_at,
)
from tests.unit.proc_fakes import holding_socket, stat_line


def test_stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses():
    line = stat_line(7, name="my (odd) prog", tty_nr=34816, utime=5, stime=3, start=42, ppid=6)
    assert parse_stat(line.encode()) == Stat(
        ppid=6, tty_nr=34816, cpu_ticks=8, reaped_ticks=0, started=42
    )
    assert parse_stat(b"7 (cut") is None


def test_a_process_start_is_just_before_now_and_a_child_started_later():
    started = started_at()
    assert started is not None
    assert started <= time.time()  # this process (a test worker) may be long-lived
    launched = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        time.sleep(0.2)
        child_started = started_at(child.pid)
        assert child_started is not None
        # 10 ms clock ticks: the start may read up to one tick early.
        assert started <= child_started and launched - 0.02 <= child_started <= time.time()
        assert child.pid in process_tree()[os.getpid()]
    finally:
        child.kill()
        child.wait()


def test_a_gone_process_has_no_start():
    assert started_at(2**22 + 12345) is None


@pytest.mark.security
def test_the_daemon_reads_no_more_of_a_command_line_than_a_step_title(tmp_path):
    """A task controls its own command line (up to 2 MiB): the root daemon reads 64 bytes."""
    long_title = b"x" * (2 << 20)
    (tmp_path / "cmdline").write_bytes(long_title)
    assert len(read_bytes(str(tmp_path / "cmdline"), TITLE_BYTES)) == 64


def test_an_environment_has_each_name_first_value_and_is_read_no_further_than_asked(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7/environ").write_bytes(b"A=1\0SLURM_JOB_ID=42\0SLURM_JOB_ID=43\0B\0C=x=y\0")
    assert environment(str(tmp_path), 7) == {"A": "1", "SLURM_JOB_ID": "42", "C": "x=y"}
    assert environment(str(tmp_path), 7, most=4) == {"A": "1"}
    assert environment(str(tmp_path), 8) is None  # ended, or another user's


def test_the_holders_of_a_socket_are_the_owners_processes_with_it_open(tmp_path):
    holding_socket(tmp_path, 500, inode=4174847, read=10, written=20)
    holding_socket(tmp_path, 501, inode=99)
    (tmp_path / "502").mkdir()  # no fd to read: ended meanwhile
    (tmp_path / "self").mkdir()
    uid = os.getuid()
    assert socket_holders(str(tmp_path), {4174847}, uid) == {4174847: {500}}
    assert socket_holders(str(tmp_path), {4174847}, uid + 1) == {}  # not that user's
    assert socket_holders(str(tmp_path), set(), uid) == {}
    assert io_chars(str(tmp_path), 500) == (10, 20)
    assert io_chars(str(tmp_path), 502) is None
    with pytest.raises(OSError):
        socket_holders(str(tmp_path / "none"), {1}, uid)


def test_this_process_holds_its_own_socket_and_its_writes_are_counted():
    """On the real /proc: the inode of a socket this process opened leads back to it,
    and bytes it writes move its wchar."""
    with socket.socket() as sock:
        inode = os.fstat(sock.fileno()).st_ino
        assert socket_holders("/proc", {inode}, os.getuid()) == {inode: {os.getpid()}}
    before = io_chars("/proc", os.getpid())
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, b"x" * 1000)
        os.read(read_fd, 1000)
    finally:
        os.close(read_fd)
        os.close(write_fd)
    after = io_chars("/proc", os.getpid())
    assert before is not None and after is not None
    assert after[0] - before[0] >= 1000 and after[1] - before[1] >= 1000


def test_everyone_running_is_read_from_the_status_uid_lines(tmp_path):
    for pid, uids in ((1, "0\t0\t0\t0"), (7, "1001\t1001\t1002\t1001")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uids}\nGid:\t0\t0\t0\t0\n")
    (tmp_path / "8").mkdir()  # ended meanwhile
    assert process_uids(str(tmp_path)) == {0, 1001, 1002}
    assert process_uids(str(tmp_path / "8")) is None  # nothing readable
    assert process_uids(str(tmp_path / "none")) is None
    assert sorted(pids(str(tmp_path))) == [1, 7, 8]


def test_an_open_file_has_a_path_while_it_is_open(tmp_path):
    with (tmp_path / "f").open("w") as handle:
        assert os.path.samefile(own_fd_path(handle.fileno()), tmp_path / "f")
