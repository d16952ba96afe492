"""The frames of an exec channel carried by the connection master (tcloud.transport.mux_master
relays them, tcloud.transport.mux_channel is the command's end): one byte that says what
the frame is, a 4-byte big-endian length, then that many bytes.

Master to command: OUT and ERR carry the remote command's stdout and stderr (an empty one
is that stream's end), EXIT its exit status (4 bytes, signed: -1 when the channel closed
without one), after which the master hangs up. Command to master: IN carries stdin,
EOF ends it (the channel's shutdown_write), RESIZE the PTY's new size (columns, rows: two
4-byte numbers). The command hanging up closes the channel (the remote command ends, as
when an ssh client goes away)."""

from __future__ import annotations

import struct
from collections.abc import Callable

OUT = b"o"
ERR = b"e"
EXIT = b"x"
IN = b"i"
EOF = b"w"
RESIZE = b"r"
HEADER = struct.Struct(">cI")
# The largest frame either side accepts: more is a broken or hostile peer, not data.
MAX_PAYLOAD = 1 << 20


class FrameError(ValueError):
    """Bytes that are not a frame (a length over MAX_PAYLOAD, a payload of the wrong
    size for its kind)."""


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


STATUS = struct.Struct(">i")
SIZE = struct.Struct(">II")


def exit_frame(status: int) -> bytes:
    """The exit status; one that does not fit (SSH's is unsigned) as -1, none."""
    return frame(EXIT, STATUS.pack(status if -(1 << 31) <= status < 1 << 31 else -1))


def resize_frame(columns: int, rows: int) -> bytes:
    return frame(RESIZE, SIZE.pack(columns, rows))


def exit_status(payload: bytes) -> int:
    if len(payload) != STATUS.size:
        raise FrameError(f"an exit status of {len(payload)} bytes")
    return STATUS.unpack(payload)[0]


def size(payload: bytes) -> tuple[int, int]:
    if len(payload) != SIZE.size:
        raise FrameError(f"a terminal size of {len(payload)} bytes")
    columns, rows = SIZE.unpack(payload)
    return columns, rows


def exactly(recv: Callable[[int], bytes], count: int) -> bytes:
    """`count` bytes from recv; EOFError when the peer hangs up first."""
    data = bytearray()
    while len(data) < count:
        chunk = recv(count - len(data))
        if not chunk:
            raise EOFError("the other end hung up")
        data += chunk
    return bytes(data)


def read(recv: Callable[[int], bytes]) -> tuple[bytes, bytes]:
    """The next frame: (kind, payload). EOFError at the peer's end, FrameError for a
    length over MAX_PAYLOAD."""
    kind, length = HEADER.unpack(exactly(recv, HEADER.size))
    if length > MAX_PAYLOAD:
        raise FrameError(f"a frame of {length} bytes (at most {MAX_PAYLOAD})")
    return kind, exactly(recv, length) if length else b""
