"""Jobs on the cluster, through the agent on the login node (`tacc-agent job ...`):
ps, status, logs, cancel, halt (checkpoint signal, then requeue on hold), resume,
rerun (the same files and locked environment again); and the caller's own facts: whoami,
quota, cached environments. Every verb is declared in tacc_contract.verbs, which builds
its words and checks its answer. The agent answers only for the caller's own
jobs; Slurm enforces the same."""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING

from tacc_contract import answers, verbs
from tacc_contract.images import parse_reference
from tcloud.errors import TcloudError
from tcloud.transport.agent import call, stream

if TYPE_CHECKING:
    import paramiko

PS_FIELDS = ("job", "name", "state", "submitted", "nodes")  # the columns of `tcloud ps`


def check_ids(jobs: list[str]) -> list[str]:
    problem = verbs.job_id_problem(jobs)
    if problem:
        raise TcloudError(problem)
    return jobs


def ps(
    client: paramiko.SSHClient, userdir: str | None, limit: int | None = None
) -> list[answers.PsRow]:
    return call(client, verbs.JOB_PS, userdir, limit=limit)


def status(client: paramiko.SSHClient, userdir: str | None, job: str) -> answers.JobStatus:
    return call(client, verbs.JOB_STATUS, userdir, job=check_ids([job])[0])


def logs(
    client: paramiko.SSHClient,
    userdir: str | None,
    job: str,
    follow: bool,
    tail: int | None,
    node: int | None,
) -> int:
    """Every node's lines, `[host:rank]` first; with follow, until the job ends."""
    job = check_ids([job])[0]
    write = functools.partial(print, flush=True)
    return stream(
        client, verbs.JOB_LOGS, userdir, write, job=job, follow=follow, tail=tail, rank=node
    )


def cancel(
    client: paramiko.SSHClient, userdir: str | None, jobs: list[str]
) -> list[answers.Cancelled]:
    return call(client, verbs.JOB_CANCEL, userdir, jobs=check_ids(jobs))


def halt(
    client: paramiko.SSHClient, userdir: str | None, job: str, grace: float | None = None
) -> answers.Halted:
    return call(client, verbs.JOB_HALT, userdir, job=check_ids([job])[0], grace=grace)


def resume(client: paramiko.SSHClient, userdir: str | None, job: str) -> answers.Resumed:
    return call(client, verbs.JOB_RESUME, userdir, job=check_ids([job])[0])


def rerun(client: paramiko.SSHClient, userdir: str | None, job: str) -> answers.Rerun:
    return call(client, verbs.JOB_RERUN, userdir, job=check_ids([job])[0])


def whoami(client: paramiko.SSHClient, userdir: str | None) -> answers.Whoami:
    """The caller's user and cluster directory: {"user", "userdir"}."""
    return call(client, verbs.WHOAMI, userdir)


def quota(client: paramiko.SSHClient, userdir: str | None) -> answers.Quota:
    """The caller's running and pending jobs, limits and fair share."""
    return call(client, verbs.QUOTA, userdir)


def environments(client: paramiko.SSHClient, userdir: str | None) -> list[answers.Environment]:
    """The caller's cached environments on the cluster."""
    return call(client, verbs.ENV, userdir)


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


def image_text(image: dict) -> str:
    """A job's image as `tcloud status` shows it: the pinned reference it ran in (tag
    and digest) or the build file it was built from, and where the cluster keeps its
    unpacked copy."""
    cached = f" (cached in {image['path']})" if image.get("path") else ""
    build = image.get("build")
    if isinstance(build, dict):
        key = str(image.get("digest", "")).removeprefix("sha256:")[:12]
        return (
            f"image: built from {build.get('file', '?')} (key {key or '?'}) FROM "
            f"{build.get('base', '?')}{cached}"
        )
    reference = str(image.get("reference", ""))
    ref = parse_reference(reference)
    digest = image.get("digest")
    if ref is not None and not ref.pinned and isinstance(digest, str):
        try:
            reference = str(ref.with_digest(digest))
        except ValueError:  # not a sha256 digest: shown as the agent said
            reference = f"{reference} ({digest})"
    return f"image: {reference or digest or '?'}{cached}"


def best_first(info: dict) -> list[dict]:
    """A sweep's trials in the cluster's `ranking` (best first), the rest after by index."""
    trials = [t for t in info.get("trials") or [] if isinstance(t, dict)]
    ranking = info.get("ranking") if isinstance(info.get("ranking"), list) else []
    place = {str(job_id): number for number, job_id in enumerate(ranking)}
    return sorted(trials, key=lambda t: place.get(str(t.get("job_id")), len(place)))


def trial_progress(trial: dict) -> str:
    """An adaptive sweep's trial: its metric at the last rung it reached ("" for none)."""
    value = trial.get("value")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return ""
    if not isinstance(trial.get("rung"), int):
        return ""
    stopped = ", stopped" if trial.get("stopped") else ""
    return (
        f"  {trial.get('metric', 'metric')} {value:.4g}"
        f" at rung {trial['rung']}/{trial.get('rungs', '?')}{stopped}"
    )


def describe(info: dict, out=None) -> None:
    """`tcloud status` for people: state, per-node states and, when it failed, why (to
    `out`, default: sys.stdout as it is at the call, so a redirection applies)."""
    out = sys.stdout if out is None else out
    code = "" if info.get("exit_code") is None else f" (exit code {info['exit_code']})"
    print(f"job {info['job_id']} {info['name']}: {info['state']}{code}", file=out)
    if info.get("reason"):
        print(f"reason: {info['reason']}", file=out)
    for warning in info.get("warnings") or []:
        print(f"WARNING: {warning}", file=out)
    print(f"workdir: {info['workdir']}", file=out)
    if info.get("code_digest"):
        again = f" (a rerun of job {info['rerun_of']})" if info.get("rerun_of") else ""
        print(f"code: {info['code_digest'][:12]}{again}", file=out)
    if info.get("image"):
        print(image_text(info["image"]), file=out)
    if info.get("environment"):
        describe_environment(info["environment"], out)
    for entry in info.get("history", []):
        if entry.get("lost"):  # a run Slurm requeued because nodes went away
            print(f"requeued once: {entry['lost']}", file=out)
    for name, what in sorted((info.get("plugins") or {}).items()):
        print(f"plug-in {name}: {what}", file=out)
    if info.get("best"):
        print(f"best trial: {info['best']} (trials best first)", file=out)
    for trial in best_first(info):
        exit_code = "" if trial.get("exit_code") is None else f" exit {trial['exit_code']}"
        values = " ".join(f"{k}={v}" for k, v in trial.get("parameters", {}).items())
        reached = trial_progress(trial)
        print(f"  trial {trial['job_id']} {trial['state']}{exit_code}{reached}  {values}", file=out)
    for node in info.get("nodes", []):
        exit_code = "" if node.get("exit_code") is None else f" exit {node['exit_code']}"
        print(f"  [{node['host']}:{node['rank']}] {node['state']}{exit_code}", file=out)
    for where, lines in (info.get("last_lines") or {}).items():
        if lines:
            print(f"--- last lines of [{where}]", file=out)
            for line in lines:
                print(f"  {line}", file=out)
