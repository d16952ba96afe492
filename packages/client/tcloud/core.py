"""The SDK's Cluster and Job (tcloud.sdk) without file transfers: everything that goes
through the agent's session, which the connection master carries (tcloud.transport.mux), so a
command on this path never loads paramiko. The direct SSH connection (tcloud.transport.ssh) is
handed in (link.Direct) and opened only when a call needs it (`job logs`, an agent that
cannot receive a stream). tcloud.sdk adds SFTP (upload, ls, cat, download) and the
default SSH stack; the CLI uses this module for its other commands."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tacc_contract import answers, verbs
from tacc_contract.jobs import FINAL_STATES
from tcloud import config
from tcloud.errors import TcloudError, UsageError
from tcloud.jobs import interactive, portforward
from tcloud.jobs import usage as usage_report
from tcloud.jobs import verbs as jobs
from tcloud.transport import agent, openssh
from tcloud.transport.link import Direct, Link

if TYPE_CHECKING:
    from tcloud.compile.tasks import TaskLike

# Lazy start-up imports: the task compiler (the schema, every plug-in's fields, YAML's reader, the
# build file's parser) is imported by the calls that compile (submit, sweep, dev, images):
# about 50 ms of every start that `ps`, `exec`, `shell`, `forward` and `logs` no longer pay
# (tests/unit/client/test_client_startup.py keeps it so).

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
    image: str | None = None  # the task's image as submitted: pinned to its digest
    # An image built from the task's build file: {file, context, base (pinned), key}.
    image_build: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def job_id_of(job_id: object) -> str:
    """A job id as typed (1234, or 1234_5 for trial 5 of sweep 1234); UsageError if not."""
    text = str(job_id) if isinstance(job_id, int) and not isinstance(job_id, bool) else job_id
    if not isinstance(text, str):
        raise UsageError(f"not a job id: {job_id!r} (expected numbers such as 1234)")
    if problem := verbs.job_id_problem([text]):
        raise UsageError(problem)
    return text


def whole_number(value: int | None, what: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UsageError(f"{what}: expected a whole number >= 0, got {value!r}")
    return value


class Cluster:
    """One cluster of tcloud's config (`tcloud config add`; None: the current one, or
    $TCLOUD_CLUSTER). The config is read and the SSH session opened on first use."""

    job_class: type[Job]  # this module's Job (set below); tcloud.sdk's adds download

    def __init__(self, name: str | None = None, *, direct: Direct, multiplex: bool = True) -> None:
        self._name = name
        self._direct = direct
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
        (tcloud.transport.mux; multiplex=False, TCLOUD_MULTIPLEX=0 or the cluster's `multiplex:
        false` turn it off), the verified SSH connection opened once when needed."""
        if self._client is None:
            link = Link(self.settings, self._direct, self._multiplex)
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
        """Validate and compile the task here (its image, if it names one, pinned to the
        digest the cluster resolves it to: a reference the cluster cannot resolve is a
        TaskFileError, before any upload), have the cluster refuse it if it can never
        run, upload what it lacks and sbatch the job. A task with a sweep section needs
        sweep=True (one Slurm job array)."""
        from tcloud.compile import images, tasks  # lazy start-up import
        from tcloud.transfer.upload import upload  # lazy start-up import

        checked, _ = tasks.prepare(
            task, sweep=sweep, base_dir=base_dir, allow_outside=allow_outside
        )
        settings = self.settings  # no cluster configured: said before hashing the files
        resolve_image = images.resolver(self.client, settings.userdir, checked)
        instruction = tasks.compiled(checked, resolve_image)
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
            image=instruction.document["task"].get("image"),
            image_build=instruction.document["task"].get("image_build"),
        )
        return self.job_class(self, submission.job_id, submission)

    def sweep(
        self,
        task: TaskLike,
        parameters: Mapping[str, Any] | None = None,
        *,
        parallel: int | None = None,
        samples: int | None = None,
        sampler: str | None = None,
        seed: int | None = None,
        base_dir: PathLike | None = None,
        allow_outside: bool = False,
    ) -> Job:
        """Submit a sweep: one trial per combination of `parameters` (default: the task's
        own sweep section), each trial seeing its values as environment variables. With
        `samples`, that many trials drawn from the parameters' ranges ({"LR":
        {"loguniform": [1e-4, 1e-1]}}, ...) by `sampler` ("random" or "sobol") from `seed`
        (tacc_plugins/sampling.py)."""
        from tcloud.compile import tasks  # lazy start-up import

        drawn = {"samples": samples, "sampler": sampler, "seed": seed}
        task, base_dir = tasks.with_sweep(task, parameters, parallel, base_dir, drawn)
        return self.submit(task, sweep=True, base_dir=base_dir, allow_outside=allow_outside)

    def dev(
        self,
        task: TaskLike = ".",
        *,
        ports: Sequence[int] | None = None,
        idle_timeout: str | None = None,
        stop_on_disconnect: bool | None = None,
        base_dir: PathLike | None = None,
        allow_outside: bool = False,
    ) -> Job:
        """Submit the task as an interactive session (docs/interactive.md): its
        `session:` block (none: the defaults), with ports added to its ports and
        idle_timeout / stop_on_disconnect, when given, in place of its own."""
        from tacc_contract import schema  # lazy start-up import
        from tcloud.compile import tasks  # lazy start-up import

        overrides: dict = {}
        if idle_timeout is not None:
            expected = schema.idle_timeout(str(idle_timeout))
            if expected is not None:
                raise UsageError(f"idle_timeout {idle_timeout!r}: expected {expected}")
            overrides["idle_timeout"] = str(idle_timeout)
        if stop_on_disconnect is not None:
            overrides["stop_on_disconnect"] = bool(stop_on_disconnect)
        session_task, base_dir = tasks.with_session(task, overrides, base_dir)
        if ports:
            own = list(session_task["session"].get("ports") or [])
            extra = [port for port in ports if port not in own]
            session_task["session"]["ports"] = own + extra
        return self.submit(session_task, base_dir=base_dir, allow_outside=allow_outside)

    def job(self, job_id: str | int) -> Job:
        """A handle on one of your jobs (checked as a job id; the cluster is not asked)."""
        return self.job_class(self, job_id)

    def jobs(self, limit: int | None = None) -> list[answers.PsRow]:
        """Your jobs, newest first (`tcloud ps`): job, name, state, submitted, nodes; the
        newest `limit` (the agent's default: tacc_contract.jobs.PS_LIMIT)."""
        return jobs.ps(self.client, self.userdir, whole_number(limit, "limit"))

    def cancel(self, *job_ids: str | int) -> list[answers.Cancelled]:
        """Cancel jobs: one {"job_id", "cancelled", "state"} each."""
        if not job_ids:
            raise UsageError("cancel: expected at least one job id")
        ids = [job_id_of(job_id) for job_id in job_ids]  # all checked before connecting
        return jobs.cancel(self.client, self.userdir, ids)

    def quota(self) -> answers.Quota:
        """Your running and pending jobs, GPUs in use, and with accounting your limits."""
        return jobs.quota(self.client, self.userdir)

    def usage(
        self,
        since: str | None = None,
        until: str | None = None,
        by: str | Sequence[str] = usage_report.GROUPS,
    ) -> dict:
        """Your CPU- and GPU-hours from the cluster's accounting (`tcloud usage`), from
        the month or day `since` to `until`, both included (YYYY-MM or YYYY-MM-DD; the
        cluster's default: this month and the two before it), grouped by `by` (month,
        account, partition): {user, since, until, by, rows: [{<by>..., jobs, running,
        cpu_hours, gpu_hours, cpu_seconds, gpu_seconds}], total}."""
        fields, groups = usage_report.request(since, until, by)  # checked before connecting
        return usage_report.build(usage_report.ask(self.client, self.userdir, fields), groups)

    def environments(self) -> list[answers.Environment]:
        """Your cached environments on the cluster."""
        return jobs.environments(self.client, self.userdir)

    def images(self) -> list[answers.Image]:
        """Your container images cached on the cluster (`tcloud images`): digest,
        reference, path, and when known pulled_by_job, seconds, bytes, time, runtime."""
        from tcloud.compile import images  # lazy start-up import

        return images.cached(self.client, self.userdir)

    def home(self) -> str:
        """Your directory on the cluster (asked once per session)."""
        if self._home is None:
            self._home = jobs.whoami(self.client, self.userdir)["userdir"]
        return self._home


class Job:
    """One of your jobs (a sweep, or one trial of it as 1234_5) on a Cluster."""

    def __init__(self, cluster: Cluster, job_id: str, submission: Submission | None = None) -> None:
        self.cluster = cluster
        self.id = job_id_of(job_id)
        self.submission = submission  # set when this handle came from submit

    def __repr__(self) -> str:
        return f"Job({self.id!r})"

    def status(self) -> answers.JobStatus:
        """The job's state, history, nodes, exit code, reason (`tcloud status --json`)."""
        return jobs.status(self.cluster.client, self.cluster.userdir, self.id)

    def wait(self, timeout: float | None = None, poll: float = 2.0) -> answers.JobStatus:
        """Its status once it has ended (COMPLETED, FAILED or CANCELLED); JobTimeout
        after `timeout` seconds. A halted job is waited for until it is resumed."""
        if timeout is not None and timeout < 0:
            raise UsageError(f"timeout: expected seconds >= 0, got {timeout!r}")
        if not poll > 0:
            raise UsageError(f"poll: expected seconds > 0, got {poll!r}")
        deadline = None if timeout is None else time.monotonic() + timeout
        while (info := self.status())["state"] not in FINAL_STATES:
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeout(f"job {self.id} is still {info['state']} after {timeout:g} s")
            pause = poll if deadline is None else min(poll, deadline - time.monotonic())
            time.sleep(max(pause, 0))
        return info

    def trials(self) -> list[Job]:
        """A sweep's trials, each a Job of its own (1234_0, 1234_1, ...)."""
        trials = self.status().get("trials", [])
        return [self.cluster.job_class(self.cluster, trial["job_id"]) for trial in trials]

    def logs(
        self, follow: bool = False, tail: int | None = None, node: int | None = None
    ) -> Iterator[str]:
        """Every node's lines, `[host:rank]` first, as they come: with follow, until the
        job ends; tail, the last N lines only; node, one rank's lines only."""
        tail, node = whole_number(tail, "tail"), whole_number(node, "node")
        client, userdir = self.cluster.client, self.cluster.userdir
        return agent.lines(
            client, verbs.JOB_LOGS, userdir, job=self.id, follow=follow, tail=tail, rank=node
        )

    def cancel(self) -> answers.Cancelled:
        """Stop every process of the job: {"job_id", "cancelled", "state"}."""
        return self.cluster.cancel(self.id)[0]

    def halt(self, grace: float | None = None) -> answers.Halted:
        """Checkpoint signal to every rank, `grace` seconds (default: the cluster's), then
        requeue on hold; a queued job is just held."""
        number = isinstance(grace, int | float) and not isinstance(grace, bool)
        if grace is not None and not (number and 0 <= grace <= 3600):
            raise UsageError(f"grace: expected 0 to 3600 seconds, got {grace!r}")
        return jobs.halt(self.cluster.client, self.cluster.userdir, self.id, grace)

    def resume(self) -> answers.Resumed:
        """Let a halted job run again."""
        return jobs.resume(self.cluster.client, self.cluster.userdir, self.id)

    def rerun(self) -> answers.Rerun:
        """Submit it again with the same files and locked versions: the new job's answer
        (job_id, name, rerun_of, code_digest, lock, workdir); `cluster.job(answer["job_id"])`."""
        return jobs.rerun(self.cluster.client, self.cluster.userdir, self.id)

    # --- into the running job (docs/interactive.md) ------------------------------------

    def target(self, rank: int | None = None) -> answers.JobTarget:
        """Where it runs (JOB_TARGET): its nodes by rank and their addresses; the agent
        refuses (exit 4) a job that is not yours or not running."""
        client = self.cluster.client
        return interactive.target(client, self.cluster.userdir, self.id, whole_number(rank, "rank"))

    def shell(self, rank: int = 0) -> int:
        """An interactive shell on rank's node inside the job (a PTY when stdin is a
        terminal): its exit status."""
        rank = whole_number(rank, "rank") or 0
        return interactive.shell(self.cluster.client, self.cluster.userdir, self.id, rank)

    def exec(self, command: Sequence[str], ranks: Sequence[int] | str | None = None) -> list[dict]:
        """The command on rank 0's node (None), on these ranks, or on "all": per node
        {host, rank, exit_code, stdout, stderr}."""
        if isinstance(command, str):
            raise UsageError(f"exec: expected a command as a list of words, got {command!r}")
        if ranks == "all":
            chosen = None
        elif ranks is None:
            chosen = [0]
        elif isinstance(ranks, str):
            raise UsageError(f"exec: ranks: expected a list of ranks or 'all', got {ranks!r}")
        else:
            chosen = [whole_number(rank, "rank") for rank in ranks]
        results = interactive.execute(
            self.cluster.client,
            self.cluster.userdir,
            self.id,
            list(command),
            chosen,
            interactive.capture,
        )
        return [result.as_dict() for result in results]

    @contextmanager
    def forward(
        self, ports: Sequence[int | str] | Mapping[int | str, int] | int | str, rank: int = 0
    ) -> Iterator[dict[int | str, int]]:
        """Local ports on 127.0.0.1 forwarded to the job's program on its node of `rank`
        (its 127.0.0.1:PORT, or a Unix socket there) while the block runs: {remote: local}.
        ports: 8888, [8888, "6006:16006", "/abs/jupyter.sock"] or {8888: 9999}. Warns
        when a port listens on every address of the node (tcloud.jobs.portforward)."""
        pairs = portforward.pairs_of(ports)
        rank = whole_number(rank, "rank") or 0
        interactive.node_of(self.target(), rank)
        with openssh.master_for(self.cluster.settings) as master:
            client, userdir = self.cluster.client, self.cluster.userdir
            way = portforward.JobWay(client, userdir, self.id, rank, warn, master)
            for pair in pairs:
                way.check(pair)
            master(wait=openssh.SETTLE_SECONDS)  # its first connections through it too
            with portforward.Forwarder(pairs, way.open, warn=warn) as forwarder:
                yield forwarder.mapping

    def usage(self) -> answers.JobTop:
        """Its live usage per node now (JOB_TOP): cpu_seconds, memory, GPUs."""
        return agent.call(self.cluster.client, verbs.JOB_TOP, self.cluster.userdir, job=self.id)


def warn(message: str) -> None:
    print(f"tcloud: {message}", file=sys.stderr, flush=True)


Cluster.job_class = Job
