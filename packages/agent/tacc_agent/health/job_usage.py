"""Live usage of each Slurm job running on this node: the per-job series of /metrics
(served to the allowed scrapers and root only, health/metrics_access.py) and what
`tacc-agent node-usage` gives `job top` for the caller's own job (node_usage.py).

Which processes are a job's: every process below a root-owned `slurmstepd: [JOB.STEP]`
(Slurm's own step daemons, whose title a user cannot forge; a user can write any
SLURM_JOB_ID into an environment, so the environment never decides membership). That is
what proctrack/linuxproc tracks too. Where Slurm keeps the job in a cgroup
(proctrack/cgroup) its CPU and memory come from the cgroup, which also counts reaped and
daemonized processes: v2 `system.slice/[<node>_]slurmstepd.scope/job_<id>/` (cpu.stat
usage_usec, memory.current), v1 `cpuacct/slurm[_<node>]/uid_<uid>/job_<id>/`
(cpuacct.usage) and `memory/slurm.../job_<id>/` (memory.usage_in_bytes). Without one
(the lab): the processes' utime+stime (+ that of the children they reaped) and Pss
(smaps_rollup; VmRSS where unreadable); the CPU sum drops when a process that no member
reaps ends (Prometheus' rate() takes a drop for a counter reset).

CPUs and GPUs Slurm gave the job here: from Slurm itself, `scontrol show job -d -o ID`
once per job (allocations do not change; the answer is kept while the job runs here), its
node group naming this node: `Nodes=n[2-3] CPU_IDs=0-1 Mem=100 GRES=gpu:2(IDX:0-1)` (CPUs =
how many CPU_IDs, GPUs = the IDX list). The daemon cannot read another user's
/proc/PID/environ (no CAP_SYS_PTRACE), so a task's SLURM_CPUS_ON_NODE / SLURM_JOB_GPUS /
SLURM_STEP_GPUS are only the fallback while Slurm has not answered (lookups run beside the
scrape, which waits for them a short while; a failed one is tried again a little later).
Plus any GPU where nvidia-smi lists one of the job's processes (GPU shards name no IDX);
GPU figures from nvidia-smi, bounded in time; no nvidia-smi or no GPUs: no GPU families,
no error.

Collected when scraped, at most once a second however many scrapers (a cache behind a
lock), in the HTTP thread: the health check loop never waits for it.
"""

from __future__ import annotations

import pwd
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.metrics_core import Metric

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.health.checks.base import Sample, command
from tacc_agent.health.metrics import families
from tacc_agent.health.registry import Family
from tacc_agent.hostlist import expand_hostlist
from tacc_agent.procfs import PROC
from tacc_agent.procfs.processes import (
    MOST_BYTES,
    Process,
    environment,
    memory_bytes,
    process_table,
)
from tacc_agent.slurm.gres import indices

JOB_FAMILIES = (
    Family(
        "job_cpu_seconds_total",
        "counter",
        "CPU time of a Slurm job's processes on this node",
        ("job", "user"),
    ),
    Family(
        "job_memory_bytes",
        "gauge",
        "Memory of a Slurm job on this node (cgroup, else the sum of its processes' Pss)",
        ("job", "user"),
    ),
    Family("job_cpus", "gauge", "CPUs Slurm allocated to a job on this node", ("job", "user")),
    Family(
        "job_gpu_utilization_ratio",
        "gauge",
        "Utilization of a GPU of a job (0..1)",
        ("job", "user", "gpu"),
    ),
    Family(
        "job_gpu_memory_used_bytes",
        "gauge",
        "GPU memory in use on a GPU of a job (its processes' where it shares the GPU)",
        ("job", "user", "gpu"),
    ),
    Family(
        "job_gpu_memory_total_bytes", "gauge", "Memory of a GPU of a job", ("job", "user", "gpu")
    ),
)
DECLARED = {family.name: family for family in JOB_FAMILIES}

CACHE_SECONDS = 1.0
NVIDIA_SMI_SECONDS = 1.5  # a `job top` frame waits for every node's answer
MIB = 1 << 20
STEPD_TITLE = re.compile(rb"^slurmstepd: \[(\d+)\.[^\]]+\]")
CPUS_VARIABLE = "SLURM_CPUS_ON_NODE"
GPU_VARIABLES = ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS")
GPU_FIELDS = "index,uuid,utilization.gpu,memory.used,memory.total"
APP_FIELDS = "pid,gpu_uuid,used_memory"
SCONTROL_SECONDS = 2.0  # one `scontrol show job` (slurmctld answers in milliseconds)
SCONTROL_WAIT_SECONDS = 0.5  # how long a scrape waits for lookups still running
SCONTROL_RETRY_SECONDS = 10.0  # a failed lookup is tried again at a scrape after this
SCONTROL_WORKERS = 4


@dataclass
class JobUsage:
    job: str
    user: str = ""
    pids: set[int] = field(default_factory=set)
    cpu_seconds: float = 0.0
    memory_bytes: int = 0
    cpus: int | None = None
    gpu_indices: set[int] = field(default_factory=set)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    utilization_ratio: float | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None


@dataclass(frozen=True)
class Sources:
    """Where the figures are read: parameters so tests feed fake trees and tools."""

    proc_root: str = PROC
    cgroup_root: str = "/sys/fs/cgroup"
    nvidia_smi: str = "nvidia-smi"
    nvidia_smi_seconds: float = NVIDIA_SMI_SECONDS
    scontrol: str = "scontrol"
    scontrol_seconds: float = SCONTROL_SECONDS
    scontrol_wait_seconds: float = SCONTROL_WAIT_SECONDS
    node: str = ""  # this node's name in Slurm; "": the host name

    @classmethod
    def of(cls, config: AgentConfig) -> Sources:
        timeout = min(NVIDIA_SMI_SECONDS, config.check_timeout_seconds)
        scontrol_seconds = min(SCONTROL_SECONDS, config.slurm_timeout_seconds)
        return cls(
            config.proc_root,
            nvidia_smi=config.nvidia_smi,
            nvidia_smi_seconds=timeout,
            scontrol_seconds=scontrol_seconds,
        )


# --- the processes (read by procfs.processes) ------------------------------------------


def step_job(proc: Process) -> str | None:
    """The job of a Slurm step daemon (root's `slurmstepd: [12.0]`), else None."""
    match = STEPD_TITLE.match(proc.title) if proc.uid == 0 else None
    return match.group(1).decode() if match else None


def job_of(pid: int, table: dict[int, Process], memo: dict[int, str | None]) -> str | None:
    """The job whose step daemon this process descends from (the daemon itself: None)."""
    chain: list[int] = []
    job = None
    # (a pid reused between two reads could make a loop: a pid seen twice ends the walk)
    while pid in table and pid not in memo and pid not in chain:
        chain.append(pid)
        parent = table[pid].ppid
        if parent in table and (job := step_job(table[parent])):
            break
        pid = parent
    else:
        job = memo.get(pid)
    for member in chain:
        memo[member] = job
    return job


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def read_allocation(usage: JobUsage, variables: dict[str, str]) -> None:
    """CPUs and GPUs Slurm gave the job here, from a task's environment."""
    cpus = variables.get(CPUS_VARIABLE, "")
    if usage.cpus is None and cpus.isdigit():
        usage.cpus = int(cpus)
    for name in GPU_VARIABLES:
        usage.gpu_indices |= indices(variables.get(name, ""))


def jobs_from_proc(proc_root: str) -> dict[str, JobUsage]:
    """Each job with processes on this node: its processes, CPU, memory, user, CPUs, GPUs."""
    table = process_table(proc_root)
    memo: dict[int, str | None] = {}
    jobs: dict[str, JobUsage] = {}
    for pid, proc in table.items():
        job = job_of(pid, table, memo)
        if job is None:
            continue
        usage = jobs.setdefault(job, JobUsage(job))
        usage.pids.add(pid)
        usage.cpu_seconds += proc.cpu_seconds
        usage.memory_bytes += memory_bytes(proc_root, pid)
        if proc.uid != 0 and step_job(table.get(proc.ppid, proc)) == job:  # a task
            usage.user = usage.user or user_name(proc.uid)
            # A task controls its environment: no more of it read than MOST_BYTES.
            read_allocation(usage, environment(proc_root, pid, MOST_BYTES) or {})
    for usage in jobs.values():
        usage.cpu_seconds = round(usage.cpu_seconds, 3)
    return jobs


# --- cgroups (proctrack/cgroup) --------------------------------------------------------


def read_number(path: Path, key: str = "") -> int | None:
    """A cgroup file's number, or with key the value of that line ("usage_usec 12")."""
    try:
        text = path.read_text()
    except OSError:
        return None
    if not key:
        return int(text.strip()) if text.strip().isdigit() else None
    found = re.search(rf"^{re.escape(key)} (\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def cgroup_figures(cgroup_root: str, job: str) -> tuple[float, int] | None:
    """(CPU seconds, memory bytes) of the job's cgroup, v2 then v1; None without one."""
    root = Path(cgroup_root)
    for scope in root.glob(f"system.slice/*slurmstepd.scope/job_{job}"):
        usec = read_number(scope / "cpu.stat", "usage_usec")
        memory = read_number(scope / "memory.current")
        if usec is not None and memory is not None:
            return usec / 1e6, memory
    cpu = next(root.glob(f"cpu*acct*/slurm*/uid_*/job_{job}/cpuacct.usage"), None)
    memory_file = next(root.glob(f"memory/slurm*/uid_*/job_{job}/memory.usage_in_bytes"), None)
    if cpu and memory_file:
        nanoseconds, memory = read_number(cpu), read_number(memory_file)
        if nanoseconds is not None and memory is not None:
            return nanoseconds / 1e9, memory
    return None


# --- nvidia-smi ------------------------------------------------------------------------


def figure(text: str) -> float | None:
    """A number, or None for nvidia-smi's "[N/A]" / "[Not Supported]"."""
    try:
        return float(text)
    except ValueError:
        return None


def csv_rows(nvidia_smi: str, query: str, fields: str, timeout: float) -> list[list[str]]:
    out = command([nvidia_smi, f"--{query}={fields}", "--format=csv,noheader,nounits"], timeout)
    if out.code != 0:  # absent, no GPUs (exit 6), stuck: no GPU figures
        return []
    width = fields.count(",") + 1
    rows = [[cell.strip() for cell in line.split(",")] for line in out.stdout.splitlines()]
    return [row for row in rows if len(row) == width]


def gpus(sources: Sources) -> tuple[dict[int, Gpu], dict[str, dict[int, int]]]:
    """The node's GPUs by index, and per GPU uuid the memory each process uses there."""
    found: dict[int, Gpu] = {}
    for index, uuid, util, used, total in csv_rows(
        sources.nvidia_smi, "query-gpu", GPU_FIELDS, sources.nvidia_smi_seconds
    ):
        if index.isdigit():
            ratio, used_mib, total_mib = figure(util), figure(used), figure(total)
            found[int(index)] = Gpu(
                int(index),
                uuid,
                None if ratio is None else round(ratio / 100, 4),
                None if used_mib is None else int(used_mib * MIB),
                None if total_mib is None else int(total_mib * MIB),
            )
    apps: dict[str, dict[int, int]] = {}
    if found:
        for pid, uuid, used in csv_rows(
            sources.nvidia_smi, "query-compute-apps", APP_FIELDS, sources.nvidia_smi_seconds
        ):
            if pid.isdigit():
                apps.setdefault(uuid, {})[int(pid)] = int((figure(used) or 0) * MIB)
    return found, apps


def job_gpus(
    usage: JobUsage, node_gpus: dict[int, Gpu], apps: dict[str, dict[int, int]]
) -> list[Gpu]:
    """The job's GPUs: those Slurm named, with the node's figures; those where only its
    processes appear (a shared GPU), with its processes' memory."""
    found = []
    for gpu in sorted(node_gpus.values(), key=lambda g: g.index):
        own = {pid: used for pid, used in apps.get(gpu.uuid, {}).items() if pid in usage.pids}
        if gpu.index in usage.gpu_indices:
            found.append(gpu)
        elif own:
            found.append(
                Gpu(
                    gpu.index,
                    gpu.uuid,
                    gpu.utilization_ratio,
                    sum(own.values()),
                    gpu.memory_total_bytes,
                )
            )
    return found


# --- Slurm's allocation (scontrol show job -d -o) --------------------------------------


@dataclass(frozen=True)
class Allocation:
    """What Slurm gave a job on this node; cpus None: Slurm named no group with this node."""

    cpus: int | None
    gpus: frozenset[int] = frozenset()


NOT_HERE = Allocation(None)


def allocation_here(line: str, node: str) -> Allocation:
    """The job's allocation on `node` (or its short name) from scontrol's line."""
    names = {node, node.split(".")[0]}
    for hostlist, cpu_ids, gres in slurm.jobs.node_groups(line):
        if names & set(expand_hostlist(hostlist)):
            cpus = len(indices(cpu_ids))
            return Allocation(cpus or None, slurm.gres.gpu_indices(gres))
    return NOT_HERE


def lookup(sources: Sources, job: str) -> Allocation | None:
    """Slurm's allocation of a job here; None when scontrol failed, hung or is missing."""
    line = slurm.jobs.detailed_line(job, sources.scontrol_seconds, sources.scontrol)
    if line is None:
        return None
    return allocation_here(line, sources.node or socket.gethostname())


class Allocations:
    """Slurm's allocation per job id, looked up once per job in worker threads: a scrape
    starts the lookups of jobs it sees first, waits for them at most scontrol_wait_seconds,
    and takes what is there; a lookup still running is taken at a later scrape, a failed
    one is tried again after SCONTROL_RETRY_SECONDS. Ids no longer seen are forgotten.
    Used under JobUsageCollector's lock (one scrape at a time)."""

    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = sources
        self.clock = clock
        self.known: dict[str, Allocation] = {}
        self.running: dict[str, Future[Allocation | None]] = {}
        self.failed_at: dict[str, float] = {}
        self.pool = ThreadPoolExecutor(SCONTROL_WORKERS, thread_name_prefix="scontrol")

    def start(self, jobs: Iterable[str]) -> None:
        """Forget the jobs no longer here, start the lookups of the new ones."""
        seen = set(jobs)
        for table in (self.known, self.running, self.failed_at):
            for job in set(table) - seen:
                del table[job]
        now = self.clock()
        for job in sorted(seen - set(self.known) - set(self.running)):
            if job not in self.failed_at or now - self.failed_at[job] >= SCONTROL_RETRY_SECONDS:
                self.running[job] = self.pool.submit(lookup, self.sources, job)

    def finish(self) -> dict[str, Allocation]:
        """Wait a little for the running lookups; the allocations known now."""
        if self.running:
            wait_for(list(self.running.values()), timeout=self.sources.scontrol_wait_seconds)
        for job, future in list(self.running.items()):
            if future.done():
                del self.running[job]
                found = None if future.exception() else future.result()
                if found is not None:
                    self.known[job] = found
                    self.failed_at.pop(job, None)
                else:
                    self.failed_at[job] = self.clock()
        return dict(self.known)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


# --- the whole collection --------------------------------------------------------------


def collect(
    sources: Sources, allocations: Allocations | None = None, only: str | None = None
) -> list[Sample]:
    """The jobs' samples (only: that job's alone, nothing asked about the others);
    allocations: the daemon's lasting cache (None: a fresh one)."""
    own = allocations is None
    allocations = allocations or Allocations(sources)
    try:
        return samples_of(sources, allocations, only)
    finally:
        if own:
            allocations.close()


def samples_of(sources: Sources, allocations: Allocations, only: str | None = None) -> list[Sample]:
    jobs = jobs_from_proc(sources.proc_root)
    if only is not None:
        jobs = {job: usage for job, usage in jobs.items() if job == only}
    allocations.start(jobs)  # scontrol runs while nvidia-smi does
    node_gpus, apps = gpus(sources) if jobs else ({}, {})
    from_slurm = allocations.finish()
    samples = []
    for job in sorted(jobs, key=int):
        usage = jobs[job]
        found = from_slurm.get(job, NOT_HERE)
        if found.cpus is not None:  # Slurm's answer over a task's environment
            usage.cpus, usage.gpu_indices = found.cpus, set(found.gpus)
        from_cgroup = cgroup_figures(sources.cgroup_root, job)
        if from_cgroup:
            usage.cpu_seconds, usage.memory_bytes = round(from_cgroup[0], 3), from_cgroup[1]
        labels = {"job": job, "user": usage.user}
        samples += [
            Sample("job_cpu_seconds_total", labels, usage.cpu_seconds),
            Sample("job_memory_bytes", labels, usage.memory_bytes),
        ]
        if usage.cpus is not None:
            samples.append(Sample("job_cpus", labels, usage.cpus))
        for gpu in job_gpus(usage, node_gpus, apps):
            gpu_labels = {**labels, "gpu": str(gpu.index)}
            figures = {
                "job_gpu_utilization_ratio": gpu.utilization_ratio,
                "job_gpu_memory_used_bytes": gpu.memory_used_bytes,
                "job_gpu_memory_total_bytes": gpu.memory_total_bytes,
            }
            for name, value in figures.items():
                if value is not None:
                    samples.append(Sample(name, gpu_labels, value))
    return samples


class JobUsageCollector:
    """A prometheus_client collector of the jobs' usage, read at most once a second."""

    def __init__(self, sources: Sources, clock: Callable[[], float] = time.monotonic) -> None:
        self.sources = sources
        self.clock = clock
        self.lock = threading.Lock()
        self.read_at: float | None = None
        self.samples: list[Sample] = []
        self.allocations = Allocations(sources, clock)

    def current(self) -> list[Sample]:
        with self.lock:  # concurrent scrapers wait for one reading, then share it
            now = self.clock()
            if self.read_at is None or now - self.read_at >= CACHE_SECONDS:
                try:
                    self.samples = collect(self.sources, self.allocations)
                except OSError:  # /proc unreadable: no job figures this time
                    self.samples = []
                self.read_at = self.clock()
            return self.samples

    def collect(self) -> Iterator[Metric]:
        yield from families(self.current(), DECLARED)
