"""The forward's data path off srun's stdio: one TCP connection from `tacc-agent relay`
on the job's node back to `job connect` on the login node, each end proving itself
with a key of its own.

srun carries a step's stdio in messages of at most 1 KiB (SLURM_IO_MAX_MSG_LEN), about
15 MiB/s; a plain TCP connection carries what the network does. srun still places the
relay (inside the allocation, as the caller) and carries the offer: `job connect`
listens on a free port, writes `PORT RELAY_KEY CONNECT_KEY` (two fresh 32-byte keys,
hex) on the step's stdin, never on a command line; the relay connects to the host srun
runs on (SLURM_SRUN_COMM_HOST, the address Slurm's own I/O connections use; an IP
address, never a name) and sends RELAY_KEY; `job connect` answers CONNECT_KEY on the
first connection whose key matches and closes the listener. Anyone else connecting
(any user on the cluster can reach the port) is dropped without a byte, and the relay
sends the program's bytes only to the end that answered its key.

When the relay cannot connect back (a firewall between the nodes and the login node)
it says so on stderr, writes FALLBACK on stdout and relays over srun's stdio as before;
a connection made whose proof fails is an error, never a fallback (only one way is read).

Not encrypted, as srun's stdio is not before Slurm 25.05's TLS: the bytes cross the
cluster network in the clear between login node and node (the SSH connection ends on
the login node).
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import selectors
import socket
from dataclasses import dataclass

from tacc_agent.tasks.interactive import pumps

KEY_BYTES = 32
CONNECT_SECONDS = 5.0  # the relay's connection back and the answer to its key
PENDING_LIMIT = 64  # connections not yet proven; beyond, the oldest is dropped
OFFER_LIMIT = 256  # bytes of the offer line, newline included
FALLBACK = b"S\n"  # on the step's stdout: the program's bytes follow there
SRUN_HOST = "SLURM_SRUN_COMM_HOST"


class OfferError(ValueError):
    """The offer line is not `PORT KEY KEY`."""


@dataclass(frozen=True)
class Offer:
    """What `job connect` tells the relay: its port and both keys."""

    port: int
    relay_key: bytes
    connect_key: bytes

    @classmethod
    def fresh(cls, port: int) -> Offer:
        return cls(port, secrets.token_bytes(KEY_BYTES), secrets.token_bytes(KEY_BYTES))

    def line(self) -> bytes:
        return f"{self.port} {self.relay_key.hex()} {self.connect_key.hex()}\n".encode()

    @classmethod
    def parse(cls, line: bytes) -> Offer:
        words = line.decode("ascii", errors="replace").split()
        try:
            port, relay_key, connect_key = words
            offer = cls(int(port), bytes.fromhex(relay_key), bytes.fromhex(connect_key))
        except ValueError:
            raise OfferError("expected `PORT RELAY_KEY CONNECT_KEY` on stdin") from None
        lengths = {len(offer.relay_key), len(offer.connect_key)}
        if not 1 <= offer.port <= 65535 or lengths != {KEY_BYTES}:
            raise OfferError(f"expected a port 1..65535 and two {KEY_BYTES}-byte keys")
        return offer


def read_offer(fd: int = 0) -> Offer:
    """The offer line from fd, a byte at a time: nothing after its newline is taken
    (in the fallback the bytes after it are the caller's)."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte or len(line) >= OFFER_LIMIT:
            raise OfferError("expected `PORT RELAY_KEY CONNECT_KEY` and a newline on stdin")
        line += byte
    return Offer.parse(line)


def listen() -> socket.socket:
    """A listener on a free port of every address (IPv4 and IPv6 where both exist): the
    relay connects to whichever address Slurm knows this host by."""
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):
            return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


class Gate:
    """`job connect`'s side: connections on the listener until one sends the relay's
    key (it is answered and returned) or `stop_fd` becomes readable (the step said
    something on stdout, or ended: None)."""

    def __init__(self, listener: socket.socket, offer: Offer, stop_fd: int) -> None:
        self.listener, self.offer, self.stop_fd = listener, offer, stop_fd
        self.selector = selectors.DefaultSelector()
        self.pending: dict[socket.socket, bytes] = {}

    def drop(self, conn: socket.socket) -> None:
        self.selector.unregister(conn)
        del self.pending[conn]
        conn.close()

    def admit(self) -> None:
        """Every connection waiting on the listener (a flood is taken in at once, so the
        relay's never waits behind it for long)."""
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:  # none left, gone before accept, out of descriptors
                return
            if len(self.pending) >= PENDING_LIMIT:
                self.drop(next(iter(self.pending)))
            conn.setblocking(False)
            self.pending[conn] = b""
            self.selector.register(conn, selectors.EVENT_READ)

    def hears(self, conn: socket.socket) -> bool:
        """Reads what conn sent; True when it is the relay's key (answered)."""
        try:
            data = conn.recv(KEY_BYTES - len(self.pending[conn]))
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        said = self.pending[conn] + data
        if not data or (
            len(said) == KEY_BYTES and not hmac.compare_digest(said, self.offer.relay_key)
        ):
            self.drop(conn)
            return False
        self.pending[conn] = said
        if len(said) < KEY_BYTES:
            return False
        self.selector.unregister(conn)
        del self.pending[conn]
        conn.setblocking(True)
        try:
            conn.sendall(self.offer.connect_key)
        except OSError:
            conn.close()
            return False
        return True

    def wait(self) -> socket.socket | None:
        self.listener.setblocking(False)
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.stop_fd, selectors.EVENT_READ)
        try:
            while True:
                for key, _ in self.selector.select():
                    if key.fileobj == self.stop_fd:
                        return None
                    if key.fileobj is self.listener:
                        self.admit()
                    elif self.hears(key.fileobj):
                        return key.fileobj
        finally:
            for conn in list(self.pending):
                self.drop(conn)
            self.selector.close()
            self.listener.close()


class Unreachable(Exception):
    """No connection back can be made: srun's host is no IP address, or nothing answers."""


def address_of(host: str) -> str:
    """srun's host as Slurm gave it, which must be an IP address: a name could resolve
    to another host (an alias of several login nodes), where someone else may listen
    on the same port and pass the keys on."""
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        raise Unreachable(f"{SRUN_HOST}={host!r} is not an IP address") from None


def connection_to(address: str, port: int, timeout: float = CONNECT_SECONDS) -> socket.socket:
    """The TCP connection to `job connect` (OSError: refused, timed out)."""
    sock = socket.create_connection((address, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def prove(sock: socket.socket, offer: Offer) -> None:
    """The relay's key sent, the connect key expected back; OSError otherwise (nothing
    of the program's is sent before). sock blocks again after."""
    sock.sendall(offer.relay_key)
    answer = pumps.read_exactly(sock.recv, KEY_BYTES)
    if not hmac.compare_digest(answer, offer.connect_key):
        raise OSError(f"port {offer.port} did not answer with the connect key")
    sock.settimeout(None)
