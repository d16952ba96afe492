"""The idle watchdog of an interactive session (issue [14], tasks/interactive/idle.py): its
samplers over a fake /proc tree (processes, socket tables, the I/O of the processes that
hold a connection's end) and fake terminals, and its decision over a fake clock (idle ->
one cancel, activity resets the count, "0" never cancels); ps's kind and status's
session."""

from __future__ import annotations

import json
import os
import socket
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
    read_connections,
    terminal_path,
    terminal_times,
)
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs import verbs as jobs
from tests.unit.agent_jobs import make_job
from tests.unit.proc_fakes import (
    hex_endpoint,
    holding_socket,
    mapped_endpoint,
    socket_table,
    stat_line,
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
OWNER = os.getuid()  # the fake /proc's processes are this user's
RELAY_PID, SESSION_INODE, RELAY_INODE = 500, 4174848, 4174847


def loopback_connection(proc: Path, peer_uid: int, session_uid: int = OWNER) -> None:
    """Both ends of one loopback connection to the session's port 8888, as the kernel
    lists them: the session's end on a dual-stack listener (tcp6, IPv4-mapped), the
    other end (127.0.0.1:51336, a relay's) in tcp, each with its owner and inode."""
    session, relay = ("127.0.0.1", 8888), ("127.0.0.1", 51336)
    socket_table(proc, [(hex_endpoint(*relay), hex_endpoint(*session), peer_uid, RELAY_INODE)])
    socket_table(
        proc,
        [(mapped_endpoint(*session), mapped_endpoint(*relay), session_uid, SESSION_INODE)],
        table="net/tcp6",
    )


def test_a_connection_from_the_owners_own_process_is_forwarded_traffic(tmp_path):
    """`tcloud forward`'s relay runs as the owner on the node: the bytes it moves count."""
    loopback_connection(tmp_path, OWNER)
    holding_socket(tmp_path, RELAY_PID, RELAY_INODE, read=10, written=5)
    before = read_connections([8888], owner=OWNER, proc_root=tmp_path)
    holding_socket(tmp_path, RELAY_PID, RELAY_INODE, read=99, written=5)
    after = read_connections([8888], owner=OWNER, proc_root=tmp_path)
    assert before == {"127.0.0.1:8888 127.0.0.1:51336": (10, 5)}
    assert activity(idle.sample_of(0, before, [], {}), idle.sample_of(5, after, [], {}), 100) == [
        "forwarded traffic"
    ]
    still = read_connections([8888], owner=OWNER, proc_root=tmp_path)
    assert activity(idle.sample_of(5, after, [], {}), idle.sample_of(9, still, [], {}), 100) == []


def test_a_new_connection_of_the_owner_is_forwarded_traffic_even_unheld(tmp_path):
    """No process here found holding the owner's end (it ended, or is not readable): the
    connection still counts when it appears."""
    loopback_connection(tmp_path, OWNER)
    found = read_connections([8888], owner=OWNER, proc_root=tmp_path)
    assert found == {"127.0.0.1:8888 127.0.0.1:51336": (0, 0)}
    assert activity(idle.sample_of(0, {}, [], {}), idle.sample_of(5, found, [], {}), 100) == [
        "forwarded traffic"
    ]


@pytest.mark.security
def test_another_users_connection_does_not_keep_the_session_alive(tmp_path):
    """Another user on the node (uid + 1) connects to bob's notebook port and moves
    bytes: no forwarded traffic for bob's session, so it still stops when idle."""
    other = OWNER + 1
    loopback_connection(tmp_path, other)
    holding_socket(tmp_path, RELAY_PID, RELAY_INODE, read=10)
    before = read_connections([8888], proc_root=tmp_path)
    holding_socket(tmp_path, RELAY_PID, RELAY_INODE, read=99)
    after = read_connections([8888], proc_root=tmp_path)
    assert before == after == {}
    assert activity(idle.sample_of(0, before, [], {}), idle.sample_of(5, after, [], {}), 100) == []


def test_a_connection_from_another_host_is_not_the_owners(tmp_path):
    """Its peer has no socket on this node: its uid is unknown, so it does not count."""
    session, peer = ("10.77.6.12", 8888), ("10.77.6.1", 33132)
    socket_table(tmp_path, [(hex_endpoint(*session), hex_endpoint(*peer), OWNER, 1)])
    assert read_connections([8888], owner=OWNER, proc_root=tmp_path) == {}


def test_only_the_sessions_ports_count(tmp_path):
    loopback_connection(tmp_path, OWNER)
    assert read_connections([6006], owner=OWNER, proc_root=tmp_path) == {}


def test_no_ports_reads_nothing(tmp_path):
    assert read_connections([], proc_root=tmp_path / "none") == {}


@pytest.mark.fault
def test_unreadable_socket_tables_stop_the_watch_rather_than_cancel_blind(tmp_path):
    with pytest.raises(WatchError, match="cannot list this node's connections"):
        read_connections([8888], proc_root=tmp_path / "none")


def test_a_real_connection_of_this_user_and_the_bytes_it_moves_are_seen():
    """On the real /proc: a connection this process makes to a port it listens on is
    found with its owner, and what this process writes moves its counts."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        with client, accepted:
            name = f"127.0.0.1:{port} 127.0.0.1:{client.getsockname()[1]}"
            before = read_connections([port])
            os.write(client.fileno(), b"x" * 1000)  # write(2): counted, as the relay's
            accepted.recv(1000)
            after = read_connections([port])
    assert list(before) == list(after) == [name]
    assert activity(idle.sample_of(0, before, [], {}), idle.sample_of(5, after, [], {}), 100) == [
        "forwarded traffic"
    ]


# ---------------------------------------------------------------- the job's processes
def fake_proc(root: Path, pid: int, job: str | None, stat: str) -> None:
    entry = root / str(pid)
    entry.mkdir(parents=True)
    env = [b"HOME=/home/alice", b"PATH=/usr/bin"]
    if job is not None:
        env.append(f"SLURM_JOB_ID={job}".encode())
    (entry / "environ").write_bytes(b"\0".join(env) + b"\0")
    (entry / "stat").write_text(stat)


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
    before = Sample(0, {"a b": (1, 2)}, {(10, 1): 50}, {"/dev/pts/1": 5.0})
    after = Sample(10, {"a b": (1, 2)}, {(10, 1): 50}, {"/dev/pts/1": 5.0})
    assert activity(before, after, TICKS) == []


@pytest.mark.parametrize(
    ("after", "kind"),
    [
        (Sample(10, {"a b": (1, 9)}, {(10, 1): 50}), "forwarded traffic"),
        (Sample(10, {"a b": (1, 2), "a c": (0, 0)}, {(10, 1): 50}), "forwarded traffic"),
        (Sample(10, {"a b": (1, 2)}, {(10, 1): 100}), "a busy process"),  # 5% of 1 CPU
        (Sample(10, {"a b": (1, 2)}, {(10, 1): 50, (11, 9): 60}), "a busy process"),
        (Sample(10, {"a b": (1, 2)}, {(10, 1): 50}, {"/dev/pts/1": 9.0}), "typing"),
        (Sample(10, {"a b": (1, 2)}, {(10, 1): 50}, {"/dev/pts/2": 1.0}), "typing"),
    ],
)
def test_each_kind_of_use_is_activity(after, kind):
    before = Sample(0, {"a b": (1, 2)}, {(10, 1): 50}, {})
    if "/dev/pts/1" in after.terminals:
        before = Sample(0, before.connections, before.cpu_ticks, {"/dev/pts/1": 5.0})
    assert activity(before, after, TICKS) == [kind]


def test_a_little_cpu_or_a_closed_connection_is_not_activity():
    before = Sample(0, {"a b": (1, 2)}, {(10, 1): 50, (11, 1): 5})
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
        raise WatchError("cannot list this node's connections: no such file")

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
    monkeypatch.setattr(idle.slurm.run, "output", lambda argv, timeout: calls.append(argv) or "")
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

    monkeypatch.setattr(idle.slurm.run, "output", fails_once)
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

    monkeypatch.setattr(idle.slurm.run, "output", down)
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
    monkeypatch.setattr(jobs.slurm.run, "output", lambda _argv, _timeout, **_how: "")
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
    monkeypatch.setattr(idle.slurm.run, "output", scancel)
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
