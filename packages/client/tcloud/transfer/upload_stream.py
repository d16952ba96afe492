"""Client side of the streamed upload: every missing blob, one after the other, in one
framed stream to `tacc-agent store receive` (the format: tacc_agent.tasks.store.receive;
one JSON header line per blob, its bytes from the offset the cluster already holds, an
end line). No round trip per file: the stream only waits on the SSH window."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tcloud.errors import TcloudError
from tcloud.transfer.manifest import shown
from tcloud.transport.packet import CHANNEL_WRITE

# What one write hands the channel: one SSH packet's worth (tcloud.transport.packet: a larger write
# is sliced, and copied, by paramiko's sendall once per packet). Read unbuffered, each
# read is one system call into a fresh small object (no page faults of a large one).
CHUNK = CHANNEL_WRITE
END_FRAME = b'{"end": true}\n'

Write = Callable[[bytes], object]


@dataclass(frozen=True)
class Blob:
    """One missing blob: its name, the partial file `missing` gave this upload, the bytes
    already there, its size, and where its bytes are here."""

    name: str
    upload: str
    offset: int
    size: int
    source: Path

    def header(self) -> bytes:
        fields = {
            "blob": self.name,
            "upload": self.upload,
            "offset": self.offset,
            "size": self.size,
        }
        return json.dumps(fields).encode() + b"\n"


def changed(source: Path, detail: str) -> TcloudError:
    return TcloudError(
        f"{shown(source)}: {detail} (did it change since tcloud hashed it? run the command again)"
    )


def blob_frames(blob: Blob, write: Write, progress) -> int:
    """Write one blob's header and its bytes from blob.offset; the bytes sent."""
    try:
        handle = blob.source.open("rb", buffering=0)
    except OSError as exc:
        raise changed(blob.source, f"cannot read: {exc.strerror or exc}") from None
    write(blob.header())
    left = blob.size - blob.offset
    with handle:
        handle.seek(blob.offset)
        while left:
            try:
                block = handle.read(min(CHUNK, left))
            except OSError as exc:
                raise changed(blob.source, f"cannot read: {exc.strerror or exc}") from None
            if not block:
                raise changed(blob.source, "it is shorter than when it was hashed")
            write(block)
            left -= len(block)
            progress.add(len(block))
    return blob.size - blob.offset


def frames(blobs: Sequence[Blob], write: Write, progress) -> int:
    """The whole stream: every blob, then the end frame; the blob bytes sent."""
    sent = sum(blob_frames(blob, write, progress) for blob in blobs)
    write(END_FRAME)
    return sent
