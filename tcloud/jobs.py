"""Jobs on the cluster, through the agent on the login node (`tacc-agent job ...`):
ps, status, logs, cancel, halt (checkpoint signal, then requeue on hold), resume.
The agent answers only for the caller's own jobs; Slurm enforces the same."""

from __future__ import annotations

import re
import sys

import paramiko

from tcloud.agent import call, stream
from tcloud.errors import TcloudError

JOB_ID = re.compile(r"\d+(_\d+)?")  # 1234, or 1234_5: trial 5 of sweep 1234
PS_FIELDS = ("job", "name", "state", "submitted", "nodes")


def check_ids(jobs: list[str]) -> list[str]:
    bad = [job for job in jobs if not JOB_ID.fullmatch(job)]
    if bad:
        raise TcloudError(
            f"not a job id: {', '.join(bad)} (expected numbers such as 1234, or 1234_5 for "
            "trial 5 of a sweep)"
        )
    return jobs


def ps(client: paramiko.SSHClient, userdir: str | None) -> list[dict]:
    return call(client, ["job", "ps"], userdir)


def status(client: paramiko.SSHClient, userdir: str | None, job: str) -> dict:
    return call(client, ["job", "status", *check_ids([job])], userdir)


def logs(
    client: paramiko.SSHClient,
    userdir: str | None,
    job: str,
    follow: bool,
    tail: int | None,
    node: int | None,
) -> int:
    """Every node's lines, `[host:rank]` first; with follow, until the job ends."""
    verb = ["job", "logs", *check_ids([job])]
    verb += ["--follow"] if follow else []
    verb += ["--tail", str(tail)] if tail is not None else []
    verb += ["--rank", str(node)] if node is not None else []
    return stream(client, verb, userdir, lambda line: print(line, flush=True))


def cancel(client: paramiko.SSHClient, userdir: str | None, jobs: list[str]) -> list[dict]:
    return call(client, ["job", "cancel", *check_ids(jobs)], userdir)


def halt(
    client: paramiko.SSHClient, userdir: str | None, job: str, grace: float | None = None
) -> dict:
    extra = [] if grace is None else ["--grace", f"{grace:g}"]
    return call(client, ["job", "halt", *check_ids([job]), *extra], userdir)


def resume(client: paramiko.SSHClient, userdir: str | None, job: str) -> dict:
    return call(client, ["job", "resume", *check_ids([job])], userdir)


def describe(info: dict, out=sys.stdout) -> None:
    """`tcloud status` for people: state, per-node states and, when it failed, why."""
    code = "" if info.get("exit_code") is None else f" (exit code {info['exit_code']})"
    print(f"job {info['job_id']} {info['name']}: {info['state']}{code}", file=out)
    if info.get("reason"):
        print(f"reason: {info['reason']}", file=out)
    print(f"workdir: {info['workdir']}", file=out)
    for entry in info.get("history", []):
        if entry.get("lost"):  # a run Slurm requeued because nodes went away
            print(f"requeued once: {entry['lost']}", file=out)
    for name, what in sorted((info.get("plugins") or {}).items()):
        print(f"plug-in {name}: {what}", file=out)
    for trial in info.get("trials", []):
        exit_code = "" if trial.get("exit_code") is None else f" exit {trial['exit_code']}"
        values = " ".join(f"{k}={v}" for k, v in trial.get("parameters", {}).items())
        print(f"  trial {trial['job_id']} {trial['state']}{exit_code}  {values}", file=out)
    for node in info.get("nodes", []):
        exit_code = "" if node.get("exit_code") is None else f" exit {node['exit_code']}"
        print(f"  [{node['host']}:{node['rank']}] {node['state']}{exit_code}", file=out)
    for where, lines in (info.get("last_lines") or {}).items():
        if lines:
            print(f"--- last lines of [{where}]", file=out)
            for line in lines:
                print(f"  {line}", file=out)
