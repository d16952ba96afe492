"""Cluster side of tcloud's streamed upload: every missing blob in one framed stream,
each hashed as it arrives and linked read-only into the store on its last byte.

The stream (what tcloud.transfer.upload_stream writes), after `store` {"op": "missing"} named
each blob's partial file:

    per blob   one header line, JSON, at most HEADER_LIMIT bytes with its newline:
               {"blob": "<sha256>-<mode>", "upload": "<blob>.<32 hex digits>",
                "offset": <bytes already in that partial file>, "size": <the blob's size>}
               then exactly size - offset raw bytes
    at the end {"end": true} and a newline; nothing after it is read

Everything is checked before a byte is written: the blob's name, the upload's name (the
blob's own partial file, store.UPLOAD: no path in it), an offset equal to what that file
really holds, a size within MAX_BLOB_SIZE, each blob once. A refusal is Rejected. The
resumed prefix is hashed first, then every byte as it is written; on the blob's last
byte a good one is installed (store.install_blob), a bad one is dropped and named in
the answer's "bad". A stream cut part-way leaves what arrived in the partial file (each
block is written through, unbuffered): `missing` offers it to the next upload, which
sends only the rest. The commit that follows finds the blobs in the store: no re-hash.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tacc_agent import locks
from tacc_agent.errors import Rejected
from tacc_agent.tasks.store.delta import (
    BLOB,
    UPLOAD,
    Partials,
    blob_sha256,
    ensure_dirs,
    install_blob,
    partial_files,
    partials_by_blob,
    store_dirs,
)

HEADER_LIMIT = 4096
READ_SIZE = 1 << 18  # one reused buffer: no fresh bytes object (and its page faults) per read
MAX_BLOB_SIZE = 1 << 40
END = {"end": True}
HEADER_KEYS = {"blob", "upload", "offset", "size"}
OPEN_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
# One writer per partial file: a flock, the open file's, so this process's own check of
# the blob's partial files (drop_unused_partials) sees the one it writes busy, and
# closing that check's descriptor never drops the writer's lock.
UPLOAD_LOCK = locks.FLOCK


@dataclass(frozen=True)
class Frame:
    """One blob's header: which blob, into which partial file, from where."""

    blob: str
    upload: str
    offset: int
    size: int


def read_header(reader: BinaryIO) -> Frame | None:
    """The next blob's header; None at the end frame. Rejected for anything else."""
    line = reader.readline(HEADER_LIMIT)
    if not line:
        raise Rejected("the upload stream ended before its end frame (cut off?)")
    if not line.endswith(b"\n"):
        raise Rejected(f"upload stream: a header longer than {HEADER_LIMIT} bytes, or cut off")
    try:
        header = json.loads(line)
    except (ValueError, RecursionError):
        raise Rejected("upload stream: a header that is not JSON") from None
    if header == END:
        return None
    return checked_frame(header)


def checked_frame(header: object) -> Frame:
    wrong = (
        'upload stream: expected {"blob": <sha256>-<mode>, "upload": <blob>.<32 hex digits>, '
        '"offset": n, "size": n} or {"end": true}'
    )
    if not isinstance(header, dict) or set(header) != HEADER_KEYS:
        raise Rejected(wrong)
    blob, upload, offset, size = (header[key] for key in ("blob", "upload", "offset", "size"))
    if not isinstance(blob, str) or not BLOB.fullmatch(blob):
        raise Rejected(f"upload stream: not a blob name: {blob!r}")
    match = UPLOAD.fullmatch(upload) if isinstance(upload, str) else None
    if not match or match.group(1) != blob:
        raise Rejected(f"upload stream: {upload!r} is not a partial file of {blob}")
    numbers = (offset, size)
    if any(type(n) is not int for n in numbers) or not 0 <= offset <= size <= MAX_BLOB_SIZE:
        raise Rejected(f"upload stream: {blob}: expected 0 <= offset <= size <= {MAX_BLOB_SIZE}")
    return Frame(blob, upload, offset, size)


def copy_exactly(reader: BinaryIO, count: int, digest, out) -> int:
    """Hash and write the next count bytes of reader (to Discard(): hash only); the bytes
    that arrived (fewer only when reader ended early: then all of them are in out)."""
    buffer = bytearray(READ_SIZE)
    view, done = memoryview(buffer), 0
    while done < count:
        got = reader.readinto(view[: min(READ_SIZE, count - done)])
        if not got:
            break
        digest.update(view[:got])
        written = 0
        while written < got:  # a raw write may take less than it was given
            written += out.write(view[written:got])
        done += got
    return done


class Discard:
    def write(self, data: bytes) -> int:
        return len(data)


def drop_unused_partials(partial: Path, name: str) -> None:
    """Blob `name`'s partial files that no upload is writing (their lock is free)."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    for path in partial_files(partial, name):
        with contextlib.suppress(OSError), locks.lock_file(path, UPLOAD_LOCK, flags=flags) as free:
            if free:  # else in use by another upload of the blob
                path.unlink(missing_ok=True)


def receive_blob(
    store: Path, partial: Path, frame: Frame, reader: BinaryIO, listed: Partials | None = None
) -> bool:
    """Read one blob's bytes into its partial file; True when it is now in the store.
    `listed`: the partial files as the stream found them (store.partials_by_blob)."""
    final, staged = store / frame.blob, partial / frame.upload
    digest, count = hashlib.sha256(), frame.size - frame.offset
    if final.exists():  # another upload stored it meanwhile: the bytes are not needed
        if copy_exactly(reader, count, digest, Discard()) < count:
            raise Rejected("the upload stream was cut off part-way through a blob")
        with contextlib.suppress(FileNotFoundError):
            staged.unlink()
        return True
    try:
        fd = os.open(staged, OPEN_FLAGS, 0o600)
    except OSError as exc:
        raise Rejected(f"upload stream: {frame.upload}: {exc.strerror}") from None
    with open(fd, "r+b", buffering=0) as handle:
        # One writer per partial file: a second stream (or a stalled older tcloud's
        # SFTP) appending to it would add bytes this stream never hashed.
        if not locks.take(fd, UPLOAD_LOCK):  # held until the file is closed
            raise Rejected(
                f"upload stream: {frame.blob}: another upload is writing its partial file"
            )
        there = os.fstat(fd).st_size
        if there < frame.offset:
            raise Rejected(
                f"upload stream: {frame.blob}: offset {frame.offset}, but its partial "
                f"file holds {there} bytes"
            )
        if there > frame.offset:  # the client starts it again from there (its own file)
            os.ftruncate(fd, frame.offset)
        if copy_exactly(handle, frame.offset, digest, Discard()) != frame.offset:
            raise Rejected(f"upload stream: {frame.blob}: its partial file changed meanwhile")
        if copy_exactly(reader, count, digest, handle) < count:
            raise Rejected("the upload stream was cut off part-way through a blob")
        if os.fstat(fd).st_size != frame.size or digest.hexdigest() != blob_sha256(frame.blob):
            with contextlib.suppress(FileNotFoundError):
                staged.unlink()
            # What fed the bad prefix (a partial file this upload copied) goes too, or the
            # next upload would copy it again; another upload of the blob still writing
            # its own file (it holds its lock) goes on.
            drop_unused_partials(partial, frame.blob)
            return False
        # Installed from the open file, under the lock: the bytes hashed are the bytes
        # linked, whatever happens to the path meanwhile.
        return install_blob(store, partial, frame.blob, staged, fd, listed)


def receive(user_dir: Path, reader: BinaryIO) -> dict:
    """Consume one upload stream through its end frame (and no further); the answer:
    {"received": blobs now in the store, "bad": blobs to send again, "bytes": n}."""
    store, partial, _ = store_dirs(user_dir)
    ensure_dirs(user_dir)
    listed = partials_by_blob(partial)  # once: not a listing of .partial per blob
    received: list[str] = []
    bad: list[str] = []
    seen: set[str] = set()
    total = 0
    while (frame := read_header(reader)) is not None:
        if frame.blob in seen:
            raise Rejected(f"upload stream: {frame.blob} sent twice")
        seen.add(frame.blob)
        stored = receive_blob(store, partial, frame, reader, listed)
        (received if stored else bad).append(frame.blob)
        total += frame.size - frame.offset
    return {"received": received, "bad": bad, "bytes": total}
