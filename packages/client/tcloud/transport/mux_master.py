"""The connection master (`python -P -m tcloud.transport.mux_master`, its settings on stdin;
tcloud.transport.mux starts it).

It holds verified SSH connections to one login node (tcloud.transport.ssh.connect: host keys
checked as for any command; it never prompts, its stdin is /dev/null) and listens on a
Unix socket. Each client sends one request line:

    {"op": "session"}  -> the agent's hello line, then the bytes of one `tacc-agent
                          session` both ways until either side closes (spare sessions
                          are kept started, so the hello is already there)
    {"op": "exec", "command": LINE, "pty": [TERM, COLUMNS, ROWS] or null}
                       -> {"ok": true}, then one exec channel running LINE (on a PTY
                          when asked) in frames both ways (tcloud.transport.frames)
                          until it ends; or {"mux_error": WHY} (the command then
                          connects directly)
    {"op": "exit"}     -> {"ok": true}; the master stops (`tcloud disconnect`)

sshd allows a few sessions per connection (MaxSessions, 10 by default): past
PER_CONNECTION open channels the master opens another connection. It exits after
`idle` seconds with no client attached, or when its first connection drops; it
removes its socket (if that is still its own) on the way out.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import socket
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import paramiko

from tacc_contract import protocol, verbs
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transport import frames, mux, ssh, wire

PER_CONNECTION = 8
# Sessions kept started ahead of need: as many as clients were attached at once (a burst
# of commands finds them ready), at most this many idle agent processes on the node.
MAX_SPARES = 4
HELLO_TIMEOUT = 20.0
# A spare older than this is ended: an agent upgraded on the node meanwhile gives its new
# hello to the next command, not a minute-old one's. It is not replaced until a command
# comes (refill after each hand-out): an idle master keeps no agents busy on the login node.
SPARE_MAX_AGE = 60.0
# SSH keepalives on every connection; and a connection idle longer than PROBE_AFTER (a
# laptop that slept) must answer one within PROBE_TIMEOUT before it carries a session.
KEEPALIVE = 30
PROBE_AFTER = 10.0
PROBE_TIMEOUT = 5.0
CHUNK = 1 << 16
DROPPED = "the connection master's SSH connection dropped"
# An exec request's command is run only this soon after it came: well inside the
# client's wait for the answer (mux.REQUEST_TIMEOUT), after which it reports an error
# and never runs the command itself.
EXEC_DEADLINE = 20.0
# A request line: an exec's command may be long (a few KiB of quoted words).
REQUEST_LIMIT = 1 << 16
# The largest PTY a request may ask for (a terminal of 10,000 columns is no terminal).
MAX_TERMINAL = 10_000


def log(message: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} tcloud mux[{os.getpid()}]: {message}", file=sys.stderr)


class Started:
    """A `tacc-agent session` whose hello line has been read (or why it has none)."""

    def __init__(self, channel: paramiko.Channel | None, hello: bytes, error: str = "") -> None:
        self.channel = channel
        self.hello = hello
        self.error = error
        self.born = time.monotonic()


class Connections:
    """The master's SSH connections to the login node: the first, and more when the
    open channels of every one reach PER_CONNECTION."""

    def __init__(self, settings: Cluster) -> None:
        self.settings = settings
        self.stack = ExitStack()
        self.lock = threading.Lock()
        self.open: list[list] = []  # [client, channels open]
        self.add()

    def add(self) -> list:
        client = self.stack.enter_context(ssh.session(self.settings))
        client.get_transport().set_keepalive(KEEPALIVE)
        self.open.append([client, 0])
        return self.open[-1]

    def answers(self, deadline: float | None = None) -> bool:
        """Whether the first connection's server answers a keepalive within `deadline`
        (any reply counts: OpenSSH refuses the request, which is an answer)."""
        transport = self.open[0][0].get_transport()
        if transport is None or not transport.is_active():
            return False
        replied = threading.Event()

        def probe() -> None:
            with contextlib.suppress(Exception):
                transport.global_request("keepalive@openssh.com", wait=True)
                replied.set()

        threading.Thread(target=probe, daemon=True).start()
        return replied.wait(deadline or PROBE_TIMEOUT) and transport.is_active()

    def first_alive(self) -> bool:
        transport = self.open[0][0].get_transport()
        return transport is not None and transport.is_active()

    def take(self) -> list:
        with self.lock:
            for entry in self.open:
                transport = entry[0].get_transport()
                if entry[1] < PER_CONNECTION and transport is not None and transport.is_active():
                    entry[1] += 1
                    return entry
            entry = self.add()
            entry[1] += 1
            return entry

    def give_back(self, entry: list) -> None:
        with self.lock:
            entry[1] -= 1

    def exec_channel(
        self,
        command: str,
        terminal: tuple[str, int, int] | None = None,
        deadline: float | None = None,
    ) -> tuple[paramiko.Channel, list]:
        """An exec channel running `command` (on a PTY when asked: term, columns, rows)
        and the connection it counts against. Not run once time.monotonic() is past
        `deadline`. On any failure the channel is closed, the count given back, and the
        error raised."""
        entry: list | None = None
        channel: paramiko.Channel | None = None
        try:
            entry = self.take()
            channel = entry[0].get_transport().open_session(timeout=HELLO_TIMEOUT)
            if terminal is not None:
                term, columns, rows = terminal
                channel.get_pty(term=term, width=columns, height=rows)
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"no channel within {EXEC_DEADLINE:.0f} s")
            channel.exec_command(command)
        except BaseException:
            self.abandon(channel, entry)
            raise
        return channel, entry

    def start_session(self) -> tuple[Started, list | None]:
        """A started agent session and the connection it counts against; on failure its
        channel is closed (the agent and sshd's session end) and the count given back."""
        failed = (OSError, EOFError, paramiko.SSHException, TcloudError)
        try:
            channel, entry = self.exec_channel(
                shlex.join(protocol.command(verbs.SESSION.request()))
            )
        except failed as exc:
            return Started(None, b"", f"cannot start the agent's session: {exc}"), None
        try:
            channel.settimeout(HELLO_TIMEOUT)
            hello = mux.read_line(channel.recv)
            channel.settimeout(None)
        except failed as exc:
            self.abandon(channel, entry)
            return Started(None, b"", f"cannot start the agent's session: {exc}"), None
        if not mux.is_hello(hello):
            self.abandon(channel, entry)
            return Started(None, b"", f"the agent said {hello[:200]!r}, not a hello"), None
        return Started(channel, hello), entry

    def abandon(self, channel: paramiko.Channel | None, entry: list | None) -> None:
        if channel is not None:
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                channel.close()
        if entry is not None:
            self.give_back(entry)

    def close(self) -> None:
        self.stack.close()


class Master:
    def __init__(self, settings: Cluster, path: Path, idle: int) -> None:
        self.settings = settings
        self.path = path
        self.idle = idle
        self.temporary = mux.temporary_name(path, os.getpid())
        self.listener = self.bind()  # first: a path that cannot be bound costs no login
        try:
            self.connections = Connections(settings)
        except BaseException:
            self.listener.close()
            with contextlib.suppress(OSError):
                os.unlink(self.temporary)
            raise
        self.lock = threading.Lock()
        self.attached = 0
        self.last_seen = time.monotonic()
        self.spares: list[tuple[Started, list]] = []
        self.starting = 0
        self.peak = 1  # the most clients attached at once so far
        self.closing = False  # set once idle: no client is admitted any more
        self.why = ""  # why it closed
        os.rename(self.temporary, self.path)  # a client never finds a socket that does not answer
        self.inode = os.stat(path).st_ino
        self.refill()

    def bind(self) -> socket.socket:
        """Bound and listening under a temporary name, renamed into place once the SSH
        connection is up. 0600 (umask), in the private directory."""
        mux.check_private(self.path.parent)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.temporary))
            listener.listen(128)
        except OSError:
            listener.close()
            raise
        finally:
            os.umask(old)
        return listener

    def refill(self) -> None:
        """Start spare sessions in the background, up to the peak of clients at once."""
        with self.lock:
            wanted = max(min(MAX_SPARES, self.peak) - len(self.spares) - self.starting, 0)
            self.starting += wanted
        for _ in range(wanted):
            threading.Thread(target=self.start_spare, daemon=True).start()

    def start_spare(self) -> None:
        started = None
        try:
            started = self.connections.start_session()
        finally:
            with self.lock:
                self.starting -= 1
                if started is not None and started[0].channel is not None:
                    self.spares.append(started)  # a failure is said to the client that asks

    def end_old_spares(self) -> None:
        """Spares older than SPARE_MAX_AGE ended; the next command starts its own (and the
        refill after it starts spares again), so an idle master costs the node nothing."""
        now = time.monotonic()
        with self.lock:
            old = [spare for spare in self.spares if now - spare[0].born > SPARE_MAX_AGE]
            self.spares = [spare for spare in self.spares if spare not in old]
        for started, entry in old:
            self.connections.abandon(started.channel, entry)

    def connection_usable(self) -> bool:
        """After a quiet while, the connection must answer first (else the master exits);
        a dropped one closes the master to new commands (they connect directly)."""
        with self.lock:
            quiet = self.attached <= 1 and time.monotonic() - self.last_seen > PROBE_AFTER
        if quiet and not self.connections.answers():
            self.stop("the SSH connection does not answer")
        if not self.connections.first_alive():
            # Its sessions died with it (a cut, a restarted sshd): no new connection is
            # opened in its place by this master; the command connects directly.
            self.refuse_new("the SSH connection dropped")
            return False
        return True

    def take_session(self) -> tuple[Started, list | None]:
        """A spare session whose agent still runs, or one started now; after a quiet
        while, only once the connection answers (else the master exits and the command
        connects directly)."""
        if not self.connection_usable():
            return Started(None, b"", DROPPED), None
        while True:
            with self.lock:
                taken = self.spares.pop(0) if self.spares else None
            self.refill()
            if taken is None:
                return self.connections.start_session()
            channel = taken[0].channel
            if not (channel.closed or channel.exit_status_ready() or channel.eof_received):
                return taken
            channel.close()  # its agent ended while it waited: the next one
            self.connections.give_back(taken[1])

    def serve(self) -> None:
        """Accept clients of this uid only, each on its own thread. POSIX-only (uids)."""
        threading.Thread(target=self.watch, daemon=True).start()
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                if self.closing:
                    return
                raise
            if self.admit(conn):
                threading.Thread(target=self.client, args=(conn,), daemon=True).start()

    def admit(self, conn: socket.socket) -> bool:
        """Counted as attached, unless of another uid or the master is closing (then
        hung up before any hello: the command connects directly). POSIX-only (uids)."""
        uid = mux.peer_uid(conn)
        if uid is not None and uid != os.getuid():
            log(f"refused a client of uid {uid}")
            conn.close()
            return False
        with self.lock:
            if self.closing:
                conn.close()
                return False
            self.attached += 1
            self.peak = max(self.peak, self.attached)
        return True

    def client(self, conn: socket.socket) -> None:
        try:
            request = self.request(conn)
            if request.get("op") == "exit":
                conn.sendall(mux.OK + b"\n")
                self.stop("asked to exit")
            elif request.get("op") == "session":
                self.relay_session(conn)
            elif request.get("op") == "exec":
                self.relay_exec(conn, request)
            else:
                conn.sendall(json.dumps({"mux_error": "unknown request"}).encode() + b"\n")
        except (OSError, ValueError) as exc:
            log(f"client: {exc}")
        except Exception as exc:  # said to the client: the master lives on
            log(f"client: {type(exc).__name__}: {exc}")
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"mux_error": str(exc)[:400]}).encode() + b"\n")
        finally:
            with contextlib.suppress(OSError):
                conn.close()
            with self.lock:
                self.attached -= 1
                self.last_seen = time.monotonic()

    def request(self, conn: socket.socket) -> dict:
        conn.settimeout(mux.REQUEST_TIMEOUT)
        line = mux.read_line(conn.recv, limit=REQUEST_LIMIT)
        conn.settimeout(None)
        request = json.loads(line or b"{}")
        return request if isinstance(request, dict) else {}

    def relay_session(self, conn: socket.socket) -> None:
        started, entry = self.take_session()
        if started.channel is None:
            conn.sendall(json.dumps({"mux_error": started.error}).encode() + b"\n")
            return
        channel = started.channel
        try:
            conn.sendall(started.hello)
            upstream = threading.Thread(target=self.to_agent, args=(conn, channel), daemon=True)
            upstream.start()
            self.to_client(channel, conn)
            upstream.join()
        finally:
            channel.close()
            self.connections.give_back(entry)

    def relay_exec(self, conn: socket.socket, request: dict) -> None:
        """One exec channel (a PTY first when asked) on a connection of the master's, in
        frames both ways until the command ends or the client hangs up. Its command is
        never run once EXEC_DEADLINE has passed since the request came (the client, which
        waits longer, would have given up), so it never runs twice."""
        asked = time.monotonic()
        try:
            command, terminal = exec_request(request)
        except ValueError as exc:
            conn.sendall(json.dumps({"mux_error": str(exc)}).encode() + b"\n")
            return
        if not self.connection_usable():
            conn.sendall(json.dumps({"mux_error": DROPPED}).encode() + b"\n")
            return
        try:
            channel, entry = self.connections.exec_channel(
                command, terminal, deadline=asked + EXEC_DEADLINE
            )
        except Exception as exc:  # whatever it was: the channel is gone, and it is said
            said = f"cannot open a channel: {exc or type(exc).__name__}"
            conn.sendall(json.dumps({"mux_error": said}).encode() + b"\n")
            return
        try:
            conn.sendall(mux.OK + b"\n")
            ExecRelay(conn, channel).run()
        except Exception as exc:  # frames follow OK: no error line any more
            log(f"exec relay: {type(exc).__name__}: {exc}")
        finally:
            channel.close()
            self.connections.give_back(entry)

    @staticmethod
    def to_agent(conn: socket.socket, channel: paramiko.Channel) -> None:
        """Client -> agent; the client's EOF is the agent's (its session ends)."""
        try:
            while data := conn.recv(wire.CHANNEL_WRITE):  # one SSH packet a write
                channel.sendall(data)
        except (OSError, paramiko.SSHException):
            pass
        with contextlib.suppress(OSError, paramiko.SSHException, EOFError):
            channel.shutdown_write()

    @staticmethod
    def to_client(channel: paramiko.Channel, conn: socket.socket) -> None:
        """Agent -> client; the agent's EOF or exit closes the client's socket."""
        try:
            while data := channel.recv(CHUNK):
                conn.sendall(data)
        except (OSError, paramiko.SSHException):
            pass
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError, paramiko.SSHException):
            said = channel.recv_stderr(CHUNK) if channel.recv_stderr_ready() else b""
            if said:
                log(f"an agent session said: {said[-400:].decode(errors='replace').strip()}")

    def watch(self) -> None:
        while True:
            time.sleep(1.0)
            self.tick()

    def tick(self) -> None:
        """Once a second: a dropped connection or a lost socket closes the master to new
        commands (they connect directly) and it exits once the commands it carries, on
        other connections, are done; so does an idle one."""
        if not self.connections.first_alive():
            self.refuse_new("the SSH connection dropped")
        elif not self.still_mine():
            self.refuse_new("its socket was removed or replaced")
        if self.close_if_idle():
            self.why = self.why or f"idle for {self.idle} s"
        self.end_old_spares()
        with self.lock:
            done = self.closing and self.attached == 0
        if done:
            self.stop(self.why)

    def refuse_new(self, why: str) -> None:
        """No command is admitted any more; the socket goes (the next command starts a
        new master), the commands attached finish on their own connections."""
        with self.lock:
            if self.closing:
                return
            self.closing = True
            self.why = why
        log(f"closing: {why}")
        if self.still_mine():
            with contextlib.suppress(OSError):
                os.unlink(self.path)

    def close_if_idle(self) -> bool:
        """Decided under the lock that admit() takes: once idle, no client is admitted."""
        with self.lock:
            if self.attached == 0 and time.monotonic() - self.last_seen > self.idle:
                self.closing = True
            return self.closing

    def still_mine(self) -> bool:
        try:
            return os.stat(self.path).st_ino == self.inode
        except OSError:
            return False

    def stop(self, why: str) -> None:
        log(f"exiting: {why}")
        if self.still_mine():
            with contextlib.suppress(OSError):
                os.unlink(self.path)
        with contextlib.suppress(OSError):
            self.listener.close()
        with contextlib.suppress(Exception):
            self.connections.close()
        os._exit(0)


def exec_request(request: dict) -> tuple[str, tuple[str, int, int] | None]:
    """An exec request's command line and PTY (term, columns, rows), or ValueError."""
    command, terminal = request.get("command"), request.get("pty")
    if not isinstance(command, str) or not command:
        raise ValueError("exec: no command")
    if terminal is None:
        return command, None
    if not (
        isinstance(terminal, list)
        and len(terminal) == 3
        and isinstance(terminal[0], str)
        and all(isinstance(number, int) and 0 <= number <= MAX_TERMINAL for number in terminal[1:])
    ):
        raise ValueError(f"exec: pty is [term, columns, rows], at most {MAX_TERMINAL} each")
    return command, (terminal[0], terminal[1], terminal[2])


class ExecRelay:
    """An exec channel and a client's socket: the channel's stdout and stderr out as
    frames (an empty one at each one's end), then its exit status; stdin, its end and
    PTY sizes in. The client hanging up closes the channel."""

    def __init__(self, conn: socket.socket, channel: paramiko.Channel) -> None:
        self.conn = conn
        self.channel = channel
        self.send_lock = threading.Lock()

    def send(self, data: bytes) -> None:
        with self.send_lock:
            self.conn.sendall(data)

    def out(self, kind: bytes, receive) -> None:
        try:
            while data := receive(CHUNK):
                self.send(frames.frame(kind, data))
            self.send(frames.frame(kind))
        except (OSError, paramiko.SSHException):
            self.channel.close()  # the client is gone: so is its command

    def inbound(self) -> None:
        try:
            while True:
                kind, payload = frames.read(self.conn.recv)
                if kind == frames.IN:
                    self.channel.sendall(payload)
                elif kind == frames.EOF:
                    self.channel.shutdown_write()
                elif kind == frames.RESIZE:
                    columns, rows = frames.size(payload)
                    self.channel.resize_pty(width=columns, height=rows)
        except (OSError, EOFError, frames.FrameError, paramiko.SSHException):
            pass
        finally:
            self.channel.close()  # hung up (or a frame that is none): the command ends

    def run(self) -> None:
        threading.Thread(target=self.inbound, daemon=True).start()
        errors = threading.Thread(target=self.out, args=(frames.ERR, self.channel.recv_stderr))
        errors.start()
        self.out(frames.OUT, self.channel.recv)
        errors.join()
        status = self.channel.recv_exit_status()
        with contextlib.suppress(OSError):
            self.send(frames.exit_frame(status))
            self.conn.shutdown(socket.SHUT_RDWR)


def read_spec() -> str:
    """The settings, one JSON line on stdin (not argv: `ps` shows argv to everyone);
    stdin is /dev/null afterwards, as for any daemon."""
    line = sys.stdin.readline()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return line


def main(spec_line: str) -> int:
    spec = json.loads(spec_line)
    settings = Cluster(**spec["settings"])
    path = Path(spec["socket"])
    try:
        master = Master(settings, path, int(spec["idle"]))
    except (TcloudError, OSError) as exc:
        log(f"cannot start: {exc}")
        return 4
    log(f"listening on {path} for {settings.user or ''}@{settings.host}")
    master.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(read_spec()))
