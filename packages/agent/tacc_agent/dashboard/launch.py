"""The caller's side of their dashboard server, on the login node, over SSH:
`dashboard open` (start the server when none answers, then sign a one-time code) and
`dashboard connect` (one browser connection: this process's stdin and stdout relayed to
the server's socket, as `ssh -W` does).

The server is started detached (its own session, in /, stdin from /dev/null, its output
appended to server.log in the private directory), under a lock in that directory, so
that the six connections a browser opens at once start one server, not six."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tacc_agent.dashboard import place
from tacc_agent.errors import AGENT_OK, AgentError
from tacc_agent.self_command import AGENT
from tacc_agent.tasks.interactive import pumps
from tacc_agent.tasks.interactive.pumps import End
from tacc_contract.answers import DashboardOpened

START_SECONDS = 20.0  # the server imports aiohttp and binds in about a second


def connected(path: Path) -> socket.socket | None:
    """A connection to the server at path; None when nothing listens there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    return sock


@contextlib.contextmanager
def start_lock(where: Path) -> Iterator[None]:
    descriptor = os.open(where / place.START_LOCK, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def server_argv(settings: Sequence[str]) -> list[str]:
    """`tacc-agent [--config C] [--userdir U] dashboard serve`: the caller's own
    settings, as the verb that starts it was given them."""
    return [*AGENT, *settings, "dashboard", "serve"]


def ensure_server(settings: Sequence[str], where: Path | None = None) -> socket.socket:
    """A connection to the caller's server, started first when none answers."""
    where = place.private_directory(where)
    path = where / place.SOCKET
    if (sock := connected(path)) is not None:
        return sock
    with start_lock(where):
        if (sock := connected(path)) is not None:
            return sock  # another connection started it meanwhile
        log = os.open(where / place.LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            server = subprocess.Popen(
                server_argv(settings),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                cwd="/",
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(log)
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if (sock := connected(path)) is not None:
                return sock
            if server.poll() is not None:
                break
            time.sleep(0.05)
    tail = last_lines(where / place.LOG)
    raise AgentError(f"the dashboard server did not start on this login node: {tail}")


def last_lines(path: Path, count: int = 3) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " / ".join(lines[-count:]) or "no log"


def open_dashboard(settings: Sequence[str]) -> DashboardOpened:
    """`dashboard open`: the server up, and a one-time code signed with its secret."""
    where = place.private_directory()
    ensure_server(settings, where).close()
    code, expires = place.mint(place.read_secret(where))
    return {"code": code, "expires": float(expires)}


def connect(settings: Sequence[str]) -> int:
    """`dashboard connect`: stdin and stdout to one connection of the server, until both
    sides end."""
    sock = ensure_server(settings)
    channel = End.of_pipes(sys.stdin.fileno(), sys.stdout.fileno())
    server = End.of_socket(sock)
    upstream = pumps.start(channel, server)
    pumps.one_way(server, channel)
    upstream.join(timeout=1.0)  # the browser's side ends with its connection
    sock.close()
    return AGENT_OK
