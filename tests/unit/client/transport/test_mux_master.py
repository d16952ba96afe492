"""The connection master's failure handling (tcloud.transport.mux_master), without an sshd: its
SSH side is stood in for; tests/integration/test_tcloud_mux.py runs it for real."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from pathlib import Path

import paramiko
import pytest

from tcloud.errors import TcloudError
from tcloud.transport import mux_master


def bare_master() -> mux_master.Master:
    """A Master with its bookkeeping but no SSH connection and no socket."""
    master = object.__new__(mux_master.Master)
    master.lock = threading.Lock()
    master.attached = 1
    master.last_seen = time.monotonic()
    master.spares = []
    master.starting = 0
    master.peak = 1
    master.closing = False
    master.why = ""
    return master


@pytest.mark.fault
def test_a_failure_to_give_a_session_is_said_to_the_client(monkeypatch):
    master = bare_master()

    def no_connection() -> None:
        raise TcloudError("cannot connect to login.example: timed out")

    monkeypatch.setattr(master, "take_session", no_connection)
    ours, theirs = socket.socketpair()
    ours.sendall(b'{"op": "session"}\n')
    master.client(theirs)  # returns: the master lives on
    answer = json.loads(ours.makefile("rb").readline())
    assert "timed out" in answer["mux_error"]
    assert master.attached == 0


class SilentChannel:
    """An agent session whose hello never comes."""

    def __init__(self) -> None:
        self.closed = False

    def exec_command(self, command: str) -> None:
        pass

    def settimeout(self, seconds: float | None) -> None:
        pass

    def recv(self, size: int) -> bytes:
        raise TimeoutError("timed out")

    def close(self) -> None:
        self.closed = True


class StandInTransport:
    def __init__(self) -> None:
        self.channels: list[SilentChannel] = []

    def is_active(self) -> bool:
        return True

    def open_session(self, timeout: float) -> SilentChannel:
        self.channels.append(SilentChannel())
        return self.channels[-1]


class StandInClient:
    def __init__(self) -> None:
        self.transport = StandInTransport()

    def get_transport(self) -> StandInTransport:
        return self.transport


def stand_in_connections() -> mux_master.Connections:
    connections = object.__new__(mux_master.Connections)
    connections.lock = threading.Lock()
    connections.open = [[StandInClient(), 0]]
    return connections


@pytest.mark.fault
def test_an_agent_whose_hello_never_comes_is_closed_and_not_counted():
    connections = stand_in_connections()
    started, entry = connections.start_session()
    assert started.channel is None and entry is None and "timed out" in started.error
    assert connections.open[0][0].transport.channels[0].closed  # its agent and sshd session end
    assert connections.open[0][1] == 0  # not counted against MaxSessions


@pytest.mark.fault
def test_a_second_connection_that_fails_is_said_and_not_counted(monkeypatch):
    connections = stand_in_connections()
    connections.open[0][1] = mux_master.PER_CONNECTION  # the first one is full

    def cannot_connect() -> list:
        raise TcloudError("cannot connect: Connection refused")

    monkeypatch.setattr(connections, "add", cannot_connect)
    started, entry = connections.start_session()
    assert started.channel is None and entry is None
    assert "Connection refused" in started.error
    assert connections.open[0][1] == mux_master.PER_CONNECTION


@pytest.mark.fault
def test_a_spare_that_fails_to_start_is_no_longer_counted_as_starting(monkeypatch):
    master = bare_master()
    master.starting = 1

    class Broken:
        def start_session(self) -> None:
            raise RuntimeError("unexpected")

    master.connections = Broken()
    with pytest.raises(RuntimeError):
        master.start_spare()
    assert master.starting == 0  # the spares are refilled again


@pytest.mark.fault
def test_a_socket_path_that_cannot_be_bound_stops_the_master_before_it_logs_in(
    monkeypatch, tmp_path
):
    directory = tmp_path / "m"
    directory.mkdir(mode=0o700)
    logins = []
    monkeypatch.setattr(mux_master, "Connections", lambda settings: logins.append(settings))
    spec = {
        "settings": {"name": "c", "host": "login.example"},
        "socket": str(directory / ("k" * 120 + ".sock")),
        "idle": 300,
    }
    assert mux_master.main(json.dumps(spec)) == 4  # said in its log, no traceback
    assert logins == []


class MuteTransport(StandInTransport):
    """A connection whose server no longer answers (a laptop that slept)."""

    def global_request(self, kind: str, wait: bool) -> None:
        threading.Event().wait()


@pytest.mark.fault
def test_a_connection_quiet_for_a_while_must_answer_before_it_carries_a_session(monkeypatch):
    master = bare_master()
    master.connections = stand_in_connections()
    master.connections.open[0][0].transport = MuteTransport()
    assert not master.connections.answers(deadline=0.2)
    master.last_seen = time.monotonic() - mux_master.PROBE_AFTER - 1
    monkeypatch.setattr(mux_master, "PROBE_TIMEOUT", 0.2)
    stopped = []

    def stop(why: str) -> None:
        stopped.append(why)
        raise SystemExit(0)

    monkeypatch.setattr(master, "stop", stop)
    with pytest.raises(SystemExit):
        master.take_session()
    assert stopped == ["the SSH connection does not answer"]


@pytest.mark.fault
def test_once_idle_the_master_admits_no_client():
    master = bare_master()
    master.attached = 0
    master.idle = 300
    assert not master.close_if_idle()
    _ours, theirs = socket.socketpair()
    assert master.admit(theirs) and master.attached == 1
    assert not master.close_if_idle()  # a client attached: not idle, whatever the clock
    master.attached = 0
    master.last_seen = time.monotonic() - 301
    assert master.close_if_idle()
    late, late_theirs = socket.socketpair()
    assert not master.admit(late_theirs)  # hung up before any hello
    assert master.attached == 0
    assert late.recv(10) == b""


class RefusingTransport(StandInTransport):
    """sshd at MaxSessions: a new channel is administratively prohibited."""

    def open_session(self, timeout: float) -> SilentChannel:
        raise paramiko.ChannelException(1, "Administratively prohibited")


@pytest.mark.fault
def test_a_session_sshd_refuses_is_said_to_the_client_and_not_counted():
    master = bare_master()
    master.connections = stand_in_connections()
    master.connections.open[0][0].transport = RefusingTransport()
    ours, theirs = socket.socketpair()
    ours.sendall(b'{"op": "session"}\n')
    master.client(theirs)
    answer = json.loads(ours.makefile("rb").readline())
    assert "Administratively prohibited" in answer["mux_error"]
    assert master.connections.open[0][1] == 0
    assert master.attached == 0


@pytest.mark.security
def test_a_client_of_another_uid_is_refused_before_any_answer(monkeypatch):
    master = bare_master()
    master.attached = 0
    monkeypatch.setattr(mux_master.mux, "peer_uid", lambda conn: 4242)
    ours, theirs = socket.socketpair()
    assert not master.admit(theirs)
    assert master.attached == 0
    assert ours.recv(10) == b""  # hung up, nothing said


def test_a_spare_older_than_a_minute_is_ended_and_not_restarted_while_idle(monkeypatch):
    master = bare_master()
    master.connections = stand_in_connections()
    master.connections.open[0][1] = 2
    old, fresh = SilentChannel(), SilentChannel()
    entry = master.connections.open[0]
    master.spares = [(mux_master.Started(old, b"hello\n"), entry)]
    master.spares.append((mux_master.Started(fresh, b"hello\n"), entry))
    master.spares[0][0].born -= mux_master.SPARE_MAX_AGE + 1
    refilled = []
    monkeypatch.setattr(master, "refill", lambda: refilled.append(1))
    master.end_old_spares()
    assert old.closed and not fresh.closed
    assert [spare[0].channel for spare in master.spares] == [fresh]
    assert master.connections.open[0][1] == 1 and refilled == []


def closable_master(monkeypatch, tmp_path, first_alive: bool) -> tuple[mux_master.Master, list]:
    """A bare master with a socket file of its own, whose first connection is (not) alive;
    stop() recorded instead of exiting."""
    master = bare_master()
    master.idle = 300
    master.path = str(tmp_path / "m.sock")
    Path(master.path).write_text("")
    master.inode = os.stat(master.path).st_ino
    master.connections = stand_in_connections()
    monkeypatch.setattr(master.connections, "first_alive", lambda: first_alive)
    stopped: list[str] = []
    monkeypatch.setattr(master, "stop", stopped.append)
    return master, stopped


@pytest.mark.fault
def test_a_dropped_connection_lets_attached_commands_finish_then_the_master_exits(
    monkeypatch, tmp_path
):
    # Lab, clean-clone run: a cut connection, then the next submit was served on a second
    # connection the master opened, and the master exited under it ("connection dropped").
    master, stopped = closable_master(monkeypatch, tmp_path, first_alive=False)
    master.tick()
    assert master.closing and not os.path.exists(master.path)  # new commands go direct
    assert stopped == []  # the one attached goes on
    master.attached = 0
    master.tick()
    assert stopped == ["the SSH connection dropped"]


@pytest.mark.fault
def test_no_session_is_given_on_a_dropped_connection_and_none_is_opened_in_its_place(
    monkeypatch, tmp_path
):
    master, _ = closable_master(monkeypatch, tmp_path, first_alive=False)
    monkeypatch.setattr(master.connections, "add", lambda: pytest.fail("a new connection"))
    started, entry = master.take_session()
    assert started.channel is None and entry is None and "dropped" in started.error
    assert master.closing


def test_an_idle_master_with_nobody_attached_exits(monkeypatch, tmp_path):
    master, stopped = closable_master(monkeypatch, tmp_path, first_alive=True)
    master.attached = 0
    master.last_seen -= master.idle + 1
    master.tick()
    assert stopped == [f"idle for {master.idle} s"]
