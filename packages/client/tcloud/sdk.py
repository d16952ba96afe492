"""tcloud's Python SDK; the `tcloud` CLI is a thin layer over it (parsing and printing).

    from tcloud import Cluster

    with Cluster() as cluster:                  # the current cluster of `tcloud config`
        job = cluster.submit("examples/hello")  # a task file, its directory, or a dict
        for line in job.logs(follow=True):      # every node's lines, until the job ends
            print(line)
        print(job.wait()["state"])
        job.download("hello-outputs")

A Cluster opens one verified SSH session on first use and reuses it for every call
until `close()` (or the end of the `with` block). Errors are tcloud.errors exceptions
(TcloudError, and TaskFileError for a task's problems; `.exit_code` is the CLI's);
nothing here prints or exits. `validate` and `dry_run` need no cluster.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass
from pathlib import Path

from tacc_contract import protocol
from tcloud import agent, config, files, jobs, tasks
from tcloud.errors import TcloudError, UsageError
from tcloud.link import Link
from tcloud.local import add_cluster, clusters, init, plugins, use_cluster
from tcloud.ssh import session
from tcloud.tasks import DryRun, Task, TaskLike, dry_run, validate
from tcloud.upload import upload

__all__ = [
    "Cluster",
    "DryRun",
    "Job",
    "JobTimeout",
    "Submission",
    "Task",
    "TaskLike",
    "add_cluster",
    "clusters",
    "dry_run",
    "init",
    "plugins",
    "use_cluster",
    "validate",
]

PathLike = str | os.PathLike[str]


class JobTimeout(TcloudError):
    """`Job.wait` ran out of time before the job ended (exit 4)."""


@dataclass(frozen=True)
class Submission:
    """What `Cluster.submit` did: the job, where it runs and what was sent."""

    job_id: str
    name: str
    partition: str
    digest: str
    workdir: str
    blobs_sent: int
    bytes_sent: int
    upload_seconds: float
    plugins: dict  # plug-in name -> what it did to the job
    outside_paths: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def job_id_of(job_id: object) -> str:
    """A job id as typed (1234, or 1234_5 for trial 5 of sweep 1234); UsageError if not."""
    text = str(job_id) if isinstance(job_id, int) and not isinstance(job_id, bool) else job_id
    if not isinstance(text, str):
        raise UsageError(f"not a job id: {job_id!r} (expected numbers such as 1234)")
    if problem := protocol.job_id_problem([text]):
        raise UsageError(problem)
    return text


def cluster_path(relative: str, what: str = "path") -> str:
    """A path in the user's cluster directory as typed (relative, no '..'); UsageError
    (exit 2) otherwise."""
    try:
        return files.check_path(relative, what)
    except TcloudError as exc:
        raise UsageError(str(exc)) from None


def whole_number(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UsageError(f"{what}: expected a whole number >= 0, got {value!r}")
    return value


def download_dest(dest: PathLike) -> Path:
    """Where a download goes: a directory, or a new one in a directory that exists."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest}: exists and is not a directory")
    parent = dest.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{dest}: no such directory {parent}")
    return dest


def open_direct(settings: config.Cluster):
    """The direct SSH connection (looked up at each call, so a test may stand in for it)."""
    return session(settings)


class Cluster:
    """One cluster of tcloud's config (`tcloud config add`; None: the current one, or
    $TCLOUD_CLUSTER). The config is read and the SSH session opened on first use."""

    def __init__(self, name: str | None = None, *, multiplex: bool = True) -> None:
        self._name = name
        self._multiplex = multiplex
        self._settings: config.Cluster | None = None
        self._sessions = ExitStack()
        self._client: Link | None = None
        self._home: str | None = None

    def __repr__(self) -> str:
        return f"Cluster({self._name!r})"

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def close(self) -> None:
        """End the SSH session (the next call opens a new one)."""
        self._client, self._home = None, None
        self._sessions.close()

    @property
    def settings(self) -> config.Cluster:
        if self._settings is None:
            self._settings = config.cluster(self._name)
        return self._settings

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def userdir(self) -> str | None:
        return self.settings.userdir

    @property
    def client(self) -> Link:
        """The way to the login node: agent sessions through the connection master
        (tcloud.mux; multiplex=False, TCLOUD_MULTIPLEX=0 or the cluster's `multiplex:
        false` turn it off), the verified SSH connection opened once when needed."""
        if self._client is None:
            link = Link(self.settings, open_direct, self._multiplex)
            self._sessions.callback(link.close)
            self._client = link
        return self._client

    # --- jobs ---------------------------------------------------------------------------

    def submit(
        self,
        task: TaskLike,
        *,
        sweep: bool = False,
        base_dir: PathLike | None = None,
        allow_outside: bool = False,
    ) -> Job:
        """Validate and compile the task here, have the cluster refuse it if it can never
        run, upload what it lacks and sbatch the job. A task with a sweep section needs
        sweep=True (one Slurm job array)."""
        checked, _ = tasks.prepare(
            task, sweep=sweep, base_dir=base_dir, allow_outside=allow_outside
        )
        settings = self.settings  # no cluster configured: said before hashing the files
        instruction = tasks.compiled(checked)
        result = upload(self.client, instruction, settings.userdir, submit=True)
        if not result.job:
            raise TcloudError("the cluster's tacc-agent did not submit the job (is it up to date?)")
        answer = result.job
        submission = Submission(
            job_id=str(answer["job_id"]),
            name=checked.name,
            partition=answer["partition"],
            digest=instruction.digest,
            workdir=result.workdir,
            blobs_sent=result.blobs_sent,
            bytes_sent=result.bytes_sent,
            upload_seconds=round(result.seconds, 3),
            plugins={**instruction.document["plugins"]["shaped"], **answer.get("plugins", {})},
            outside_paths=tasks.outside_paths(checked.spec),
        )
        return Job(self, submission.job_id, submission)

    def sweep(
        self,
        task: TaskLike,
        parameters: Mapping[str, list] | None = None,
        *,
        parallel: int | None = None,
        base_dir: PathLike | None = None,
        allow_outside: bool = False,
    ) -> Job:
        """Submit a sweep: one trial per combination of `parameters` (default: the task's
        own sweep section), each trial seeing its values as environment variables."""
        task, base_dir = tasks.with_sweep(task, parameters, parallel, base_dir)
        return self.submit(task, sweep=True, base_dir=base_dir, allow_outside=allow_outside)

    def job(self, job_id: str | int) -> Job:
        """A handle on one of your jobs (checked as a job id; the cluster is not asked)."""
        return Job(self, job_id)

    def jobs(self) -> list[dict]:
        """Your jobs, newest first (`tcloud ps`): job, name, state, submitted, nodes."""
        return jobs.ps(self.client, self.userdir)

    def cancel(self, *job_ids: str | int) -> list[dict]:
        """Cancel jobs: one {"job_id", "cancelled", "state"} each."""
        if not job_ids:
            raise UsageError("cancel: expected at least one job id")
        ids = [job_id_of(job_id) for job_id in job_ids]  # all checked before connecting
        return jobs.cancel(self.client, self.userdir, ids)

    def quota(self) -> dict:
        """Your running and pending jobs, GPUs in use, and with accounting your limits."""
        return jobs.quota(self.client, self.userdir)

    def environments(self) -> list[dict]:
        """Your cached environments on the cluster."""
        return jobs.environments(self.client, self.userdir)

    # --- files in your cluster directory -------------------------------------------------

    def home(self) -> str:
        """Your directory on the cluster (asked once per session)."""
        if self._home is None:
            self._home = jobs.whoami(self.client, self.userdir)["userdir"]
        return self._home

    def upload(self, local: PathLike, name: str | None = None) -> int:
        """Copy a local file or tree to files/<name> (default: its own name) in your
        cluster directory; how many files were sent."""
        local = Path(local)
        cluster_path(name if name is not None else local.name, "NAME")
        files.plan_upload(local, name)  # refused here, before connecting
        with closing(self.client.open_sftp()) as sftp:
            return files.upload(sftp, self.home(), local, name)

    def ls(self, path: str = "") -> list[dict]:
        """A directory of your cluster directory: name, size, mode of each entry."""
        cluster_path(path)
        with closing(self.client.open_sftp()) as sftp:
            return files.ls(sftp, self.home(), path)

    def cat(self, path: str) -> bytes:
        """A file of your cluster directory."""
        cluster_path(path)
        with closing(self.client.open_sftp()) as sftp:
            return files.cat(sftp, self.home(), path)


class Job:
    """One of your jobs (a sweep, or one trial of it as 1234_5) on a Cluster."""

    def __init__(self, cluster: Cluster, job_id: str, submission: Submission | None = None) -> None:
        self.cluster = cluster
        self.id = job_id_of(job_id)
        self.submission = submission  # set when this handle came from submit

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> dict:
        """The job's state, history, nodes, exit code, reason (`tcloud status --json`)."""
        return jobs.status(self.cluster.client, self.cluster.userdir, self.id)

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> dict:
        """Its status once it has ended (COMPLETED, FAILED or CANCELLED); JobTimeout
        after `timeout` seconds. A halted job is waited for until it is resumed."""
        if timeout is not None and timeout < 0:
            raise UsageError(f"timeout: expected seconds >= 0, got {timeout!r}")
        if not poll > 0:
            raise UsageError(f"poll: expected seconds > 0, got {poll!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while (info := self.status())["state"] not in protocol.FINAL_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {self.id} is still {info['state']} after {timeout:g} s")
            pause = poll if deadline is None else min(poll, deadline - time.monotonic())
            time.sleep(max(pause, 0))
        return info

    def trials(self) -> list[Job]:
        """A sweep's trials, each a Job of its own (1234_0, 1234_1, ...)."""
        return [Job(self.cluster, trial["job_id"]) for trial in self.status().get("trials", [])]

    def logs(
        self, follow: bool = False, tail: int | None = None, node: int | None = None
    ) -> Iterator[str]:
        """Every node's lines, `[host:rank]` first, as they come: with follow, until the
        job ends; tail, the last N lines only; node, one rank's lines only."""
        verb = protocol.job_logs(
            self.id, follow=follow, tail=whole_number(tail, "tail"), rank=whole_number(node, "node")
        )
        return agent.lines(self.cluster.client, verb, self.cluster.userdir)

    def cancel(self) -> dict:
        """Stop every process of the job: {"job_id", "cancelled", "state"}."""
        return self.cluster.cancel(self.id)[0]

    def halt(self, grace: float | None = None) -> dict:
        """Checkpoint signal to every rank, `grace` seconds (default: the cluster's), then
        requeue on hold; a queued job is just held."""
        number = isinstance(grace, int | float) and not isinstance(grace, bool)
        if grace is not None and not (number and 0 <= grace <= 3600):
            raise UsageError(f"grace: expected 0 to 3600 seconds, got {grace!r}")
        return jobs.halt(self.cluster.client, self.cluster.userdir, self.id, grace)

    def resume(self) -> dict:
        """Let a halted job run again."""
        return jobs.resume(self.cluster.client, self.cluster.userdir, self.id)

    def rerun(self) -> dict:
        """Submit it again with the same files and locked versions: the new job's answer
        (job_id, name, rerun_of, code_digest, lock, workdir); `cluster.job(answer["job_id"])`."""
        return jobs.rerun(self.cluster.client, self.cluster.userdir, self.id)

    def download(self, dest: PathLike | None = None) -> int:
        """Its outputs/ and logs/ (a whole sweep's: each trial's, into dest/trials/<i>/)
        into dest (default: ./<job id>); how many files were fetched."""
        target = download_dest(dest if dest is not None else Path(self.id))
        info = self.status()
        with closing(self.cluster.client.open_sftp()) as sftp:
            return files.download_job(sftp, info, target)
