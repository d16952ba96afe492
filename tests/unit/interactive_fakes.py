"""Fakes for tcloud's way into a running job (tests of shell, exec, forward, dev, top):
an agent session answering session verbs from a table, and a transport whose exec
channels play a scripted stdout/stderr/exit status per `job attach` rank (or any other
verb), whose direct-tcpip channels are one end of a socketpair, so a test sees every
command line sent and every channel opened. No SSH, no cluster."""

from __future__ import annotations

import contextlib
import io
import os
import shlex
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import yaml

from tacc_contract.protocol import PROTOCOL_VERSION, Hello
from tcloud import cli, core
from tcloud.transport.link import Direct

TARGET = {
    "job_id": "42",
    "slurm_job_id": "42",
    "state": "RUNNING",
    "nodes": [
        {"host": "n2", "rank": 0, "address": "10.77.6.12"},
        {"host": "n3", "rank": 1, "address": "10.77.6.13"},
    ],
}
NOT_YOURS = {"error": "job 42 is not yours"}


class FakeSession:
    """Session verbs answered from `answers` (verb words -> (rc, answer) or a callable
    giving one); each request recorded."""

    def __init__(self, answers: dict) -> None:
        self.answers, self.verbs, self.dead = answers, [], False
        self.hello = Hello(protocol=PROTOCOL_VERSION, agent_version="test")

    def request(self, verb, userdir, stdin=b"", produce=None):
        self.verbs.append(list(verb))
        answer = self.answers[tuple(verb[:2])]
        return answer() if callable(answer) else answer

    def close(self) -> None:
        self.dead = True


class FakeChannel:
    """An exec channel: what the command prints (chunks, cut anywhere), its exit
    status; what was sent to it and whether it was closed."""

    def __init__(self, stdout=(), stderr=(), status: int = 0) -> None:
        self.out, self.err = list(stdout), list(stderr)
        self.status = status
        self.command: str | None = None
        self.pty: tuple | None = None
        self.sent = bytearray()
        self.closed = self.write_shut = False
        self.lock = threading.Lock()

    def get_pty(self, term, width, height) -> None:
        self.pty = (term, width, height)

    def exec_command(self, command: str) -> None:
        self.command = command

    def recv(self, _size: int) -> bytes:
        with self.lock:
            return self.out.pop(0) if self.out else b""

    def recv_stderr(self, _size: int) -> bytes:
        with self.lock:
            return self.err.pop(0) if self.err else b""

    def recv_exit_status(self) -> int:
        return self.status

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def shutdown_write(self) -> None:
        self.write_shut = True

    def close(self) -> None:
        self.closed = True


class SocketChannel:
    """A direct-tcpip channel: one end of a socketpair (the test holds the other, as
    the service on the node)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def recv(self, size: int) -> bytes:
        return self.sock.recv(size)

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def shutdown_write(self) -> None:
        self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.closed = True
        self.sock.close()


class FakeTransport:
    """Exec channels made by `script(argv)` (the command line split back into words);
    direct-tcpip channels served by `service(sock, dest)` on a thread."""

    def __init__(self, script: Callable[[list[str]], FakeChannel]) -> None:
        self.script = script
        self.channels: list[FakeChannel] = []
        self.opened: list[tuple] = []
        self.service: Callable[[socket.socket, tuple], None] | None = None
        self.lock = threading.Lock()

    def open_session(self, window_size=None) -> ScriptedChannel:
        return ScriptedChannel(self)

    def open_channel(self, kind, dest, src, window_size=None):
        self.opened.append((kind, dest, window_size))
        ours, theirs = socket.socketpair()
        threading.Thread(target=self.service, args=(theirs, dest), daemon=True).start()
        return SocketChannel(ours)


class ScriptedChannel(FakeChannel):
    """A channel whose output is decided once its command is known."""

    def __init__(self, transport: FakeTransport) -> None:
        super().__init__()
        self.transport = transport

    def exec_command(self, command: str) -> None:
        self.command = command
        played = self.transport.script(shlex.split(command))
        self.out, self.err, self.status = played.out, played.err, played.status
        with self.transport.lock:
            self.transport.channels.append(self)


class FakeLink:
    def __init__(self, session: FakeSession, transport: FakeTransport) -> None:
        self.session, self.transport = session, transport

    def agent_session(self) -> FakeSession:
        return self.session

    def get_transport(self) -> FakeTransport:
        return self.transport

    def close(self) -> None:
        pass


def argv_verb(argv: list[str]) -> list[str]:
    """The agent verb of a command line (after `tacc-agent` and its --userdir)."""
    words = argv[1:]
    if words[:1] == ["--userdir"]:
        words = words[2:]
    return words


def rank_of(argv: list[str]) -> int:
    verb = argv_verb(argv)
    return int(verb[verb.index("--rank") + 1])


class FakeCluster:
    """A configured cluster `fake` whose agent session and transport are fakes."""

    def __init__(self, tmp: Path, monkeypatch, script=None) -> None:
        config = tmp / "tcloud-config.yaml"
        settings = {"host": "cluster.invalid", "user": "alice", "userdir": "/w/alice"}
        config.write_text(yaml.safe_dump({"current": "fake", "clusters": {"fake": settings}}))
        monkeypatch.setenv("TCLOUD_CONFIG", str(config))
        monkeypatch.setenv("TCLOUD_CACHE_DIR", str(tmp / "cache"))
        monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
        self.session = FakeSession(
            {
                ("job", "target"): (0, TARGET),
                ("job", "status"): (0, status("RUNNING")),
            }
        )
        self.transport = FakeTransport(script or (lambda argv: FakeChannel()))
        monkeypatch.setattr(core, "Link", lambda *_a: FakeLink(self.session, self.transport))

    def answer(self, verb: tuple[str, ...], rc: int, answer: object) -> None:
        self.session.answers[verb] = (rc, answer)

    def cluster(self) -> core.Cluster:
        return core.Cluster(direct=Direct(no_ssh, lambda _s: True))


def status(state: str, **extra) -> dict:
    return {"job_id": "42", "name": "t", "state": state, "workdir": "/w/alice/jobs/42", **extra}


def no_ssh(_settings):
    raise AssertionError("a direct SSH connection was opened")


NULL_FD = os.open(os.devnull, os.O_WRONLY)


class Bytes(io.BytesIO):
    """sys.stdout.buffer / sys.stderr.buffer as a test reads them."""


class Captured(io.TextIOWrapper):
    def __init__(self) -> None:
        super().__init__(Bytes(), encoding="utf-8", write_through=True)

    def text(self) -> str:
        self.flush()
        return self.buffer.getvalue().decode()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:  # where a PTY relay writes straight to (a test stubs it)
        return NULL_FD


def cli_run(*argv: str) -> tuple[int, str, str]:
    """tcloud's exit code, stdout and stderr (text and bytes written both kept)."""
    out, err = Captured(), Captured()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.text(), err.text()
