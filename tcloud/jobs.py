"""Jobs on the cluster, through Slurm's own commands over the one SSH connection:
ps (squeue), status (scontrol/sacct), logs (tail of the job's output), cancel (scancel),
halt (scontrol requeuehold: stop now, keep it queued on hold), resume (scontrol release).
Every argument is passed as its own quoted word (tcloud.ssh.run)."""

from __future__ import annotations

import re
import shlex
import sys

import paramiko

from tcloud.errors import TcloudError
from tcloud.ssh import run

JOB_ID = re.compile(r"\d+(_\d+)?")
PS_FIELDS = ("job", "name", "user", "state", "time", "nodes", "where")
STATUS_KEYS = (
    "JobId",
    "JobName",
    "UserId",
    "JobState",
    "Reason",
    "RunTime",
    "TimeLimit",
    "NumNodes",
    "NodeList",
    "Partition",
    "QOS",
    "ExitCode",
    "WorkDir",
    "StdOut",
)


def check_ids(jobs: list[str]) -> list[str]:
    bad = [job for job in jobs if not JOB_ID.fullmatch(job)]
    if bad:
        raise TcloudError(f"not a job id: {', '.join(bad)} (expected numbers such as 1234)")
    return jobs


def checked(client: paramiko.SSHClient, argv: list[str]) -> str:
    rc, out, err = run(client, argv)
    if rc != 0:
        raise TcloudError(f"{argv[0]} failed: {err.strip() or out.strip()}")
    return out


def ps(client: paramiko.SSHClient, everyone: bool = False) -> list[dict]:
    argv = ["squeue", "--noheader", "--format=%i|%j|%u|%T|%M|%D|%R"]
    out = checked(client, argv if everyone else [*argv, "--me"])
    return [dict(zip(PS_FIELDS, line.split("|", 6), strict=True)) for line in out.splitlines()]


def parse_scontrol(text: str) -> dict[str, str]:
    """`scontrol show job -o` (one line of Key=Value words) to a dict."""
    fields = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep:
            fields[key] = value
    return fields


def status(client: paramiko.SSHClient, job: str) -> dict[str, str]:
    check_ids([job])
    rc, out, _ = run(client, ["scontrol", "show", "job", "--oneliner", job])
    if rc == 0 and out.strip():
        fields = parse_scontrol(out)
        return {key: fields[key] for key in STATUS_KEYS if key in fields}
    # Gone from slurmctld's memory: ask the accounting database.
    out = checked(
        client,
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--jobs",
            job,
            "--format=JobID,JobName,User,State,Elapsed,NNodes,NodeList,ExitCode,WorkDir",
        ],
    )
    if not out.strip():
        raise TcloudError(f"no job {job} on this cluster")
    keys = (
        "JobId",
        "JobName",
        "UserId",
        "JobState",
        "RunTime",
        "NumNodes",
        "NodeList",
        "ExitCode",
        "WorkDir",
    )
    return dict(zip(keys, out.splitlines()[0].split("|"), strict=False))


def log_path(client: paramiko.SSHClient, job: str) -> str:
    info = status(client, job)
    path = info.get("StdOut")
    if not path and info.get("WorkDir"):
        path = f"{info['WorkDir']}/logs/{info['JobName']}-{job}.out"
    if not path:
        raise TcloudError(f"job {job}: Slurm does not say where its output is")
    return path


# Follow the log until the job leaves the queue. $1 job, $2 file, $3 lines.
FOLLOW = """\
tail -n "$3" -F "$2" 2>/dev/null &
tailer=$!
while squeue --noheader --jobs "$1" 2>/dev/null | grep -q .; do sleep 2; done
sleep 1
kill "$tailer"
"""


def logs(
    client: paramiko.SSHClient, job: str, follow: bool, tail: int | None, node: int | None
) -> int:
    """Print the job's output (every node's lines carry its rank prefix, "0: ")."""
    path = log_path(client, job)
    lines = str(tail) if tail is not None else "+1"
    argv = (
        ["sh", "-c", FOLLOW, "tcloud-logs", job, path, lines]
        if follow
        else ["tail", "-n", lines, path]
    )
    channel = client.get_transport().open_session()
    channel.exec_command(shlex.join(argv))
    prefix = f"{node}: " if node is not None else None
    buffer = b""
    for chunk in iter(lambda: channel.recv(65536), b""):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        for raw in complete:
            line = raw.decode(errors="replace")
            if prefix is None or line.startswith(prefix):
                print(line, flush=True)
    if buffer and (prefix is None or buffer.decode(errors="replace").startswith(prefix)):
        print(buffer.decode(errors="replace"))
    rc = channel.recv_exit_status()
    if rc != 0 and not follow:
        err = channel.recv_stderr(65536).decode(errors="replace").strip()
        print(f"tcloud: error: cannot read {path}: {err}", file=sys.stderr)
    return 0 if follow else rc


def cancel(client: paramiko.SSHClient, jobs: list[str]) -> None:
    checked(client, ["scancel", *check_ids(jobs)])


def halt(client: paramiko.SSHClient, job: str) -> None:
    checked(client, ["scontrol", "requeuehold", *check_ids([job])])


def resume(client: paramiko.SSHClient, job: str) -> None:
    checked(client, ["scontrol", "release", *check_ids([job])])
