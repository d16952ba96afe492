"""Exec channels carried by the connection master: the master's relay
(tcloud.transport.mux_master.ExecRelay) and the command's end
(tcloud.transport.mux_channel.MuxChannel) over a socket pair, with the SSH channel stood
in for; tests/integration/test_tcloud_interactive.py runs them for real."""

from __future__ import annotations

import json
import queue
import select
import socket
import threading
import time

import pytest

from tcloud.errors import TcloudError
from tcloud.transport import frames, mux, mux_channel, mux_master
from tests.unit.client.transport.test_mux_master import bare_master, stand_in_connections


class StandInChannel:
    """An SSH exec channel: what the remote command prints comes from `said` (stream,
    bytes; None ends it), what it is sent is kept."""

    def __init__(self, status: int = 0) -> None:
        self.out: queue.Queue = queue.Queue()
        self.err: queue.Queue = queue.Queue()
        self.status = status
        self.sent = bytearray()
        self.events: list = []
        self.closed = threading.Event()
        self.pty = None
        self.command = None

    def get_pty(self, term: str, width: int, height: int) -> None:
        self.pty = (term, width, height)

    def exec_command(self, command: str) -> None:
        self.command = command

    def said(self, out: list[bytes], err: list[bytes] = ()) -> None:
        for chunk in [*out, None]:
            self.out.put(chunk)
        for chunk in [*err, None]:
            self.err.put(chunk)

    def take(self, stream: queue.Queue) -> bytes:
        while not self.closed.is_set():
            try:
                chunk = stream.get(timeout=0.05)
            except queue.Empty:
                continue
            if chunk is None:
                stream.put(None)
                return b""
            return chunk
        return b""

    def recv(self, size: int) -> bytes:
        return self.take(self.out)

    def recv_stderr(self, size: int) -> bytes:
        return self.take(self.err)

    def recv_exit_status(self) -> int:
        return -1 if self.closed.is_set() else self.status

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def shutdown_write(self) -> None:
        self.events.append("eof")

    def resize_pty(self, width: int, height: int) -> None:
        self.events.append(("resize", width, height))

    def close(self) -> None:
        self.closed.set()


def carried(channel: StandInChannel) -> tuple[mux_channel.MuxChannel, threading.Thread]:
    """A MuxChannel whose master relays `channel`."""
    ours, theirs = socket.socketpair()
    relay = threading.Thread(target=mux_master.ExecRelay(theirs, channel).run, daemon=True)
    relay.start()
    return mux_channel.MuxChannel(ours), relay


def test_stdout_stderr_and_the_exit_status_come_through_apart():
    remote = StandInChannel(status=3)
    channel, relay = carried(remote)
    remote.said([b"one\n", b"two\n"], [b"oops\n"])
    out = b"".join(iter(lambda: channel.recv(4), b""))
    err = b"".join(iter(lambda: channel.recv_stderr(4), b""))
    assert (out, err) == (b"one\ntwo\n", b"oops\n")
    assert channel.recv_exit_status() == 3 and channel.exit_status_ready()
    relay.join(5)
    channel.close()


def test_stdin_its_end_and_pty_sizes_reach_the_remote_channel():
    remote = StandInChannel()
    channel, relay = carried(remote)
    channel.sendall(b"x" * (mux_channel.SEND_CHUNK * 2 + 5))
    channel.resize_pty(width=120, height=40)
    channel.shutdown_write()
    deadline = time.monotonic() + 5
    while remote.events != [("resize", 120, 40), "eof"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert remote.events == [("resize", 120, 40), "eof"]
    assert remote.sent == b"x" * (mux_channel.SEND_CHUNK * 2 + 5)
    remote.said([])
    assert channel.recv_exit_status() == 0
    relay.join(5)
    assert not relay.is_alive()
    channel.close()


def test_select_sees_the_channel_once_stdout_has_data_or_ended():
    remote = StandInChannel()
    channel, relay = carried(remote)
    assert select.select([channel], [], [], 0.1)[0] == []
    remote.out.put(b"hello")
    assert select.select([channel], [], [], 5)[0] == [channel]
    assert channel.recv(100) == b"hello"
    assert select.select([channel], [], [], 0.1)[0] == []  # drained: not readable
    remote.said([])
    assert select.select([channel], [], [], 5)[0] == [channel]
    assert channel.recv(100) == b""
    relay.join(5)
    assert not relay.is_alive()
    channel.close()


@pytest.mark.fault
def test_the_command_hanging_up_closes_the_remote_channel():
    """Ctrl-C in `tcloud exec` closes its channels: the master must end each command."""
    remote = StandInChannel()
    channel, relay = carried(remote)
    remote.out.put(b"still running")
    assert channel.recv(100) == b"still running"
    channel.close()
    assert remote.closed.wait(5)
    relay.join(5)
    assert not relay.is_alive()
    assert channel.recv(100) == b"" and channel.recv_exit_status() == -1


@pytest.mark.fault
def test_a_master_that_goes_away_ends_the_channel_without_a_status():
    ours, theirs = socket.socketpair()
    channel = mux_channel.MuxChannel(ours)
    theirs.sendall(frames.frame(frames.OUT, b"partial"))
    theirs.close()
    assert channel.recv(100) == b"partial"
    assert channel.recv(100) == b""
    assert channel.recv_exit_status() == -1  # 255 for the user, as ssh says
    channel.close()


@pytest.mark.security
def test_a_frame_longer_than_the_limit_ends_the_relay_without_reading_it():
    """A client (or anything on the socket) cannot make the master buffer a huge frame."""
    remote = StandInChannel()
    ours, theirs = socket.socketpair()
    relay = threading.Thread(target=mux_master.ExecRelay(theirs, remote).run, daemon=True)
    relay.start()
    ours.sendall(frames.HEADER.pack(frames.IN, frames.MAX_PAYLOAD + 1))
    assert remote.closed.wait(5)  # the channel, and so the remote command, ended
    assert remote.sent == b""
    ours.close()


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "request_line",
    [
        {"op": "exec"},
        {"op": "exec", "command": ""},
        {"op": "exec", "command": "true", "pty": "xterm"},
        {"op": "exec", "command": "true", "pty": ["xterm", -1, 24]},
        {"op": "exec", "command": "true", "pty": ["xterm", 80]},
        {"op": "exec", "command": "true", "pty": ["xterm", 1 << 32, 24]},
    ],
)
def test_an_exec_request_that_is_not_one_gets_an_error_line_and_no_channel(request_line):
    master = bare_master()
    master.connections = stand_in_connections()
    ours, theirs = socket.socketpair()
    ours.sendall(json.dumps(request_line).encode() + b"\n")
    master.client(theirs)
    answer = json.loads(ours.makefile("rb").readline())
    assert "exec:" in answer["mux_error"]
    assert master.connections.open[0][0].transport.channels == []
    assert master.attached == 0


def test_an_exec_request_opens_a_channel_with_its_pty_and_command(monkeypatch):
    master = bare_master()
    master.connections = stand_in_connections()
    remote = StandInChannel(status=7)
    transport = master.connections.open[0][0].transport
    monkeypatch.setattr(transport, "open_session", lambda timeout: remote)
    monkeypatch.setattr(master, "connection_usable", lambda: True)
    ours, theirs = socket.socketpair()
    request = {"op": "exec", "command": "tacc-agent job attach", "pty": ["vt100", 100, 30]}
    ours.sendall(json.dumps(request).encode() + b"\n")
    serving = threading.Thread(target=master.client, args=(theirs,), daemon=True)
    serving.start()
    reader = ours.makefile("rb")
    assert reader.readline().strip() == b'{"ok": true}'
    remote.said([b"hi"])
    got = [frames.read(reader.read) for _ in range(4)]
    # stdout and stderr are relayed apart: their frames may interleave; the status is last
    assert [frame for frame in got if frame[0] == frames.OUT] == [
        (frames.OUT, b"hi"),
        (frames.OUT, b""),
    ]
    assert (frames.ERR, b"") in got and got[-1] == (frames.EXIT, (7).to_bytes(4, "big"))
    serving.join(5)
    assert (remote.command, remote.pty) == ("tacc-agent job attach", ("vt100", 100, 30))
    assert master.connections.open[0][1] == 0 and master.attached == 0


def test_a_resize_while_a_write_waits_is_sent_after_it_and_never_blocks():
    """SIGWINCH comes on the thread that may be stuck in sendall (the master not reading
    a paste): the resize must not wait for the lock that write holds."""
    ours, theirs = socket.socketpair()
    channel = mux_channel.MuxChannel(ours)
    paste = b"p" * (8 << 20)  # more than the socket pair buffers: the write waits
    writing = threading.Thread(target=channel.sendall, args=(paste,), daemon=True)
    writing.start()
    time.sleep(0.2)
    assert channel.send_lock.locked()
    resized = threading.Thread(target=channel.resize_pty, kwargs={"width": 90, "height": 30})
    resized.start()
    resized.join(2)
    assert not resized.is_alive()  # returned at once
    reader = theirs.makefile("rb")
    received, sizes = 0, []
    while received < len(paste) or not sizes:
        kind, payload = frames.read(reader.read)
        if kind == frames.IN:
            received += len(payload)
        elif kind == frames.RESIZE:
            sizes.append(frames.size(payload))
    assert sizes == [(90, 30)] and received == len(paste)
    writing.join(5)
    channel.close()


@pytest.mark.fault
def test_a_command_is_not_run_when_the_channel_came_too_late(monkeypatch):
    """The client gives up after mux.REQUEST_TIMEOUT and reports an error: the master
    must not run the command after that (it would run once more if retried)."""
    master = bare_master()
    master.connections = stand_in_connections()
    remote = StandInChannel()
    transport = master.connections.open[0][0].transport
    monkeypatch.setattr(transport, "open_session", lambda timeout: remote)
    monkeypatch.setattr(master, "connection_usable", lambda: True)
    monkeypatch.setattr(mux_master, "EXEC_DEADLINE", -1.0)  # always too late
    ours, theirs = socket.socketpair()
    ours.sendall(json.dumps({"op": "exec", "command": "rm -r old"}).encode() + b"\n")
    master.client(theirs)
    answer = json.loads(ours.makefile("rb").readline())
    assert "no channel within" in answer["mux_error"]
    assert remote.command is None and remote.closed.is_set()
    assert master.connections.open[0][1] == 0


@pytest.mark.fault
def test_a_master_that_hangs_up_after_the_request_is_an_error_not_a_second_run(
    monkeypatch, tmp_path
):
    path = tmp_path / "m.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen()
    answers = iter([b"", b'{"mux_error": "cannot open a channel: refused"}\n'])

    def serve() -> None:
        for answer in answers:
            conn, _ = listener.accept()
            conn.makefile("rb").readline()
            conn.sendall(answer)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    monkeypatch.setattr(mux, "socket_path", lambda _settings: path)
    with pytest.raises(TcloudError, match="hung up before it answered"):
        mux.open_channel(None, "true")
    assert mux.open_channel(None, "true") is None  # it said it ran nothing: go direct
    listener.close()


@pytest.mark.fault
@pytest.mark.parametrize("payload", [b"\x00\x00", b"\x00" * 8])
def test_an_exit_frame_of_the_wrong_size_ends_the_channel_without_a_status(payload):
    ours, theirs = socket.socketpair()
    channel = mux_channel.MuxChannel(ours)
    theirs.sendall(frames.frame(frames.EXIT, payload))
    assert channel.recv_exit_status() == -1  # never waits for ever
    theirs.close()
    channel.close()


def test_an_exit_status_too_large_for_a_frame_is_sent_as_none():
    assert frames.exit_status(frames.exit_frame(1 << 32)[frames.HEADER.size :]) == -1
    assert frames.exit_status(frames.exit_frame(255)[frames.HEADER.size :]) == 255
