"""Cluster-wide Slurm figures for /metrics, exported by the controller's daemon
(agent setting cluster_metrics): whether slurmctld and slurmdbd answer, jobs per partition
and state, GPUs allocated and in all per partition, nodes per Slurm state, and each drained
node with its reason.

Where they come from (Slurm 22.05, each command an argv bounded by slurm_timeout_seconds):
- slurmctld: `scontrol ping` ("Slurmctld(primary) at n1 is UP"); a controller that does not
  answer within the bound is down (0), an answer with no controller line is an error.
- slurmdbd: only where `scontrol show config` says AccountingStorageType =
  accounting_storage/slurmdbd (no sample without accounting: nothing to be down). Then
  `sacctmgr -n -P show cluster format=cluster`: sacctmgr opens its own connection to
  slurmdbd (slurmctld's cached link is not asked), exits 0 when slurmdbd answered and
  non-zero when it could not reach it ("Problem talking to the database"). The accounting
  type is kept from the last answer, so a slurmctld outage does not hide slurmdbd's state.
- nodes and GPUs: `sinfo --json` (openapi v0.0.38 in 22.05): names, reasons and partition
  lists are JSON strings, so no text an admin or a user wrote (a reason may hold spaces,
  '=', '|', quotes or newlines) can shift a field. GPUs from each node's gres / gres_used
  ("gpu:a100:4(S:0-1)", "gpu:a100:2(IDX:0-1)"); a node counts in each of its partitions.
- jobs: `squeue -h -a -r -t PENDING,RUNNING -o "%P %T"` (one line per job, array tasks
  each; partition names hold no spaces); a pending job that names several partitions
  ("a,b") counts in each.

Each command runs through the agent's one runner (slurm.run); each answer is read by the
slurm package's reader of its shape (slurm.controller, slurm.nodes.parse_sinfo_json,
slurm.gres, slurm.queue.parse_partition_states).

Read at scrape time, at most once every CACHE_SECONDS (a cache behind a lock), the four
reads side by side in worker threads, in the HTTP thread: the health check loop never
waits for Slurm. A scrape waits at most SCRAPE_WAIT_SECONDS for reads still running and
takes the ones done; a read that failed or has no fresh answer gives
slurm_query_error{query}=1 and none of its figures (never stale or zero figures), and each
failed read adds one to slurm_query_errors_total{query}.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import TypeVar

from prometheus_client.metrics_core import Metric

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.health.checks.base import Sample
from tacc_agent.health.metrics import families
from tacc_agent.health.registry import Family

CLUSTER_FAMILIES = (
    Family(
        "slurm_up",
        "gauge",
        "1 when the Slurm daemon answers (scontrol ping; sacctmgr)",
        ("daemon",),
    ),
    Family(
        "slurm_jobs",
        "gauge",
        "Slurm jobs per partition and state (pending, running)",
        ("partition", "state"),
    ),
    Family(
        "slurm_gpus",
        "gauge",
        "GPUs per partition: allocated to jobs, and in all",
        ("partition", "state"),
    ),
    Family(
        "slurm_nodes",
        "gauge",
        "Slurm nodes per state (idle, mixed, drained, down, ...)",
        ("state",),
    ),
    Family(
        "slurm_node_drained",
        "gauge",
        "1 for each drained or draining node, with its reason",
        ("node", "reason"),
    ),
    Family(
        "slurm_query_error",
        "gauge",
        "1 when the last read of these Slurm figures failed (its figures are left out)",
        ("query",),
    ),
    Family("slurm_query_errors_total", "counter", "Failed reads of Slurm figures", ("query",)),
)
DECLARED = {family.name: family for family in CLUSTER_FAMILIES}

T = TypeVar("T")
QUERIES = ("slurmctld", "slurmdbd", "nodes", "jobs")
CACHE_SECONDS = 5.0
SCRAPE_WAIT_SECONDS = 5.0  # below Prometheus' default scrape timeout (10 s)
REASON_CHARACTERS = 200
SLURMDBD_STORAGE = "accounting_storage/slurmdbd"
JOB_STATES = {"PENDING": "pending", "RUNNING": "running"}
SQUEUE_FORMAT = "%P %T"


class QueryError(Exception):
    """A read that gave no figures: the command failed, hung or answered nonsense."""


@dataclass(frozen=True)
class Sources:
    """How Slurm is asked: the bound of each command (through slurm.run, the runner)."""

    timeout: float = 15.0

    @classmethod
    def of(cls, config: AgentConfig) -> Sources:
        return cls(float(config.slurm_timeout_seconds))


def ran(sources: Sources, argv: list[str]) -> slurm.run.Finished:
    """A command that ended, whatever its exit status; QueryError when it is missing or
    hung."""
    try:
        return slurm.run.command(argv, sources.timeout)
    except AgentError as exc:
        raise QueryError(str(exc)) from None


def answer(sources: Sources, argv: list[str]) -> str:
    """stdout of a command that must succeed; QueryError with its cause otherwise."""
    done = ran(sources, argv)
    if done.code != 0:
        raise QueryError(f"{argv[0]} exit {done.code}: {done.stderr.strip()[:200]}")
    return done.stdout


def parsed(parse: Callable[[str], T], text: str) -> T:
    """What a reader of slurm's makes of text; QueryError when it is not understood."""
    try:
        return parse(text)
    except AgentError as exc:
        raise QueryError(str(exc)) from None


# --- slurmctld and slurmdbd -------------------------------------------------------------


def read_slurmctld(sources: Sources) -> list[Sample]:
    try:
        done = slurm.run.command(["scontrol", "ping"], sources.timeout)
    except slurm.run.NoAnswer:
        return [Sample("slurm_up", {"daemon": "slurmctld"}, 0)]  # hung: not answering
    except AgentError as exc:
        raise QueryError(str(exc)) from None
    # scontrol ping exits non-zero when a controller is down; its lines say which
    up = parsed(slurm.controller.slurmctld_up, done.stdout)
    return [Sample("slurm_up", {"daemon": "slurmctld"}, int(up))]


def accounting_storage(text: str) -> str:
    """AccountingStorageType of `scontrol show config`."""
    found = slurm.controller.parse_config(text).get("AccountingStorageType", "").split()
    if not found:
        raise QueryError("scontrol show config: no AccountingStorageType line")
    return found[0]


class SlurmdbdReader:
    """slurmdbd's state where accounting uses it; the accounting type is remembered from
    the last `scontrol show config` that answered."""

    def __init__(self) -> None:
        self.storage: str | None = None

    def __call__(self, sources: Sources) -> list[Sample]:
        try:
            self.storage = accounting_storage(answer(sources, ["scontrol", "show", "config"]))
        except QueryError:
            if self.storage is None:
                raise
        if self.storage != SLURMDBD_STORAGE:
            return []
        argv = ["sacctmgr", "-n", "-P", "show", "cluster", "format=cluster"]
        try:
            done = slurm.run.command(argv, sources.timeout)
        except slurm.run.NotFound as exc:
            raise QueryError(str(exc)) from None
        except slurm.run.NoAnswer:
            return [Sample("slurm_up", {"daemon": "slurmdbd"}, 0)]
        return [Sample("slurm_up", {"daemon": "slurmdbd"}, int(done.code == 0))]


# --- nodes and GPUs (sinfo --json) ------------------------------------------------------


def state_word(base: str, flags: list[str]) -> str:
    """Slurm's own word for a node state, as sinfo's %T shows it (without its '*' and
    '~' marks): drained / draining from the DRAIN flag, fail / failing from FAIL, else the
    base state (idle, mixed, allocated, down, ...), completing when idle but completing."""
    base = base.lower() or "unknown"
    busy = base in ("allocated", "mixed") or "COMPLETING" in flags
    if "DRAIN" in flags:
        return "draining" if busy else "drained"
    if "FAIL" in flags:
        return "failing" if busy else "fail"
    if "COMPLETING" in flags and base == "idle":
        return "completing"
    return base


def text(value: object) -> str:
    return value if isinstance(value, str) else ""


def node_samples(nodes: list[dict]) -> list[Sample]:
    states: Counter[str] = Counter()
    total: Counter[str] = Counter()
    used: Counter[str] = Counter()
    drained = []
    for node in nodes:
        flags = [flag for flag in node.get("state_flags") or [] if isinstance(flag, str)]
        word = state_word(text(node.get("state")), flags)
        states[word] += 1
        if word in ("drained", "draining"):
            reason = " ".join(text(node.get("reason")).split())[:REASON_CHARACTERS]
            drained.append((text(node.get("name")), reason))
        for partition in node.get("partitions") or []:
            if isinstance(partition, str):
                total[partition] += slurm.gres.count(text(node.get("gres")))
                used[partition] += slurm.gres.count(text(node.get("gres_used")))
    samples = [
        Sample("slurm_nodes", {"state": state}, count) for state, count in sorted(states.items())
    ]
    for partition in sorted(total):
        samples += [
            Sample("slurm_gpus", {"partition": partition, "state": "allocated"}, used[partition]),
            Sample("slurm_gpus", {"partition": partition, "state": "total"}, total[partition]),
        ]
    samples += [
        Sample("slurm_node_drained", {"node": name, "reason": reason}, 1)
        for name, reason in sorted(drained)
    ]
    return samples


def read_nodes(sources: Sources) -> list[Sample]:
    out = answer(sources, ["sinfo", "--json"])
    return node_samples(parsed(slurm.nodes.parse_sinfo_json, out))


# --- jobs (squeue) ----------------------------------------------------------------------


def job_counts(text: str) -> Counter[tuple[str, str]]:
    """Jobs per (partition, pending or running) of squeue's SQUEUE_FORMAT lines."""
    found = parsed(slurm.queue.parse_partition_states, text)
    return Counter({(partition, JOB_STATES[state]): n for (partition, state), n in found.items()})


def job_samples(counts: Counter[tuple[str, str]], partitions: set[str]) -> list[Sample]:
    """Each partition's pending and running jobs, 0 included for the partitions known."""
    known = partitions | {partition for partition, _ in counts}
    return [
        Sample("slurm_jobs", {"partition": partition, "state": state}, counts[partition, state])
        for partition in sorted(known)
        for state in JOB_STATES.values()
    ]


def read_jobs(sources: Sources) -> Counter[tuple[str, str]]:
    argv = ["squeue", "-h", "-a", "-r", "-t", "PENDING,RUNNING", "-o", SQUEUE_FORMAT]
    return job_counts(answer(sources, argv))


# --- the collector ----------------------------------------------------------------------


@dataclass(frozen=True)
class Reading:
    at: float
    value: object = None  # list[Sample], or the job counts
    problem: str = ""


class ClusterCollector:
    """A prometheus_client collector of the cluster's Slurm figures (see the module)."""

    def __init__(
        self,
        sources: Sources,
        clock: Callable[[], float] = time.monotonic,
        wait_seconds: float = SCRAPE_WAIT_SECONDS,
        log: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.sources = sources
        self.log = log  # the journal gets a query's failure and its recovery, once each
        self.clock = clock
        self.wait_seconds = wait_seconds
        self.lock = threading.Lock()
        self.readers: dict[str, Callable[[Sources], object]] = {
            "slurmctld": read_slurmctld,
            "slurmdbd": SlurmdbdReader(),
            "nodes": read_nodes,
            "jobs": read_jobs,
        }
        self.running: dict[str, Future] = {}
        self.readings: dict[str, Reading] = {}
        self.errors: Counter[str] = Counter()
        self.pool = ThreadPoolExecutor(len(QUERIES), thread_name_prefix="slurm-cluster")

    def refresh(self) -> None:
        """Start the reads whose last answer is older than CACHE_SECONDS, wait a little,
        keep what finished."""
        now = self.clock()
        for query in QUERIES:
            last = self.readings.get(query)
            if query not in self.running and (last is None or now - last.at >= CACHE_SECONDS):
                self.running[query] = self.pool.submit(self.readers[query], self.sources)
        if self.running:
            wait_for(list(self.running.values()), timeout=self.wait_seconds)
        for query, future in list(self.running.items()):
            if not future.done():
                continue
            del self.running[query]
            problem = future.exception()
            before = self.readings.get(query)
            if problem is None:
                self.readings[query] = Reading(self.clock(), future.result())
                if before is not None and before.problem:
                    self.log(f"slurm figures: {query}: answering again")
            else:
                message = str(problem) if isinstance(problem, QueryError) else repr(problem)
                self.readings[query] = Reading(self.clock(), None, message or "failed")
                self.errors[query] += 1
                if before is None or before.problem != self.readings[query].problem:
                    self.log(f"slurm figures: {query}: {self.readings[query].problem}")

    def fresh(self, query: str) -> Reading | None:
        """The query's answer if it succeeded and is recent enough to show."""
        found = self.readings.get(query)
        if found is None or found.problem or self.clock() - found.at > 2 * CACHE_SECONDS:
            return None
        return found

    def current(self) -> list[Sample]:
        with self.lock:  # concurrent scrapers wait for one reading, then share it
            self.refresh()
            samples: list[Sample] = []
            for query in QUERIES:
                found = self.fresh(query)
                samples.append(Sample("slurm_query_error", {"query": query}, int(found is None)))
                samples.append(
                    Sample("slurm_query_errors_total", {"query": query}, self.errors[query])
                )
            for query in ("slurmctld", "slurmdbd", "nodes"):
                found = self.fresh(query)
                samples += found.value if found else []
            jobs = self.fresh("jobs")
            if jobs:
                nodes = self.fresh("nodes")
                partitions = {
                    s.labels["partition"]
                    for s in (nodes.value if nodes else [])
                    if s.name == "slurm_gpus"
                }
                samples += job_samples(jobs.value, partitions)
            return samples

    def problems(self) -> dict[str, str]:
        """Why each failed query failed last (for the journal and tests)."""
        return {query: r.problem for query, r in self.readings.items() if r.problem}

    def collect(self) -> Iterator[Metric]:
        yield from families(self.current(), DECLARED)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
