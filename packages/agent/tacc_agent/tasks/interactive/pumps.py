"""Bytes moved between two ends (sockets, pipes), each direction on its own, and each
source's end passed on to its sink (a socket's write side shut, a pipe closed): the
relay on the node and `job connect` on the login node move a forward's bytes so."""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

CHUNK = 1 << 18  # bytes per read


@dataclass(frozen=True)
class End:
    """One end: the descriptor read, the one written, and how its writing ends."""

    read: int
    write: int
    finish: Callable[[], None]

    @classmethod
    def of_socket(cls, sock: socket.socket) -> End:
        return cls(sock.fileno(), sock.fileno(), lambda: sock.shutdown(socket.SHUT_WR))

    @classmethod
    def of_pipes(cls, read: int, write: int) -> End:
        return cls(read, write, lambda: os.close(write))


def read_exactly(receive: Callable[[int], bytes], count: int) -> bytes:
    """`count` bytes from receive (os.read on a descriptor, a socket's recv), or fewer
    when its source ends first."""
    data = b""
    while len(data) < count and (chunk := receive(count - len(data))):
        data += chunk
    return data


def write_all(sink: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(sink, view) :]


def copy(source: int, sink: int) -> bool:
    """Bytes from source to sink until source ends (True), or either breaks (False).
    Read and written: /proc/PID/io (rchar, wchar) counts them, as a session's idle
    watchdog needs (tasks.interactive.idle). Not splice(2): it counts nothing, and from
    a socket into a pipe it holds the pipe's lock while it waits for the socket, so
    sshd, reading a channel's pipe, would stall with every channel of its connection."""
    try:
        while data := os.read(source, CHUNK):
            write_all(sink, data)
    except OSError:
        return False
    return True


def one_way(source: End, sink: End) -> bool:
    """source's bytes into sink, then sink's writing ended; True when source ended
    (False: a side broke, e.g. the sink's reader went away)."""
    ended = copy(source.read, sink.write)
    with contextlib.suppress(OSError):
        sink.finish()
    return ended


def start(source: End, sink: End, then: Callable[[bool], None] | None = None) -> threading.Thread:
    """one_way on a thread of its own (a daemon: a process may end before its source);
    `then` is given its result."""

    def run() -> None:
        ended = one_way(source, sink)
        if then is not None:
            then(ended)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def shut(sock: socket.socket) -> None:
    """sock shut both ways: a thread blocked on it returns; the descriptor stays open
    (no other thread can find its number reused), closed with the socket later."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def reset(sock: socket.socket) -> None:
    """sock shut both ways and closed with a reset (SO_LINGER 0): the peer's reads and
    writes fail at once, where a plain end would look like a half-close to it (Linux
    takes bytes after a shutdown without a word). Only for a process about to end:
    another thread may still hold the descriptor's number."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    shut(sock)
    sock.close()


def copy_all(data: bytes, sink: End) -> None:
    """The last bytes for sink, then its end."""
    with contextlib.suppress(OSError):
        write_all(sink.write, data)
    with contextlib.suppress(OSError):
        sink.finish()
