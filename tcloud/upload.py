"""Layer 2 -> cluster: send only the blobs the cluster lacks, resumably, then have the
cluster verify them and build the job's own workdir (tcloud/remote/store.py)."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import paramiko

from tcloud.compiler import Instruction
from tcloud.errors import TcloudError
from tcloud.files import userdir_path
from tcloud.schema import TaskSpec
from tcloud.ssh import run

DEFAULT_USERDIR = "~/tcloud"
CHUNK = 1 << 20


@dataclass(frozen=True)
class UploadResult:
    workdir: str
    userdir: str
    blobs_sent: int
    bytes_sent: int
    seconds: float


def blob_name(sha256: str, mode: int) -> str:
    return f"{sha256}-{mode:o}"


def remote(client: paramiko.SSHClient, request: dict) -> dict:
    """One round trip to the cluster-side store helper."""
    script = resources.files("tcloud.remote").joinpath("store.py").read_text()
    rc, out, err = run(client, ["python3", "-c", script], json.dumps(request).encode())
    if rc != 0:
        raise TcloudError(f"cluster store helper failed ({rc}): {err.strip()[-500:]}")
    return json.loads(out)


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.tty = total, 0, sys.stderr.isatty()

    def add(self, count: int) -> None:
        self.done += count
        if self.tty and self.total:
            width = 30
            filled = int(width * self.done / self.total)
            bar = "#" * filled + "." * (width - filled)
            print(
                f"\rupload [{bar}] {self.done >> 20}/{self.total >> 20} MiB",
                end="",
                file=sys.stderr,
            )

    def close(self) -> None:
        if self.tty and self.total:
            print(file=sys.stderr)


def send(sftp: paramiko.SFTPClient, local: Path, remote_path: str, offset: int, progress) -> int:
    """Append local[offset:] to remote_path; return bytes sent."""
    sent = 0
    with local.open("rb") as source, sftp.open(remote_path, "ab") as target:
        target.set_pipelined(True)
        source.seek(offset)
        for block in iter(lambda: source.read(CHUNK), b""):
            target.write(block)
            sent += len(block)
            progress.add(len(block))
    return sent


def upload(
    client: paramiko.SSHClient,
    task: TaskSpec,
    instruction: Instruction,
    userdir: str = DEFAULT_USERDIR,
) -> UploadResult:
    start = time.monotonic()
    names = {path: blob_name(e.sha256, e.mode) for path, e in instruction.manifest.items()}
    first_path = {}
    for path, name in names.items():
        first_path.setdefault(name, path)
    answer = remote(client, {"op": "missing", "userdir": userdir, "blobs": sorted(first_path)})
    missing, partial = answer["missing"], answer["partial"]
    sizes = {name: instruction.manifest[first_path[name]].size for name in missing}
    progress = Progress(sum(sizes[n] - min(partial.get(n, 0), sizes[n]) for n in missing))
    sent = 0
    if missing:
        sftp = client.open_sftp()
        try:
            store = userdir_path(sftp, userdir)
            for name in missing:
                offset = partial.get(name, 0)
                if offset > sizes[name]:
                    offset = 0
                    sftp.remove(f"{store}/store/.partial/{name}")
                local = instruction.manifest[first_path[name]].source
                sent += send(sftp, local, f"{store}/store/.partial/{name}", offset, progress)
        finally:
            progress.close()
            sftp.close()
    files = {
        "job.sh": instruction.script,
        "instruction.json": json.dumps(
            {
                "digest": instruction.digest,
                "environment": instruction.environment,
                "manifest": instruction.manifest_json(),
            },
            sort_keys=True,
            indent=1,
        ),
        "requirements.tcloud.txt": "".join(f"{r}\n" for r in task.environment["requirements"]),
    }
    request = {"op": "commit", "userdir": userdir, "blobs": missing, "manifest": names}
    answer = remote(client, {**request, "digest": instruction.digest, "files": files})
    if answer["bad"]:
        raise TcloudError(
            f"{len(answer['bad'])} blob(s) failed verification on the cluster and were "
            "dropped; run the command again to resend them"
        )
    seconds = time.monotonic() - start
    return UploadResult(answer["workdir"], answer["userdir"], len(missing), sent, seconds)
