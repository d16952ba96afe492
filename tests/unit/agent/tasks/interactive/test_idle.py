"""The idle watchdog of an interactive session (issue [14], tasks/interactive/idle.py): its samplers
over a fake /proc tree, fake ss output and fake terminals, and its decision over a fake
clock (idle -> one cancel, activity resets the count, "0" never cancels); ps's kind and
status's session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.execute import launch as execute
from tacc_agent.tasks.interactive import idle
from tacc_agent.tasks.interactive.idle import (
    JobProcess,
    Sample,
    Watchdog,
    WatchError,
    activity,
    idle_seconds,
    interval_for,
    job_processes,
    parse_ss,
    parse_stat,
    read_connections,
    ss_argv,
    terminal_path,
    terminal_times,
)
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs import verbs as jobs
from tests.unit.agent_jobs import make_job

# As `ss -tinH state established '( sport = :22 )'` printed it on lab node n2 (iproute2 6.1).
SS_TEXT = (
    "0      68     10.77.6.12:8888 10.77.6.1:33132\n"
    "\t bbr wscale:10,10 rto:208 rtt:6.146/11.25 ato:40 mss:1448 pmtu:1500 cwnd:21 "
    "bytes_sent:3497 bytes_acked:3429 bytes_received:3772 segs_out:16 segs_in:19 "
    "bbr:(bw:565072624bps,mrtt:0.025) send 39580866bps lastsnd:4 lastrcv:8\n"
    "0      0      [::ffff:10.77.6.12]:6006 [::ffff:10.77.6.1]:40000\n"
    "\t cubic wscale:7,7 rto:204 bytes_sent:10 bytes_received:20 segs_out:2\n"
)


# ---------------------------------------------------------------- settings
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("0:20", 20), ("1:00:00", 3600), ("0", None), ("UNLIMITED", None)],
)
def test_idle_timeout_is_read_as_slurm_reads_a_time(text, seconds):
    assert idle_seconds(text) == seconds


@pytest.mark.parametrize(("idle", "interval"), [(6, 2.0), (20, 3.3333333333333335), (1800, 30.0)])
def test_the_interval_is_a_sixth_of_the_limit_from_2_to_30_seconds(idle, interval):
    assert interval_for(idle) == interval


# ---------------------------------------------------------------- forwarded traffic
def test_ss_is_asked_for_both_ends_of_the_sessions_connections_with_their_owners():
    filters = "sport = :8888 or dport = :8888 or sport = :6006 or dport = :6006"
    assert ss_argv([8888, 6006]) == [
        "ss",
        "-tineH",
        "state",
        "established",
        "(",
        *filters.split(),
        ")",
    ]


def test_ss_output_gives_each_socket_its_ends_owner_and_byte_counters():
    assert parse_ss(SS_TEXT) == [
        idle.Socket("10.77.6.12:8888", "10.77.6.1:33132", 0, (3772, 3497, 3429)),
        idle.Socket("10.77.6.12:6006", "10.77.6.1:40000", 0, (20, 10, 0)),  # mapped: plain
    ]
    assert parse_ss("") == []


# Both ends of one loopback connection to the session's port 8888, as `ss -tineH` prints
# them (the format checked against iproute2's ss: uid only when not root's, v4-mapped on
# a dual-stack listener); the session's end is the owner's (uid 2001).
def loopback_pair(peer_uid: int, received: int) -> str:
    return (
        f"0      0      127.0.0.1:51336 127.0.0.1:8888 uid:{peer_uid} ino:4174847 sk:1 <->\n"
        f"\t ts sack cubic wscale:10,10 bytes_sent:{received} bytes_acked:{received + 1}\n"
        "0      0      [::ffff:127.0.0.1]:8888 [::ffff:127.0.0.1]:51336 uid:2001 ino:4174848 "
        "sk:2 <->\n"
        f"\t ts sack cubic wscale:10,10 bytes_received:{received} segs_in:3\n"
    )


def ss_printing(text: str):
    return lambda argv, **_kwargs: subprocess.CompletedProcess(argv, 0, text, "")


def test_a_connection_from_the_owners_own_process_is_forwarded_traffic():
    """`tcloud forward`'s relay runs as the owner on the node: its traffic counts."""
    before = read_connections([8888], ss_printing(loopback_pair(2001, 10)), owner=2001)
    after = read_connections([8888], ss_printing(loopback_pair(2001, 99)), owner=2001)
    assert before == {"127.0.0.1:8888 127.0.0.1:51336": (10, 0, 0)}
    assert activity(idle.sample_of(0, before, [], {}), idle.sample_of(5, after, [], {}), 100) == [
        "forwarded traffic"
    ]


@pytest.mark.security
def test_another_users_connection_does_not_keep_the_session_alive():
    """Another user on the node (uid 2002) connects to bob's notebook port and moves
    bytes: no forwarded traffic for bob's session, so it still stops when idle."""
    owner, other = os.getuid(), os.getuid() + 1
    text = loopback_pair(other, 10).replace("uid:2001", f"uid:{owner}")
    busier = loopback_pair(other, 99).replace("uid:2001", f"uid:{owner}")
    before = read_connections([8888], ss_printing(text))
    after = read_connections([8888], ss_printing(busier))
    assert activity(idle.sample_of(0, before, [], {}), idle.sample_of(5, after, [], {}), 100) == []


def test_a_connection_from_another_host_is_not_the_owners():
    """Its peer has no socket on this node: its uid is unknown, so it does not count."""
    assert read_connections([8888], ss_printing(SS_TEXT), owner=0) == {}


def test_no_ports_asks_ss_nothing():
    def run(*_args, **_kwargs):
        raise AssertionError("ss was run")

    assert read_connections([], run) == {}


@pytest.mark.fault
def test_a_missing_or_failing_ss_stops_the_watch_rather_than_cancel_blind():
    def missing(*_args, **_kwargs):
        raise FileNotFoundError(2, "No such file or directory", "ss")

    def failing(argv, **_kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "ss: bad filter\n")

    for run in (missing, failing):
        with pytest.raises(WatchError):
            read_connections([8888], run)


# ---------------------------------------------------------------- the job's processes
def stat_line(
    pid: int,
    name: str = "python3",
    tty_nr: int = 0,
    utime: int = 0,
    stime: int = 0,
    start: int = 1000,
) -> str:
    # Fields 1-22 of proc(5) stat: pid (comm) state ppid pgrp session tty_nr tpgid flags
    # minflt cminflt majflt cmajflt utime stime cutime cstime priority nice threads
    # itrealvalue starttime, then the rest.
    return (
        f"{pid} ({name}) S 1 {pid} {pid} {tty_nr} -1 4194560 100 0 0 0 {utime} {stime} 0 0 "
        f"20 0 1 0 {start} 1000000 200 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 3\n"
    )


def fake_proc(root: Path, pid: int, job: str | None, stat: str) -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    env = [b"HOME=/home/alice", b"PATH=/usr/bin"]
    if job is not None:
        env.append(f"SLURM_JOB_ID={job}".encode())
    (entry / "environ").write_bytes(b"\0".join(env) + b"\0")
    (entry / "stat").write_text(stat)


def test_stat_fields_are_read_after_a_command_name_with_spaces_and_parentheses():
    line = stat_line(7, name="my (odd) prog", tty_nr=34816, utime=5, stime=3, start=42)
    assert parse_stat(line) == (34816, 8, 42)
    assert parse_stat("7 (cut") is None


def test_only_this_jobs_processes_are_the_jobs(tmp_path):
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "42", stat_line(10, utime=7, stime=1, tty_nr=34818, start=500))
    fake_proc(proc, 11, "43", stat_line(11))  # another job of the same user
    fake_proc(proc, 12, None, stat_line(12))  # not a Slurm process
    fake_proc(proc, 13, "42", stat_line(13))  # the watchdog's own process
    (proc / "self").mkdir()
    (proc / "14").mkdir()  # exited while listed: nothing left to read
    found = job_processes(proc, "42", os.getuid(), exclude=[13])
    assert found == [JobProcess(pid=10, started=500, cpu_ticks=8, tty_nr=34818)]


@pytest.mark.security
def test_another_users_processes_are_never_the_jobs(tmp_path):
    """Same job id in the environment, another uid: not read (and not readable on a node)."""
    proc = tmp_path / "proc"
    fake_proc(proc, 10, "42", stat_line(10))
    assert job_processes(proc, "42", os.getuid() + 1) == []


def test_a_controlling_terminal_number_names_its_dev_pts_entry(tmp_path):
    assert terminal_path(0, tmp_path) is None
    assert terminal_path((136 << 8) | 2, tmp_path) == tmp_path / "pts" / "2"
    assert terminal_path((137 << 8) | 1, tmp_path) == tmp_path / "pts" / "257"
    # minor 300 on major 136: the high minor bits sit at bits 20-31
    assert terminal_path((136 << 8) | (300 & 0xFF) | ((300 & ~0xFF) << 12), tmp_path) == (
        tmp_path / "pts" / "300"
    )
    assert terminal_path((4 << 8) | 1, tmp_path) is None  # /dev/tty1, not a pty


def test_a_terminals_last_use_is_the_later_of_its_read_and_write_times(tmp_path):
    (tmp_path / "pts").mkdir()
    pts = tmp_path / "pts" / "3"
    pts.write_text("")
    os.utime(pts, (2000, 1000))
    processes = [JobProcess(1, 1, 0, (136 << 8) | 3), JobProcess(2, 1, 0, (136 << 8) | 9)]
    assert terminal_times(processes, tmp_path) == {str(pts): 2000}


# ---------------------------------------------------------------- what counts as use
TICKS = 100.0


def test_no_change_is_no_activity():
    before = Sample(0, {"a b": (1, 2, 3)}, {(10, 1): 50}, {"/dev/pts/1": 5.0})
    after = Sample(10, {"a b": (1, 2, 3)}, {(10, 1): 50}, {"/dev/pts/1": 5.0})
    assert activity(before, after, TICKS) == []


@pytest.mark.parametrize(
    ("after", "kind"),
    [
        (Sample(10, {"a b": (1, 2, 9)}, {(10, 1): 50}), "forwarded traffic"),
        (Sample(10, {"a b": (1, 2, 3), "a c": (0, 0, 0)}, {(10, 1): 50}), "forwarded traffic"),
        (Sample(10, {"a b": (1, 2, 3)}, {(10, 1): 100}), "a busy process"),  # 5% of 1 CPU
        (Sample(10, {"a b": (1, 2, 3)}, {(10, 1): 50, (11, 9): 60}), "a busy process"),
        (Sample(10, {"a b": (1, 2, 3)}, {(10, 1): 50}, {"/dev/pts/1": 9.0}), "typing"),
        (Sample(10, {"a b": (1, 2, 3)}, {(10, 1): 50}, {"/dev/pts/2": 1.0}), "typing"),
    ],
)
def test_each_kind_of_use_is_activity(after, kind):
    before = Sample(0, {"a b": (1, 2, 3)}, {(10, 1): 50}, {})
    if "/dev/pts/1" in after.terminals:
        before = Sample(0, before.connections, before.cpu_ticks, {"/dev/pts/1": 5.0})
    assert activity(before, after, TICKS) == [kind]


def test_a_little_cpu_or_a_closed_connection_is_not_activity():
    before = Sample(0, {"a b": (1, 2, 3)}, {(10, 1): 50, (11, 1): 5})
    after = Sample(10, {}, {(10, 1): 99})  # 4.9% of a CPU; pid 11 exited
    assert activity(before, after, TICKS) == []


# ---------------------------------------------------------------- the decision, on a fake clock
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return self.now > 10_000  # a test that never cancels ends here ("stopped")


def watchdog(idle_for: float, busy_until: float = -1.0) -> tuple[Watchdog, list[float], FakeClock]:
    fake, cancels = FakeClock(), []
    ticks = {"n": 0}

    def take(now: float) -> Sample:
        if now <= busy_until:
            ticks["n"] += 100  # a whole CPU while busy
        return Sample(now, {}, {(10, 1): ticks["n"]}, {})

    dog = Watchdog(
        idle=idle_for,
        take_sample=take,
        cancel=lambda s: cancels.append(s) or True,
        clock=fake.clock,
        wait=fake.wait,
        ticks_per_second=TICKS,
        say=lambda _m: None,
    )
    return dog, cancels, fake


def test_an_idle_session_is_cancelled_once_after_its_idle_timeout():
    dog, cancels, fake = watchdog(20)
    assert dog.run() is True
    assert cancels == [pytest.approx(20, abs=interval_for(20))]
    assert fake.now == pytest.approx(20, abs=interval_for(20))
    assert set(fake.waits) == {interval_for(20)}


def test_activity_resets_the_idle_count():
    dog, cancels, fake = watchdog(20, busy_until=100)
    assert dog.run() is True
    assert len(cancels) == 1
    # Busy until t=100: the cancel comes a whole idle_timeout after the last busy sample.
    assert 120 <= fake.now <= 120 + interval_for(20) + 1e-9


def test_a_stopped_watchdog_never_cancels():
    fake, cancels = FakeClock(), []
    dog = Watchdog(
        idle=1800,
        take_sample=lambda now: Sample(now),
        cancel=cancels.append,
        clock=fake.clock,
        wait=lambda _s: True,
        say=lambda _m: None,
    )
    assert dog.run() is False and cancels == []


@pytest.mark.fault
def test_a_sampler_that_cannot_read_stops_the_watch_without_a_cancel():
    said, cancels, fake = [], [], FakeClock()

    def take(_now: float) -> Sample:
        raise WatchError("cannot list connections with ss: not found")

    dog = Watchdog(
        idle=20,
        take_sample=take,
        cancel=cancels.append,
        clock=fake.clock,
        wait=fake.wait,
        say=said.append,
    )
    assert dog.run() is False and cancels == []
    assert "not stopped when idle" in said[0]


@pytest.mark.parametrize("session", [None, {"idle_timeout": "0"}, {"idle_timeout": "UNLIMITED"}])
def test_no_watchdog_for_a_job_or_a_session_that_is_never_idle_stopped(tmp_path, session):
    assert idle.start(session, tmp_path, "42", 5, lambda _m: None) is None


def test_no_watchdog_outside_slurm(tmp_path):
    assert idle.start({"idle_timeout": "30"}, tmp_path, "", 5, lambda _m: None) is None


def test_the_cancel_scancels_the_job_then_records_why(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(idle.slurm, "slurm", lambda argv, timeout: calls.append(argv) or "")
    (tmp_path / "status").mkdir()
    assert idle.canceller(tmp_path, "42", 5, lambda _m: None)(1805.0) is True
    assert calls == [["scancel", "42"]]
    last = records.history(tmp_path)[-1]
    assert last["state"] == "CANCELLED"
    assert last["reason"] == (
        "session idle for 30:05: no forwarded traffic, no busy process, no typing"
    )


@pytest.mark.fault
def test_a_failing_scancel_is_tried_again_and_recorded_only_after_it_succeeded(
    tmp_path, monkeypatch
):
    (tmp_path / "status").mkdir()
    calls, said, waits = [], [], []

    def fails_once(argv, _timeout):
        calls.append(argv)
        if len(calls) == 1:
            assert records.history(tmp_path) == []  # nothing recorded before Slurm took it
            raise AgentError("scancel: Unable to contact slurm controller")
        return ""

    monkeypatch.setattr(idle.slurm, "slurm", fails_once)
    cancel = idle.canceller(tmp_path, "42", 5, said.append, wait=lambda s: waits.append(s) or False)
    assert cancel(1805.0) is True
    assert calls == [["scancel", "42"]] * 2 and waits == [idle.SCANCEL_RETRY_DELAYS[0]]
    events = records.history(tmp_path)
    assert [e["state"] for e in events] == ["CANCELLED"]
    assert any("scancel failed" in line for line in said)


@pytest.mark.fault
def test_a_scancel_that_never_succeeds_records_nothing_and_says_so(tmp_path, monkeypatch):
    (tmp_path / "status").mkdir()
    calls, said = [], []

    def down(argv, _timeout):
        calls.append(argv)
        raise AgentError("scancel: Unable to contact slurm controller")

    monkeypatch.setattr(idle.slurm, "slurm", down)
    cancel = idle.canceller(tmp_path, "42", 5, said.append, wait=lambda _s: False)
    assert cancel(1805.0) is False
    assert len(calls) == len(idle.SCANCEL_RETRY_DELAYS) + 1 == 5
    assert sum(idle.SCANCEL_RETRY_DELAYS) <= 40
    assert records.history(tmp_path) == []
    assert "the session keeps running" in said[-1]


def test_the_watch_goes_on_after_a_cancel_that_failed_and_tries_again():
    fake, tries = FakeClock(), []
    dog = Watchdog(
        idle=20,
        take_sample=lambda now: Sample(now, {}, {(10, 1): 0}, {}),
        cancel=lambda s: tries.append(s) or len(tries) == 2,
        clock=fake.clock,
        wait=fake.wait,
        ticks_per_second=TICKS,
        say=lambda _m: None,
    )
    assert dog.run() is True
    assert len(tries) == 2 and tries[1] > tries[0]


def test_a_started_watchdog_stops_with_the_run(tmp_path, monkeypatch):
    monkeypatch.setattr(idle, "read_connections", lambda _ports, **_owner: {})
    said: list[str] = []
    running = idle.start({"idle_timeout": "30", "ports": [8888]}, tmp_path, "42", 5, said.append)
    assert running is not None and running.thread.is_alive()
    running.stop()
    assert not running.thread.is_alive()
    assert "30:00" in said[0]


# ---------------------------------------------------------------- ps kind, status session
def job_dir_with(tmp_path: Path, task: dict) -> Path:
    job_dir = tmp_path / "job"
    job_dir.mkdir(parents=True)
    (job_dir / "instruction.json").write_text(json.dumps({"task": task}))
    return job_dir


def test_ps_kind_is_session_for_a_session_and_job_otherwise(tmp_path):
    session = job_dir_with(tmp_path / "a", {"name": "s", "session": {"ports": [8888]}})
    plain = job_dir_with(tmp_path / "b", {"name": "j"})
    assert jobs.kind_of(session) == "session"
    assert jobs.kind_of(plain) == "job"
    assert jobs.kind_of(tmp_path / "missing") == "job"


def test_status_session_is_the_tasks_settings_with_defaults_or_null():
    assert jobs.session_settings({"task": {"session": {"ports": [8888]}}}) == {
        "ports": [8888],
        "idle_timeout": "30",
        "stop_on_disconnect": False,
    }
    assert jobs.session_settings({"task": {"name": "j"}}) is None
    assert jobs.session_settings({}) is None


def test_ps_rows_carry_their_kind(tmp_path, monkeypatch):
    session = job_dir_with(tmp_path / "a", {"name": "s", "session": {"idle_timeout": "0"}})
    plain = job_dir_with(tmp_path / "b", {"name": "j"})
    index = [
        SimpleNamespace(job_id="7", job_dir=plain),
        SimpleNamespace(job_id="8", job_dir=session),
    ]
    monkeypatch.setattr(jobs.submitting, "resolve", lambda _user_dir, _config: [])
    monkeypatch.setattr(jobs.slurm, "slurm", lambda _argv, _timeout: "")
    monkeypatch.setattr(jobs.workspace, "entries", lambda _user_dir: index)
    monkeypatch.setattr(jobs, "own_info", lambda _job_id, _job_dir, _config: None)
    config = SimpleNamespace(slurm_timeout_seconds=5)
    rows = jobs.ps(tmp_path, config)  # type: ignore[arg-type]
    assert [(row["job"], row["kind"]) for row in rows] == [("8", "session"), ("7", "job")]


def real_sample(job_id: str, now: float) -> Sample:
    processes = job_processes(Path("/proc"), job_id, os.getuid(), exclude=[os.getpid()])
    return idle.sample_of(now, {}, processes, terminal_times(processes, Path("/dev")))


@pytest.mark.parametrize(
    ("program", "busy"), [("while True: pass", True), ("import time; time.sleep(60)", False)]
)
def test_a_real_job_process_is_found_and_its_cpu_use_measured(program, busy):
    job_id = f"h3-{os.getpid()}-{busy}"
    env = {**os.environ, "SLURM_JOB_ID": job_id}
    # Its own session: no controlling terminal whose use would count as typing.
    child = subprocess.Popen([sys.executable, "-c", program], env=env, start_new_session=True)
    try:
        time.sleep(0.3)
        first = real_sample(job_id, time.monotonic())
        time.sleep(1.0)
        second = real_sample(job_id, time.monotonic())
    finally:
        child.kill()
        child.wait()
    assert [pid for pid, _ in second.cpu_ticks] == [child.pid]
    found = activity(first, second, float(os.sysconf("SC_CLK_TCK")))
    assert found == (["a busy process"] if busy else [])


# ---------------------------------------------------------------- in the batch step
def session_job(tmp_path: Path, idle_timeout: str) -> Path:
    """A committed job whose instruction (as tcloud writes it) holds a session."""
    _user_dir, job_dir = make_job(tmp_path, {"name": "lab", "run": ["sleep infinity"]})
    document = json.loads((job_dir / "instruction.json").read_text())
    document["task"]["session"] = {
        "ports": [18888],
        "idle_timeout": idle_timeout,
        "stop_on_disconnect": False,
    }
    (job_dir / "instruction.json").write_text(json.dumps(document))
    return job_dir


def test_the_batch_step_cancels_an_idle_session_once_and_stops_its_watchdog(tmp_path, monkeypatch):
    """The real batch step, its run line a fake that waits to be cancelled: the watchdog
    (idle 2 s) records CANCELLED with why, scancels the job once, and is gone after."""
    job_dir = session_job(tmp_path, "0:02")
    cancelled, calls = threading.Event(), []

    def scancel(argv, _timeout):
        calls.append(argv)
        cancelled.set()
        return ""

    def run_line(argv, _cwd, _env, _forwarder, _sink):
        assert argv[0] == "srun"
        assert cancelled.wait(30), "the idle session was not cancelled"
        return 143

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setattr(idle, "read_connections", lambda _ports, **_owner: {})
    monkeypatch.setattr(idle.slurm, "slurm", scancel)
    monkeypatch.setattr(execute, "run_line", run_line)
    monkeypatch.setattr(execute, "become_subreaper", lambda: None)
    before = {t.name for t in threading.enumerate()}
    assert execute.batch(job_dir, AgentConfig()) == 143
    assert calls == [["scancel", "4242"]]
    last = records.history(job_dir)[-1]
    assert last["state"] == "CANCELLED" and last["reason"].startswith("session idle for 0:0")
    assert "idle-watchdog" not in {t.name for t in threading.enumerate()} - before


def test_the_batch_step_starts_no_watchdog_for_a_session_never_idle_stopped(tmp_path, monkeypatch):
    job_dir = session_job(tmp_path, "0")
    monkeypatch.setenv("SLURM_JOB_ID", "4243")
    started = []
    real_start = idle.start
    monkeypatch.setattr(idle, "start", lambda *args: started.append(real_start(*args)))
    monkeypatch.setattr(execute, "run_line", lambda *_args: 0)
    monkeypatch.setattr(execute, "become_subreaper", lambda: None)
    assert execute.batch(job_dir, AgentConfig()) == 0
    assert started == [None]
    assert records.history(job_dir)[-1]["state"] == "COMPLETED"


@pytest.mark.fault
def test_an_unreadable_proc_is_a_watch_error(tmp_path, monkeypatch):
    monkeypatch.setattr(idle, "read_connections", lambda _ports, **_owner: {})
    take = idle.node_sampler([8888], "42", proc_root=tmp_path / "no-proc")
    with pytest.raises(WatchError, match="cannot list this node's processes"):
        take(0.0)
