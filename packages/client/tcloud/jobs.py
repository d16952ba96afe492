"""Jobs on the cluster, through the agent on the login node (`tacc-agent job ...`):
ps, status, logs, cancel, halt (checkpoint signal, then requeue on hold), resume,
rerun (the same files and locked environment again).
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


def rerun(client: paramiko.SSHClient, userdir: str | None, job: str) -> dict:
    return call(client, ["job", "rerun", *check_ids([job])], userdir)


def rerun_text(answer: dict) -> str:
    lock = answer.get("lock") or []
    pinned = f"{len(lock)} locked version(s)" if lock else "no environment"
    return (
        f"submitted job {answer['job_id']} ({answer['name']}), a rerun of job "
        f"{answer['rerun_of']}: code {answer['code_digest'][:12]}, {pinned}; "
        f"workdir {answer['workdir']}"
    )


def describe_environment(environment: dict, out) -> None:
    print(
        f"environment {environment['digest']}: python {environment.get('python', '?')} "
        f"({environment.get('platform', '?')}), {environment.get('installer', '?')}, "
        f"index {environment.get('index', '?')}; locked:",
        file=out,
    )
    for line in environment.get("lock", []):
        print(f"  {line}", file=out)


def describe(info: dict, out=sys.stdout) -> None:
    """`tcloud status` for people: state, per-node states and, when it failed, why."""
    code = "" if info.get("exit_code") is None else f" (exit code {info['exit_code']})"
    print(f"job {info['job_id']} {info['name']}: {info['state']}{code}", file=out)
    if info.get("reason"):
        print(f"reason: {info['reason']}", file=out)
    print(f"workdir: {info['workdir']}", file=out)
    if info.get("code_digest"):
        again = f" (a rerun of job {info['rerun_of']})" if info.get("rerun_of") else ""
        print(f"code: {info['code_digest'][:12]}{again}", file=out)
    if info.get("environment"):
        describe_environment(info["environment"], out)
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
