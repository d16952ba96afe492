"""Layer 2 -> cluster: send only the blobs the cluster lacks, resumably, then have the
cluster verify them and build the job's own workdir (`tacc-agent store`).

A submit is: `missing` (which also commits, and sbatches, when nothing is missing: one
round trip for a resubmit), the missing blobs in one framed stream that the cluster
hashes as they arrive (tcloud.transfer.upload_stream; SFTP, one file at a time, for an agent
that cannot receive one), and `commit`, which then reads no blob again."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from tacc_contract import protocol, verbs
from tacc_contract.protocol import blob_name
from tcloud.compile.compiler import Instruction
from tcloud.errors import TcloudError
from tcloud.transfer.manifest import shown
from tcloud.transfer.upload_stream import Blob, frames
from tcloud.transport import agent
from tcloud.transport.agent import call
from tcloud.transport.transport_errors import transport_errors

if TYPE_CHECKING:
    import paramiko

CHUNK = 1 << 20
__all__ = ["CHUNK", "Progress", "UploadResult", "blob_name", "remote", "send", "upload"]


@dataclass(frozen=True)
class UploadResult:
    workdir: str
    userdir: str
    blobs_sent: int
    bytes_sent: int
    seconds: float
    job: dict | None = None  # the agent's submit answer, with submit=True


def remote(client: paramiko.SSHClient, request: dict, userdir: str | None) -> dict:
    """One round trip to the cluster side of the upload (`tacc-agent store`); a task the
    cluster refuses is an error of the task (exit 3, the message names the field)."""
    stdin = json.dumps(request).encode()
    return call(client, verbs.STORE, userdir, stdin)


def round_trip(client: paramiko.SSHClient, request: dict, userdir: str | None) -> dict:
    """`remote`, its answer checked against the shape of the request's op."""
    return protocol.store_answer(request, remote(client, request, userdir))


class Progress:
    """The upload's bar on stderr (tqdm: bytes, rate, time left); silent when stderr is
    not a terminal or there is nothing to send."""

    def __init__(self, total: int) -> None:
        self.bar = tqdm(
            total=total,
            desc="upload",
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            file=sys.stderr,
            disable=not (total and sys.stderr.isatty()),
            dynamic_ncols=True,
        )

    def add(self, count: int) -> None:
        self.bar.update(count)

    def close(self) -> None:
        self.bar.close()


def send(sftp: paramiko.SFTPClient, local: Path, remote_path: str, offset: int, progress) -> int:
    """Append local[offset:] to remote_path (from offset 0: write it afresh, whatever a
    broken earlier upload left there); return bytes sent."""
    sent = 0
    try:
        handle = local.open("rb")
    except OSError as exc:
        raise TcloudError(
            f"{shown(local)}: cannot read: {exc.strerror or exc} (did it change since tcloud "
            "hashed it? run the command again)"
        ) from None
    with handle as source, sftp.open(remote_path, "ab" if offset else "wb") as target:
        target.set_pipelined(True)
        source.seek(offset)
        for block in iter(lambda: source.read(CHUNK), b""):
            target.write(block)
            sent += len(block)
            progress.add(len(block))
    return sent


def stopped(exc: BaseException) -> TcloudError:
    # A dropped connection (or a file that vanished here): what arrived stays in the
    # cluster's .partial store and the next run sends only the rest.
    detail = str(exc) or type(exc).__name__
    return TcloudError(
        f"the upload stopped ({detail}); run the command again: what arrived is "
        "kept and only the rest is sent"
    )


def stream_blobs(client: paramiko.SSHClient, userdir: str | None, produce) -> dict:
    """One `store receive` call that reads everything produce(write) writes."""
    return agent.call_streaming(client, verbs.STORE_RECEIVE, userdir, produce)


def send_streamed(client, userdir: str | None, blobs: list[Blob], progress) -> int:
    """Every blob in one stream; the bytes sent. The cluster stored each one whose hash
    matched on its last byte; the others are in the answer's "bad"."""
    sent = 0

    def produce(write) -> None:
        nonlocal sent
        sent = frames(blobs, write, progress)

    try:
        answer = stream_blobs(client, userdir, produce)
    except (agent.SessionLost, *transport_errors()) as exc:
        raise stopped(exc) from None
    if not isinstance(answer, dict) or not isinstance(answer.get("bad"), list):
        raise TcloudError(f"store receive answered {str(answer)[:200]!r}")
    if answer["bad"]:
        raise TcloudError(
            f"{len(answer['bad'])} blob(s) failed verification on the cluster and were "
            "dropped; run the command again to resend them"
        )
    return sent


def send_sftp(client, store: str, blobs: list[Blob], progress) -> int:
    """Each blob by SFTP into its partial file (an agent that cannot receive a stream)."""
    sent = 0
    sftp = client.open_sftp()
    try:
        for blob in blobs:  # missing_blob restarted a partial longer than its blob at 0
            target = f"{store}/store/.partial/{blob.upload}"
            sent += send(sftp, blob.source, target, blob.offset, progress)
    except transport_errors() as exc:
        raise stopped(exc) from None
    finally:
        with contextlib.suppress(Exception):  # the connection may be gone already
            sftp.close()
    return sent


def upload(
    client: paramiko.SSHClient,
    instruction: Instruction,
    userdir: str | None = None,
    submit: bool = False,
) -> UploadResult:
    """Send what the cluster lacks and build the job directory; with submit, the same
    round trips also refuse an impossible task first and sbatch the job at the end."""
    start = time.monotonic()
    names = {path: blob_name(e.sha256, e.mode) for path, e in instruction.manifest.items()}
    first_path = {}
    for path, name in names.items():
        first_path.setdefault(name, path)
    files = {"instruction.json": json.dumps(instruction.document, sort_keys=True, indent=1)}
    first = protocol.missing_request(first_path, instruction.document if submit else None)
    # Done at once when nothing is missing (an agent that cannot ignores it).
    first["commit"] = protocol.commit_request([], names, {}, instruction.digest, files, submit)
    first["submit"] = submit
    answer = round_trip(client, first, userdir)
    missing, partial, store = answer["missing"], answer["partial"], answer["userdir"]
    sent = 0
    if "workdir" not in answer:
        # Each upload writes its own partial file (a copy of what a cut one left): two
        # submits of the same new file at once never append to one file.
        if missing and not isinstance(answer.get("uploads"), dict):
            raise TcloudError(
                "the cluster's tacc-agent is older than this tcloud (its store gives each "
                "upload no file of its own): ask the cluster's operators to upgrade the agent"
            )
        uploads = {name: answer["uploads"][name] for name in missing}
        blobs = [
            missing_blob(instruction, first_path[name], name, uploads[name], partial)
            for name in missing
        ]
        progress = Progress(sum(blob.size - min(blob.offset, blob.size) for blob in blobs))
        try:
            if blobs and answer.get("receive") is True:
                sent = send_streamed(client, userdir, blobs, progress)
            elif blobs:
                sent = send_sftp(client, store, blobs, progress)
        finally:
            progress.close()
        request = protocol.commit_request(
            missing, names, uploads, instruction.digest, files, submit
        )
        answer = round_trip(client, request, userdir)
    else:
        answer = protocol.STORE_ANSWERS["commit"].check(answer, "store (missing, then commit)")
    if answer["bad"]:
        raise TcloudError(
            f"{len(answer['bad'])} blob(s) failed verification on the cluster and were "
            "dropped; run the command again to resend them"
        )
    seconds = time.monotonic() - start
    return UploadResult(
        answer["workdir"], answer["userdir"], len(missing), sent, seconds, answer.get("job")
    )


def missing_blob(
    instruction: Instruction, path: str, name: str, upload: str, partial: dict
) -> Blob:
    entry = instruction.manifest[path]
    offset = partial.get(name, 0)
    if offset > entry.size:  # not a prefix of this blob: the agent starts it afresh
        offset = 0
    return Blob(name, upload, offset, entry.size, entry.source)
