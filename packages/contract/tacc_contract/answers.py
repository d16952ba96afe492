"""What each agent verb answers, declared once as a TypedDict: the SDK's result types
(`Cluster.status(...) -> JobStatus`) and, through `shape_of`, the check both sides run
on an answer (tacc_contract.shapes), so a changed answer is a ProtocolError naming the
verb and the key, never a KeyError later. NotRequired keys may be absent; keys an answer
has beyond its type are kept (a newer agent may say more). No `from __future__ import
annotations` here: TypedDict reads NotRequired from the annotations as objects."""

from typing import NotRequired, TypedDict


class HelloAnswer(TypedDict):
    protocol: int
    agent_version: str


class Whoami(TypedDict):
    user: str
    userdir: str


class Quota(TypedDict):
    user: str
    running_jobs: int
    pending_jobs: int
    gpus_in_use: int
    accounting: NotRequired[bool]
    message: NotRequired[str]
    associations: NotRequired[list[dict]]
    qos: NotRequired[list[dict]]
    fairshare: NotRequired[list[dict]]


class Environment(TypedDict):
    digest: str
    requirements: list[str]
    path: str
    lock: NotRequired[list[str]]
    python: NotRequired[str]
    built_by_job: NotRequired[str | int | None]
    platform: NotRequired[str]
    installer: NotRequired[str]
    index: NotRequired[str]


class ImageResolved(TypedDict):
    reference: str
    pinned: str
    digest: str


class ImageBuild(TypedDict):
    file: str
    base: str


class Image(TypedDict):
    digest: str
    reference: str
    path: str
    pulled_by_job: NotRequired[str | int | None]
    seconds: NotRequired[float]
    bytes: NotRequired[int]
    time: NotRequired[float]
    runtime: NotRequired[str]
    # An image built from a task's build file: {"file", "base"}, and the job that built it.
    build: NotRequired[ImageBuild]
    built_by_job: NotRequired[str | int | None]


class JobCheck(TypedDict):
    ok: bool
    partition: str


class JobSubmitted(TypedDict):
    job_id: str
    name: str
    workdir: str
    partition: str | None
    plugins: NotRequired[dict]


class PsRow(TypedDict):
    job: str
    name: str
    state: str
    submitted: str
    nodes: str
    kind: NotRequired[str]  # "job", or "session" (an interactive session: tcloud dev)


class NodeState(TypedDict):
    host: str
    state: str
    rank: NotRequired[int | None]
    exit_code: NotRequired[int | None]
    signal: NotRequired[int | str | None]


class Trial(TypedDict):
    job_id: str
    state: str
    trial: NotRequired[int]
    exit_code: NotRequired[int | None]
    parameters: NotRequired[dict]
    nodes: NotRequired[str]
    reason: NotRequired[str | None]
    # an adaptive sweep's trial (issue [24]): its metric's value at the last rung it reached
    metric: NotRequired[str]
    value: NotRequired[float | None]
    rung: NotRequired[int]
    rungs: NotRequired[int]
    stopped: NotRequired[bool]


class Event(TypedDict):
    state: str
    time: NotRequired[float]
    lost: NotRequired[str | dict | list]


class JobStatus(TypedDict):
    job_id: str
    name: str
    state: str
    workdir: str
    reason: NotRequired[str | None]
    exit_code: NotRequired[int | None]
    slurm_state: NotRequired[str | None]
    sweep: NotRequired[bool]
    best: NotRequired[str | None]  # a sweep's best trial so far (issue [24])
    ranking: NotRequired[list[str]]  # a sweep's trial ids, best first
    trials: NotRequired[list[Trial]]
    history: NotRequired[list[Event]]
    nodes: NotRequired[list[NodeState]]
    plugins: NotRequired[dict]
    warnings: NotRequired[list[str]]
    environment: NotRequired[dict | None]
    image: NotRequired[dict | None]
    code_digest: NotRequired[str | None]
    rerun_of: NotRequired[str | None]
    last_lines: NotRequired[dict]
    session: NotRequired[dict | None]


class DashboardOpened(TypedDict):
    """`dashboard open`: the one-time code that logs a browser in (GET /login?code=...),
    good once, for CODE_SECONDS."""

    code: str
    expires: float


class Cancelled(TypedDict):
    job_id: str
    state: str
    cancelled: bool
    trials: NotRequired[int]


class Halted(TypedDict):
    job_id: str
    state: str
    checkpoint_signal: bool
    exited_in_grace: NotRequired[bool]
    grace_seconds: NotRequired[float]


class Resumed(TypedDict):
    job_id: str
    state: str


class Rerun(JobSubmitted):
    rerun_of: str
    code_digest: str
    lock: list[str]


class StoreMissing(TypedDict):
    missing: list[str]
    partial: dict
    userdir: str
    uploads: NotRequired[dict]
    partition: NotRequired[str | None]


class StoreCommit(TypedDict):
    workdir: str | None
    bad: list[str]
    userdir: NotRequired[str]
    partition: NotRequired[str | None]
    job: NotRequired[JobSubmitted]


class StoreReceived(TypedDict):
    received: list[str]
    bad: list[str]
    bytes: int


class TargetNode(TypedDict):
    host: str
    rank: int
    address: str
    # The node's `enter` step, checked as `job attach` checks it: srun's words, then the
    # agent's `enter` words. The caller runs it on an exec channel with "--pty" after
    # "srun" for a terminal and "--" and the command's words at the end, every word
    # quoted; no `job attach` (a Python start on the login node) in between.
    step: NotRequired[list[str]]


class JobTarget(TypedDict):
    job_id: str
    slurm_job_id: str
    state: str
    nodes: list[TargetNode]
    session: NotRequired[dict | None]  # a session's settings (ports, idle_timeout, ...)


class GpuUsage(TypedDict):
    index: int
    utilization_ratio: NotRequired[float | None]
    memory_used_bytes: NotRequired[int | None]
    memory_total_bytes: NotRequired[int | None]


class NodeUsage(TypedDict):
    """A node that gave no figures (its task of the step did not run) has "error".
    cpu_seconds is the job's CPU time on the node so far (a counter): the client's rate
    between two answers is its CPU use; `sampled` is when the node read it (Unix time)."""

    host: str
    rank: int
    cpu_seconds: NotRequired[float | None]
    memory_bytes: NotRequired[int | None]
    cpus: NotRequired[int | None]
    sampled: NotRequired[float | None]
    gpus: NotRequired[list[GpuUsage]]
    error: NotRequired[str | None]


class JobTop(TypedDict):
    job_id: str
    state: str
    time: float
    nodes: list[NodeUsage]


class UsageRow(TypedDict):
    """One month (YYYY-MM, the cluster's local time) of one account and partition: the
    allocated CPU and GPU seconds of the caller's jobs in it (a job that crosses a month
    is split by its time in each), and the jobs counted there: each job once, in the
    first month of the window it ran in (summed over rows, they are the jobs)."""

    month: str
    account: str
    partition: str
    jobs: int
    cpu_seconds: float
    gpu_seconds: float
    running: NotRequired[int]  # of those jobs, the ones still running (counted up to now)


class Usage(TypedDict):
    """since/until: the window the rows cover, ISO local times (until is at most now)."""

    user: str
    since: str
    until: str
    rows: list[UsageRow]


class QueueTick(TypedDict):
    changes: list
