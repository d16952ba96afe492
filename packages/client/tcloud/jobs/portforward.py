"""`tcloud forward`: local ports to a running job's program on its node, like `ssh -L`.
Each local port listens on 127.0.0.1 only; each connection accepted there is one exec
channel of the direct SSH connection running `tacc-agent job connect` (protocol
job_connect), whose srun step connects, as the job's owner and from the node itself, to
127.0.0.1:PORT there or to a Unix socket there, and relays the bytes (as `ssh -W`).
So the program need listen on nothing other users of the cluster can reach: loopback,
or a socket in a private directory. Before listening, one `--check` of each target
says (one warning line) when the port listens on every address of the node, and
refuses a socket that is not there; nothing listens on the cluster side."""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tacc_contract import verbs
from tcloud.errors import TcloudError, UsageError
from tcloud.jobs import interactive
from tcloud.transport import agent, openssh

LOCALHOST = "127.0.0.1"
CHUNK = 1 << 18  # bytes per read on either side
# The channel's receive window. Measured on the lab with direct-tcpip channels (a 100 MB
# registry blob through login1 to n1, 2 cores): 4 MiB ran steadiest (160-236 MB/s, `ssh
# -L` 190-240); 16 MiB and more swung down to 40-70 MB/s, 2 MiB a little lower.
WINDOW = 1 << 22
BACKLOG = 64
AGENT_PREFIX = "tacc-agent: "


@dataclass(frozen=True)
class PortPair:
    """One forward: the job's port (or its Unix socket's absolute path) and the local
    port."""

    remote: int | str
    local: int


EXPECTED = (
    "expected PORT or PORT:LOCAL, each a port from 1 to 65535 (LOCAL 0: any free one), "
    "or a Unix socket's absolute path on the node, /PATH[:LOCAL]"
)


def port_number(text: str, spec: str, lowest: int = 1) -> int:
    if not text.isascii() or not text.isdigit() or not lowest <= int(text) <= 65535:
        raise UsageError(f"port {spec!r}: {EXPECTED}")
    return int(text)


def parse_socket(spec: str) -> PortPair:
    """/PATH[:LOCAL]: a Unix socket on the node (LOCAL defaults to 0, any free port)."""
    path, colon, tail = spec.rpartition(":")
    if colon and tail.isascii() and tail.isdigit():
        return PortPair(path, port_number(tail, spec, lowest=0))
    return PortPair(spec, 0)


def parse_pair(spec: str) -> PortPair:
    """PORT or PORT:LOCAL (LOCAL defaults to PORT; 0 is any free port), or /PATH[:LOCAL]."""
    if spec.startswith("/") and "\0" not in spec:
        return parse_socket(spec)
    if "/" in spec or spec.endswith(".sock"):
        raise UsageError(
            f"socket {spec!r}: expected the socket's absolute path on the node, "
            "e.g. /home/you/.../jupyter.sock"
        )
    remote, colon, local = spec.partition(":")
    number = port_number(remote, spec)
    return PortPair(number, port_number(local, spec, lowest=0) if colon else number)


def pairs_of(ports: Sequence[int | str] | Mapping[int | str, int]) -> list[PortPair]:
    """The SDK's ports: [8888, "6006:16006", "/path/jupyter.sock"] or {remote: local};
    no local port twice."""
    if isinstance(ports, Mapping):
        pairs = [parse_pair(f"{remote}:{local}") for remote, local in ports.items()]
    elif isinstance(ports, str | int):
        pairs = [parse_pair(str(ports))]
    else:
        pairs = [parse_pair(str(port)) for port in ports]
    if not pairs:
        raise UsageError("forward: expected at least one PORT[:LOCAL] or /SOCKET[:LOCAL]")
    locals_ = [pair.local for pair in pairs if pair.local]
    if len(set(locals_)) != len(locals_):
        raise UsageError(f"forward: a local port is named twice in {[str(p) for p in ports]}")
    return pairs


def listen(pairs: Sequence[PortPair]) -> list[socket.socket]:
    """One listening socket per pair on 127.0.0.1; a port in use is an error naming it
    (exit 4), and then nothing stays open."""
    listeners: list[socket.socket] = []
    try:
        for pair in pairs:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(sock)
            try:
                sock.bind((LOCALHOST, pair.local))
            except OSError as exc:
                why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
                raise TcloudError(
                    f"local port {pair.local} ({LOCALHOST}:{pair.local}) is {why}: "
                    f"name another, as {pair.remote}:LOCAL"
                ) from None
            sock.listen(BACKLOG)
    except BaseException:
        for sock in listeners:
            sock.close()
        raise
    return listeners


def relay(sock: socket.socket, channel) -> None:
    """Bytes both ways until both sides are done; each side's EOF passed on."""

    def upstream() -> None:
        with contextlib.suppress(OSError, EOFError):
            for data in iter(lambda: sock.recv(CHUNK), b""):
                channel.sendall(data)
        with contextlib.suppress(Exception):
            channel.shutdown_write()

    sender = threading.Thread(target=upstream, daemon=True)
    sender.start()
    try:
        with contextlib.suppress(OSError, EOFError):
            for data in iter(lambda: channel.recv(CHUNK), b""):
                sock.sendall(data)
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
        sender.join()
    finally:
        channel.close()
        sock.close()


class Carrier(Protocol):
    """One forwarded connection's way to the node: it carries the accepted socket's
    bytes both ways until both ends are done, then closes it."""

    def carry(self, sock: socket.socket) -> None: ...


Opener = Callable[[PortPair, tuple[str, int]], Carrier]


def message_of(line: str) -> str:
    return line.removeprefix(AGENT_PREFIX).strip()


@dataclass
class JobWay:
    """The way to one rank of a running job: `job connect` exec channels on the direct
    SSH connection (at most as many open at once as sshd's MaxSessions allows: one it
    refuses waits for one of ours to close, interactive.ChannelGate). Each line the
    agent says on stderr (a warning, a refusal) is given to `warn` once."""

    client: object  # tcloud.transport.link.Link (get_transport)
    userdir: str | None
    job: str
    rank: int
    warn: Callable[[str], None]
    openssh: Callable[[], openssh.Master | None] = lambda: None  # when up: its sessions
    gate: interactive.ChannelGate = field(default_factory=interactive.ChannelGate)
    said: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    verb: verbs.Verb = verbs.JOB_CONNECT  # what each connection's channel runs

    def start(self, pair: PortPair, check: bool = False):
        opened: list = []

        def open_session():
            transport = self.client.get_transport()
            opened.append(self.gate.open(lambda: transport.open_session(window_size=WINDOW)))
            return opened[-1]

        try:
            return agent.open_exec(
                self.client,
                self.verb,
                self.userdir,
                open_session,
                shared=False,  # its tuned window, on the direct connection
                check=check,
                **self.target(pair),
            )
        except BaseException:
            for channel in opened:
                self.closed(channel)
            raise

    def closed(self, channel) -> None:
        channel.close()
        self.gate.closed(channel)

    def say_once(self, lines: list[bytes]) -> None:
        for line in interactive.without_srun_report(lines):
            text = message_of(line.decode(errors="replace"))
            with self.lock:
                new = text and text not in self.said
                self.said.add(text)
            if new:
                self.warn(text)

    def check(self, pair: PortPair) -> None:
        """The node's word on the target before anything listens here: its warning
        (said), or its refusal (TcloudError, exit 4: no socket there, not yours)."""
        channel = self.start(pair, check=True)
        try:
            channel.shutdown_write()
            lines: list[bytes] = []
            interactive.pump(channel.recv_stderr, lines.extend)
            status = interactive.status_of(channel)
        finally:
            self.closed(channel)
        kept = interactive.without_srun_report(lines)
        if status != 0:
            text = "; ".join(message_of(line.decode(errors="replace")) for line in kept)
            raise TcloudError(text or f"{pair.remote}: the node refused (exit {status})")
        self.say_once(kept)

    def target(self, pair: PortPair) -> dict[str, object]:
        remote = pair.remote
        where = {"socket": remote} if isinstance(remote, str) else {"port": remote}
        return {"job": self.job, "rank": self.rank, **where}

    def open(self, pair: PortPair, _peer: tuple[str, int]) -> Carrier:
        """Through OpenSSH's master when it is up and has a place (the bytes in C), else
        an exec channel of tcloud's own connection."""
        master = self.openssh()
        if master is not None and master.take_slot():
            try:
                command = agent.exec_command(
                    self.client, self.verb, self.userdir, **self.target(pair)
                )
            except BaseException:
                master.give_slot()
                raise
            return OpenSshConnection(self, master, command)
        return Connection(self, self.start(pair))  # none, or all its places taken


class Connection:
    """One `job connect` channel as relay() uses it; its stderr said (once per line) on
    a thread of its own; closing it gives its place in the gate back."""

    def __init__(self, way: JobWay, channel) -> None:
        self.way, self.channel = way, channel
        self.errors = threading.Thread(
            target=interactive.pump, args=(channel.recv_stderr, way.say_once), daemon=True
        )
        self.errors.start()

    def recv(self, size: int) -> bytes:
        return self.channel.recv(size)

    def sendall(self, data: bytes) -> None:
        self.channel.sendall(data)

    def shutdown_write(self) -> None:
        self.channel.shutdown_write()

    def close(self) -> None:
        self.errors.join(timeout=5)
        self.way.closed(self.channel)

    def carry(self, sock: socket.socket) -> None:
        relay(sock, self)


@dataclass(frozen=True)
class OpenSshConnection:
    """One `job connect` run by a session of OpenSSH's master, the accepted socket its
    stdin and stdout (tcloud.transport.openssh); its stderr said once per line."""

    way: JobWay
    master: openssh.Master
    command: str

    def carry(self, sock: socket.socket) -> None:
        status = self.master.session(self.command, sock, self.way.say_once)
        if status == openssh.SSH_FAILED:
            self.way.warn("a forwarded connection: ssh could not run it (exit 255)")


class Forwarder:
    """Listening sockets and their accept threads; close() stops them (connections
    already relaying end when either side closes)."""

    def __init__(self, pairs: Sequence[PortPair], opener: Opener, warn: Callable[[str], None]):
        self.pairs = list(pairs)
        self.opener = opener
        self.warn = warn
        self.listeners = listen(self.pairs)
        self.closed = threading.Event()
        self.threads = [
            threading.Thread(target=self.accept, args=(pair, sock), daemon=True)
            for pair, sock in zip(self.pairs, self.listeners, strict=True)
        ]
        for thread in self.threads:
            thread.start()

    @property
    def mapping(self) -> dict[int | str, int]:
        return {
            pair.remote: sock.getsockname()[1]
            for pair, sock in zip(self.pairs, self.listeners, strict=True)
        }

    def accept(self, pair: PortPair, listener: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                sock, peer = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self.connect, args=(pair, sock, peer), daemon=True).start()

    def connect(self, pair: PortPair, sock: socket.socket, peer: tuple[str, int]) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            carrier = self.opener(pair, peer)
        except Exception as exc:  # the node refused, the connection dropped: say, go on
            self.warn(f"port {pair.remote}: cannot connect on the node: {exc}")
            sock.close()
            return
        carrier.carry(sock)

    def close(self) -> None:
        self.closed.set()
        for sock in self.listeners:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def __enter__(self) -> Forwarder:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()


@contextlib.contextmanager
def stop_on_interrupt() -> Iterator[threading.Event]:
    """Ctrl-C (SIGINT) sets the event instead of raising KeyboardInterrupt wherever the
    main thread happens to be: a KeyboardInterrupt inside paramiko (the job's status,
    asked every few seconds) could leave its locks held, and the forward then hung on
    the way out. Outside the main thread the handler stays as it is."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    before = signal.signal(signal.SIGINT, lambda _number, _frame: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, before)


def hold(
    still_running: Callable[[], bool], poll: float = 5.0, stop: threading.Event | None = None
) -> None:
    """Until the job stops running (asked every `poll` s) or `stop` is set; Ctrl-C goes on
    to the caller."""
    stop = stop or threading.Event()
    while not stop.wait(poll):
        if not still_running():
            return
