"""An exec channel carried by the connection master, the command's end: what `tcloud
shell`, `exec` and `logs` use as a paramiko.Channel (recv, recv_stderr, sendall,
shutdown_write, resize_pty, recv_exit_status, exit_status_ready, close, and fileno for
select), over the master's socket in frames (tcloud.transport.frames). No SSH handshake
of its own: the master's connection, already verified and logged in, opens the channel.

One thread reads the frames into a stdout and a stderr buffer (READ_AHEAD bytes and one
frame at most); as paramiko does, a pipe is readable while stdout has data or has ended,
so that select() sees the channel. A PTY's new size never waits for a write in progress
(SIGWINCH comes on the thread that may be in sendall): it is sent after that write."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

from tcloud.transport import frames

SEND_CHUNK = 1 << 16
# What is read ahead of the command, stdout and stderr together: past it the master's
# writes wait, so the SSH channel's window closes (paramiko's own channel holds at most
# its window the same way).
READ_AHEAD = 4 << 20


class MuxChannel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.send_lock = threading.Lock()
        self.changed = threading.Condition()
        self.out = bytearray()
        self.err = bytearray()
        self.out_ended = False
        self.err_ended = False
        self.status: int | None = None
        self.ended = False  # the master hung up (or this end closed): no frame comes
        self.closed = False
        self.ready_read, self.ready_write = os.pipe()
        self.signalled = False
        self.resized: tuple[int, int] | None = None
        threading.Thread(target=self.read_frames, daemon=True).start()

    # --- what comes from the master ------------------------------------------------
    def read_frames(self) -> None:
        try:
            while True:
                kind, payload = frames.read(self.sock.recv)
                with self.changed:
                    while len(self.out) + len(self.err) > READ_AHEAD and not self.closed:
                        self.changed.wait()
                    if kind == frames.OUT:
                        self.out += payload
                        self.out_ended = self.out_ended or not payload
                        self.signal()
                    elif kind == frames.ERR:
                        self.err += payload
                        self.err_ended = self.err_ended or not payload
                    elif kind == frames.EXIT:
                        self.status = frames.exit_status(payload)
                    self.changed.notify_all()
        except (OSError, EOFError, ValueError):
            pass
        with self.changed:
            self.ended = True
            self.signal()
            self.changed.notify_all()

    def signal(self) -> None:
        """Makes fileno() readable (called holding self.changed)."""
        if not self.signalled and not self.closed:
            os.write(self.ready_write, b"!")
            self.signalled = True

    def fileno(self) -> int:
        return self.ready_read

    def ended_stream(self, buffer: bytearray) -> bool:
        return self.ended or (self.out_ended if buffer is self.out else self.err_ended)

    def take(self, buffer: bytearray, size: int) -> bytes:
        """Up to `size` bytes of `buffer` once it has some; b"" once its stream ended."""
        with self.changed:
            while not buffer and not self.ended_stream(buffer):
                self.changed.wait()
            data = bytes(buffer[:size])
            del buffer[:size]
            self.changed.notify_all()
            if buffer is self.out and not buffer and not self.ended_stream(buffer):
                self.unsignal()
            return data

    def unsignal(self) -> None:
        if self.signalled and not self.closed:
            os.read(self.ready_read, 1)
            self.signalled = False

    def recv(self, size: int) -> bytes:
        return self.take(self.out, size)

    def recv_stderr(self, size: int) -> bytes:
        return self.take(self.err, size)

    def recv_exit_status(self) -> int:
        """The remote exit status once it came; -1 when the channel ended without one."""
        with self.changed:
            while self.status is None and not self.ended:
                self.changed.wait()
            return -1 if self.status is None else self.status

    def exit_status_ready(self) -> bool:
        with self.changed:
            return self.status is not None or self.ended

    # --- what goes to the master ---------------------------------------------------
    def send_frame(self, data: bytes) -> None:
        with self.send_lock:
            self.sock.sendall(data)
            self.send_resize()

    def send_resize(self) -> None:
        """The newest size asked for, if any (called holding send_lock)."""
        size, self.resized = self.resized, None
        if size is not None:
            self.sock.sendall(frames.resize_frame(*size))

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        for start in range(0, len(view), SEND_CHUNK):
            self.send_frame(frames.frame(frames.IN, bytes(view[start : start + SEND_CHUNK])))

    def shutdown_write(self) -> None:
        with contextlib.suppress(OSError):
            self.send_frame(frames.frame(frames.EOF))

    def resize_pty(self, width: int = 80, height: int = 24, **_pixels: int) -> None:
        self.resized = (width, height)
        if self.send_lock.acquire(blocking=False):  # else the write in progress sends it
            try:
                self.send_resize()
            finally:
                self.send_lock.release()

    def close(self) -> None:
        """Hangs up: the master closes the channel (its remote command ends)."""
        with self.changed:
            if self.closed:
                return
            self.closed = True
            self.ended = True
            self.changed.notify_all()
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            os.close(self.ready_read)
            os.close(self.ready_write)
