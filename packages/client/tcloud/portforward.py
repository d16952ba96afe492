"""`tcloud forward`: local ports to ports on a running job's node, like `ssh -L`. Each
local port listens on 127.0.0.1 only; each connection accepted there is one
direct-tcpip channel through the verified direct SSH connection's transport to (the
node's address, the port), relayed both ways with big reads and a big channel window
(throughput is compared with `ssh -L`). The login node's sshd makes the hop to the
node; nothing listens on the cluster side."""

from __future__ import annotations

import contextlib
import errno
import signal
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tcloud.errors import TcloudError, UsageError

LOCALHOST = "127.0.0.1"
CHUNK = 1 << 18  # bytes per read on either side
# The channel's receive window. Measured on the lab (a 100 MB registry blob through
# login1 to n1, 2 cores): 4 MiB ran steadiest (160-236 MB/s, `ssh -L` 190-240); 16 MiB
# and more swung down to 40-70 MB/s (Python buffers the backlog), 2 MiB a little lower.
WINDOW = 1 << 22
BACKLOG = 64


@dataclass(frozen=True)
class PortPair:
    """One forwarded port: the job's port and the local one."""

    remote: int
    local: int


EXPECTED = "expected PORT or PORT:LOCAL, each a port from 1 to 65535 (LOCAL 0: any free one)"


def port_number(text: str, spec: str, lowest: int = 1) -> int:
    if not text.isascii() or not text.isdigit() or not lowest <= int(text) <= 65535:
        raise UsageError(f"port {spec!r}: {EXPECTED}")
    return int(text)


def parse_pair(spec: str) -> PortPair:
    """PORT or PORT:LOCAL (LOCAL defaults to PORT; 0 is any free port)."""
    remote, colon, local = spec.partition(":")
    number = port_number(remote, spec)
    return PortPair(number, port_number(local, spec, lowest=0) if colon else number)


def pairs_of(ports: Sequence[int | str] | Mapping[int, int]) -> list[PortPair]:
    """The SDK's ports: [8888, "6006:16006"] or {remote: local}; no local port twice."""
    if isinstance(ports, Mapping):
        pairs = [parse_pair(f"{remote}:{local}") for remote, local in ports.items()]
    elif isinstance(ports, str | int):
        pairs = [parse_pair(str(ports))]
    else:
        pairs = [parse_pair(str(port)) for port in ports]
    if not pairs:
        raise UsageError("forward: expected at least one PORT[:LOCAL]")
    locals_ = [pair.local for pair in pairs]
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


Opener = Callable[[PortPair, tuple[str, int]], object]  # -> a channel


def channel_opener(transport, address: str) -> Opener:
    """Opens a direct-tcpip channel to (address, remote port) on the transport."""

    def open_channel(pair: PortPair, peer: tuple[str, int]):
        return transport.open_channel(
            "direct-tcpip", (address, pair.remote), peer, window_size=WINDOW
        )

    return open_channel


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
    def mapping(self) -> dict[int, int]:
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
            channel = self.opener(pair, peer)
        except Exception as exc:  # the node refused, the connection dropped: say, go on
            self.warn(f"port {pair.remote}: cannot connect on the node: {exc}")
            sock.close()
            return
        relay(sock, channel)

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
