"""The plug-in interface: one class per technique, with a hook for each layer it shapes.

A plug-in overrides only the hooks of its layers (docs/plugins.md):

- schema    `fields` (new task fields, or a replacement of a built-in one, by dotted
            path) and `check(task, problem)` for cross-field rules and defaults;
- compile   `compile(document)`: a pass over the instruction document; returns what
            it changed (or None);
- schedule  `schedule(submission)`: the sbatch options, partition, time, priority;
            `tick(queue)`: react to the queue (run by the controller's agent daemon);
- execute   `execute(launch)`: the launcher, transport and environment of one rank;
            `finish(outcome)`: a line for the job log once the run is over.

Every hook that changed something says so with `note(...)`; the notes go into the
job's record (status/submit.json, `tcloud status --json`), so a job shows which
plug-ins shaped it and how.

Everything a hook needs from the cluster comes to it on its context object, filled in
by the agent: the nodes and their features, the partition's load and the caller's
earlier jobs (Submission), the queue (Queue), this node's facts, its features and an
agreement across the job's ranks (Launch). A plug-in imports this package (and the
standard library), never the agent: one written outside the project needs nothing else.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tacc_contract.fields import Field

LAYERS = ("schema", "compile", "schedule", "execute")
Problem = Callable[[str, str], None]  # (dotted field, what is expected)


class Plugin:
    """Base class: every hook does nothing. Subclasses set `name` and `layers`."""

    name: ClassVar[str] = ""
    layers: ClassVar[tuple[str, ...]] = ()
    summary: ClassVar[str] = ""
    # Where its hooks run within a layer: lower first; equal ones in the order they
    # were found (entry points, then modules named in a selection). The built-ins use
    # 10..80; a plug-in that sets nothing runs after them.
    order: ClassVar[int] = 100
    # On unless a configuration turns it off (TACC_PLUGINS, tcloud config, agent config).
    default_on: ClassVar[bool] = True
    # Cluster policy (set by ops in the agent config): a task cannot turn it off.
    policy: ClassVar[bool] = False
    # schema: dotted path ("sweep", "resources.nodes") -> Field; replaces a built-in field.
    fields: ClassVar[dict[str, Field]] = {}

    def check(self, task: dict, problem: Problem) -> None:
        """schema: validate across fields, fill defaults (task is the validated mapping)."""

    def compile(self, document: dict) -> str | None:
        """compile: change the instruction document ({"task": ..., "manifest": ...});
        return what changed, for the instruction's record."""
        return None

    def schedule(self, submission: Submission) -> None:
        """schedule: change the sbatch request before it is submitted."""

    def tick(self, queue: Queue) -> None:
        """schedule: react to the queue (pending and running jobs); act through Slurm."""

    def execute(self, launch: Launch) -> None:
        """execute: choose the launcher, transport and environment of one rank."""

    def finish(self, outcome: Outcome) -> str | None:
        """execute: after the run (batch step), a line for the job log, or None."""
        return None


# Slurm node state words of a node that runs no new job.
# (A POWERED_DOWN node is in service: Slurm powers it up for a job.)
OUT_OF_SERVICE = frozenset(
    {
        "DOWN",
        "DRAIN",
        "DRAINED",
        "DRAINING",
        "FAIL",
        "FAILING",
        "MAINTENANCE",
        "MAINT",
        "NOT_RESPONDING",
        "POWER_DOWN",
        "POWERING_DOWN",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "RESERVED",
        "FUTURE",
        "UNKNOWN",
        "INVALID_REG",
        "INVALID",
        "ERROR",
    }
)
# Slurm's reasons of a pending job that no node could end (held, as a halted job is, or
# held as it was requeued; a dependency; a start time): such a job does not wait for nodes.
NOT_WAITING_FOR_NODES = ("JobHeld", "job requeued in held state", "Dependency", "BeginTime")
# Slurm's reasons of a pending job that waits for nodes and nothing else (the next to
# start, Resources; those behind it, Priority).
WAITS_FOR_NODES = ("Resources", "Priority")
# A node feature naming a GPU type (a100, h100, l40s), as the slurm role derives it.
FEATURE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
JOB_NUMBER = re.compile(r"(\d+)(?:_(\d+))?")
# A begin time at most this many seconds after a job's submission is a placement delay
# (a plug-in's, as allox's `submit_delay_seconds`: time for a tick to place the job
# before Slurm starts it on the first free node): only such a job may be started early
# (`Queue.start_now`). An owner's own begin time as near as that may be cut short too;
# the owner may move it themselves (scontrol update), no other user's job is touched.
PLACEMENT_DELAY_LIMIT = 60


def either_or(features: str) -> list[str]:
    """The features of a plain either-or constraint ("a100|h100" -> [a100, h100], what
    gpu_types writes); [] for anything else (counts, brackets, "&", ",", none)."""
    terms = features.split("|")
    return terms if features and all(FEATURE.fullmatch(t) for t in terms) else []


@dataclass(frozen=True)
class Node:
    """A node as `scontrol show node` describes it: what a scheduling hook may count on."""

    name: str
    cpus: int
    memory_mb: int
    gpus: int
    partitions: tuple[str, ...]
    shards: int = 0  # GPU shards (gres/shard), for fractions of a GPU
    mps: int = 0  # CUDA MPS shares (gres/mps, 100 per GPU by default), for fractions too
    features: tuple[str, ...] = ()  # Slurm node features (GPU types: a100, h100, ...)
    # Slurm's state words (IDLE, MIXED, ALLOCATED, DRAIN, DOWN, ...); "" when not read.
    state: str = ""
    # Its GPUs by type, from its Gres (gpu:h100:4 -> (("h100", 4),)); untyped ones not.
    gpu_kinds: tuple[tuple[str, int], ...] = ()

    def in_service(self) -> bool:
        return not set(self.state.split("+")) & OUT_OF_SERVICE

    def idle(self) -> bool:
        """Idle and awake: a powered-down node is no idle capacity to grow into."""
        words = self.state.split("+")
        return (
            self.in_service()
            and words[0] == "IDLE"
            and not {"POWERED_DOWN", "POWERING_UP"} & set(words)
        )


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: tuple[str, ...]
    # Its JobDefaults: what a GPU job that names no CPUs or memory gets per GPU (0: none).
    cpus_per_gpu: int = 0
    mem_per_gpu_mb: int = 0


@dataclass(frozen=True)
class PartitionLoad:
    """A partition's state right now."""

    idle_nodes: int
    waiting_jobs: int  # pending jobs waiting for nodes (not held, not on a dependency)


@dataclass(frozen=True)
class PastJob:
    """One of the caller's earlier jobs, as its record in the job directory says."""

    name: str  # the job directory's name
    submit: dict  # status/submit.json: digest, entrypoint, options, plugin_data, ...
    events: list[dict]  # its state changes ({"state", "time", "reason", ...}) in order


def unknown_load(partition: str) -> PartitionLoad:
    """Without the agent (a test): nothing idle, nothing waiting."""
    return PartitionLoad(0, 0)


def no_history(count: int) -> list[PastJob]:
    """Without the agent, or for a caller it does not know (a check): no earlier job."""
    return []


@dataclass
class Submission:
    """One job on its way to sbatch. `options` are sbatch long options without the
    leading dashes (value None: a flag); `partition` the one chosen so far.

    What the cluster looks like: `partitions`, `nodes` (with their GPUs, shards and
    features), `partition_load(name)` (asks Slurm, so call it only when needed) and
    `history(count)`: the caller's `count` most recent earlier jobs, newest first."""

    task: Any  # tacc_contract.schema.TaskSpec
    options: dict[str, str | None]
    partition: str
    partitions: list[Partition] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    user_dir: Path | None = None
    digest: str = ""
    config: Any = None  # the agent's configuration (tacc_agent.config.AgentConfig)
    notes: dict[str, str] = field(default_factory=dict)  # plug-in name -> what it did
    # What plug-ins keep in status/submit.json for later layers ("plugin_data").
    data: dict[str, object] = field(default_factory=dict)
    partition_load: Callable[[str], PartitionLoad] = unknown_load
    history: Callable[[int], list[PastJob]] = no_history

    def note(self, plugin: str, text: str) -> None:
        self.notes[plugin] = text


@dataclass
class QueuedJob:
    job_id: str
    user: str
    state: str  # PENDING / RUNNING
    nice: int
    gpus: float  # GPUs the job holds or asks for, all nodes together
    elapsed_seconds: int  # since its last start (a requeued job starts again at 0)
    nodes: int = 1
    partition: str = ""
    reason: str = ""  # why a pending job waits (Slurm's: Resources, Priority, ...)
    # What its owner's task allowed the cluster to do to it, as the agent read it from
    # the job's own record: "preemptible" (checkpoint and requeue it), "resize".
    opted_in: frozenset[str] = frozenset()
    name: str = ""  # the job's name (sbatch --job-name)
    features: str = ""  # its constraint (sbatch --constraint: "a100|h100"), "" for none
    node_names: tuple[str, ...] = ()  # the nodes a running job holds
    time_limit_seconds: int = 0  # 0: none known (UNLIMITED, or not read)
    # The node range its owner's task gave (nodes: 1-4), as the agent read it from the
    # job's own record with its opt-ins; None for a fixed size or when not read.
    node_range: tuple[int, int] | None = None
    details: bool = False  # whether name, features, node_names and the limit were read
    # Epoch seconds, read with the details (0: not known): when it was submitted, and
    # Slurm's start time (for a job pending on BeginTime, its begin time).
    submit_time: float = 0.0
    start_time: float = 0.0


def delayed_for_placement(job: QueuedJob) -> bool:
    """A pending job that waits for a begin time at most PLACEMENT_DELAY_LIMIT seconds
    after its submission, as the tick read it: a placement delay, which `Queue.start_now`
    may cut short. (A requeued job waits for a begin time too, Slurm's requeue delay
    that lets its old run's credential expire: the agent reads the job again before it
    starts one, and never starts a requeued job early.)"""
    return (
        job.state == "PENDING"
        and job.reason == "BeginTime"
        and job.details
        and job.submit_time > 0
        and 0 < job.start_time - job.submit_time <= PLACEMENT_DELAY_LIMIT
    )


def arrival(job: QueuedJob) -> tuple[int, int]:
    """Slurm's job ids grow with submission: the order jobs came in (array tasks by index;
    an id of another form last)."""
    match = JOB_NUMBER.fullmatch(job.job_id)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else (1 << 62, 0)


def settings_of(config: Any, plugin: str) -> dict:
    """The agent config's `plugin_settings.<plugin>` mapping ({} when it has none)."""
    found = (getattr(config, "plugin_settings", None) or {}).get(plugin)
    return dict(found) if isinstance(found, dict) else {}


def no_requeue(job_id: str, reason: str) -> bool:
    return False


def no_features(job_id: str, features: str) -> bool:
    return False


def no_resize(job_id: str, nodes: int, reason: str) -> bool:
    return False


def no_nodes() -> list[Node]:
    return []


def no_start(job_id: str) -> bool:
    return False


@dataclass
class Queue:
    """The queue as a scheduling plug-in's `tick` sees it. It acts through Slurm with
    `set_nice(job, n)` (sent when the plug-in's tick returns, the jobs of one value in one
    `scontrol update`: a job that ended meanwhile is a note, never an exception), and
    `requeue(job, reason)`: the job gets its checkpoint signal and
    goes back to the queue, as `tcloud halt` then `tcloud resume` would do it; only a job
    whose task opted in ("preemptible" in `opted_in`) is requeued, and the answer says
    whether it was. `reason` is the plug-in's fixed words, shown in the job's events.

    `set_features(job, features)` narrows a pending job's constraint to some of the
    features its owner asked for ("a100|h100" -> "h100") or gives it back whole; the
    agent refuses anything wider, and the answer says whether Slurm took it.
    `cluster_nodes()` asks Slurm for the nodes (with features and state): call it only
    when needed.

    `resize(job, nodes, reason)` is `requeue` at a new size: the job's checkpoint signal,
    back to the queue asking for `nodes`; only for a job whose task opted in ("resize")
    and a size within the node range the agent recorded for it at submit and within
    Slurm's QOS, association and partition limits (the agent refuses anything else).

    `start_now(job)` lets a job that waits out a placement delay (`delayed_for_placement`:
    a begin time at most PLACEMENT_DELAY_LIMIT s after its submission) start at once, once
    a plug-in has placed it; the agent refuses any other job."""

    jobs: list[QueuedJob]
    set_nice: Callable[[str, int], None]
    now: float = 0.0
    state_dir: Path | None = None  # where a plug-in may keep what it learned
    config: Any = None
    notes: list[str] = field(default_factory=list)
    requeue: Callable[[str, str], bool] = no_requeue
    set_features: Callable[[str, str], bool] = no_features
    cluster_nodes: Callable[[], list[Node]] = no_nodes
    resize: Callable[[str, int, str], bool] = no_resize
    start_now: Callable[[str], bool] = no_start
    # Jobs that left the queue and Slurm still remembers (a few minutes): job -> (its
    # final state: COMPLETED, FAILED, CANCELLED, TIMEOUT, ...; the seconds it ran).
    ended: dict[str, tuple[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class Transport:
    """How the ranks talk to each other: a name for the record ("rdma", "tcp"), the
    reason for the job log, and the variables it sets (NCCL_IB_DISABLE, ...). `warning`:
    what the job's owner must see beside it (`tcloud status` and `tcloud logs`: a node
    the inventory gives RDMA runs without it); `error`: why the job cannot run as asked
    (it fails with this, nothing starts)."""

    name: str
    reason: str
    env: dict[str, str]
    warning: str = ""
    error: str = ""


# decide(every rank's facts) -> the answer all ranks use (JSON-able)
Decide = Callable[[list[dict]], dict]
# agree(topic, decide) -> the answer, or None when rank 0's never came
Agree = Callable[[str, Decide], dict | None]


@dataclass
class Launch:
    """One rank about to run: plug-ins set `launcher` (how each run line becomes argv),
    `transport` and `env`.

    What the node knows: `facts`, this rank's facts as it wrote them for the others
    ({"host", "ip", "rdma": {"active_ports", "source"}}); `node_features()`, this node's
    Slurm features (asks Slurm: call it only when needed); `agree(topic, decide)`, one
    answer for the whole job: rank 0 waits for every rank's facts, calls `decide` with
    them and publishes what it returns; every other rank waits for that answer (None
    when it never came). Without the agent (a test), `agree` decides from `facts` alone."""

    task: Any
    rank: int  # this wrapper's rank: the process's global rank (torchrun: its node's first)
    nodes: list[str]
    ips: list[str]
    job_id: str
    env: dict[str, str]
    job_dir: Path = Path(".")
    node_rank: int = 0  # index of this node in `nodes`
    local_rank: int = 0  # index of this wrapper on its node
    wrappers: int = 1  # how many wrappers the job runs (one per rank; torchrun: per node)
    config: Any = None  # the agent's configuration (tacc_agent.config.AgentConfig)
    command: Callable[[str], list[str]] | None = None
    transport: Transport | None = None
    notes: dict[str, str] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    node_features: Callable[[], list[str]] = list
    agree: Agree | None = None

    def __post_init__(self) -> None:
        if self.agree is None:
            self.agree = self.alone

    def alone(self, topic: str, decide: Decide) -> dict | None:
        """An agreement of one: this rank's own facts decide."""
        return decide([self.facts])

    def note(self, plugin: str, text: str) -> None:
        self.notes[plugin] = text


@dataclass
class Outcome:
    """A finished run as the batch step saw it."""

    task: Any
    job_dir: Path
    exit_code: int
    seconds: float
    submit: dict  # status/submit.json: options and the notes of the scheduling plug-ins
