"""Layer 4, execution. `tacc-agent batch JOBDIR` is the job's batch step (first node):
prepares the environment once (envcache), runs the setup lines, then starts
`tacc-agent exec JOBDIR` on every allocated node with srun and records the outcome.
`tacc-agent exec` is one node's wrapper: it writes its facts for the other ranks, lets
the execution plug-ins shape the rank (launcher, transport: the ranks agree through
their facts, tasks/execute/agreement.py), sets the task's variables and runs each run line,
writing every line the program prints to logs/rank-<r>-<host>.log and its exit status
to status/.
Signals (scancel's TERM, the checkpoint USR1) are forwarded to the program's process
group, so cancel leaves nothing behind.
A task with a container image: the batch step makes sure the image is in the user's
cache (imagecache, pulled once per digest; imagebuild, built once per content from the
task's Containerfile) instead of building a venv, and every setup and run line runs
inside it with the node's container runtime (containers.py); ch-run execs the line's
program, so the signals, logs and exit codes above are the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from tacc_agent import gpu_memory, slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.hostlist import expand_hostlist
from tacc_agent.self_command import AGENT
from tacc_agent.tasks.execute import containers, envcache, job_vars, lost_nodes, timing
from tacc_agent.tasks.execute.agreement import Agreement
from tacc_agent.tasks.execute.job_vars import user_dir_of
from tacc_agent.tasks.execute.proctree import children, descendants
from tacc_agent.tasks.images import cache as imagecache
from tacc_agent.tasks.images import registry
from tacc_agent.tasks.interactive import idle
from tacc_agent.tasks.jobs import records, sweeps
from tacc_agent.tasks.schedule import transport
from tacc_agent.tasks.schedule.instruction import load
from tacc_agent.tasks.schedule.submit import cluster_plugins
from tacc_contract import cpus_and_memory
from tacc_contract.images import parse_reference
from tacc_contract.plugins import Launch, Outcome
from tacc_contract.registry import in_layer
from tacc_contract.schema import TaskSpec, processes_per_node
from tacc_plugins.launcher import (
    FIRST_NODE_LAUNCHERS,
    TORCHRUN_LINE,
    with_modules,
    wrapper_rank,
    wrappers_per_node,
)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCONT)
KILL_GRACE_SECONDS = 10


def say(message: str) -> None:
    print(f"tacc: {message}", flush=True)


class Forwarder:
    """Signal handlers that pass signals on to the running program's process group.

    With `workers_only` (torchrun), the checkpoint signal goes to the launcher's own
    children, the workers, instead: torchrun would die of SIGUSR1, and it starts each
    worker in a session of its own, where a group signal would not reach it.
    """

    def __init__(self, on_signal=None, workers_only: bool = False) -> None:
        self.child: subprocess.Popen | None = None
        self.received: list[int] = []
        self.on_signal = on_signal
        self.workers_only = workers_only
        for number in FORWARDED:
            signal.signal(number, self.handle)

    def handle(self, number: int, _frame) -> None:
        self.received.append(number)
        child = self.child
        if child is not None and child.returncode is None:
            self.forward(child.pid, number)
        if self.on_signal:
            try:  # bookkeeping only: a signal handler must never raise
                self.on_signal(number)
            except Exception as exc:
                print(f"tacc: recording signal {number} failed: {exc}", file=sys.stderr)

    def forward(self, pid: int, number: int) -> None:
        if self.workers_only and number == signal.SIGUSR1:
            # torchrun would die of it: its own children, the workers, get it instead.
            for worker in children(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, number)
            return
        if number in (signal.SIGTERM, signal.SIGINT):
            # Also processes that left the group (setsid): cancel leaves nothing behind.
            for below in descendants(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(below, number)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, number)

    @property
    def terminated(self) -> bool:
        return any(n in (signal.SIGTERM, signal.SIGINT) for n in self.received)


def stop_group(pid: int) -> None:
    """TERM, a grace period, then KILL, to whatever is left of a program's group."""
    for number, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 0)):
        try:
            os.killpg(pid, number)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def run_line(argv: list[str], cwd: Path, env: dict, forwarder: Forwarder, sink) -> int:
    """Run one program in its own process group; every output line goes to sink. The
    line ends when its program exits: what it left running in the background (holding
    the output pipe open) is stopped then, as Slurm does at the end of a step."""
    child = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    forwarder.child = child
    if forwarder.terminated:  # the signal came while it was starting
        forwarder.forward(child.pid, signal.SIGTERM)

    def pump() -> None:
        for raw in iter(child.stdout.readline, b""):  # type: ignore[union-attr]
            sink(raw)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    code = child.wait()
    forwarder.child = None
    reader.join(1.0)
    if reader.is_alive() or forwarder.terminated:
        stop_group(child.pid)
        reader.join(KILL_GRACE_SECONDS)
    stop_leftovers()
    return 128 - code if code < 0 else code


PR_SET_CHILD_SUBREAPER = 36  # prctl(2)


def become_subreaper() -> None:
    """Orphans of the programs this process starts (the workers of a launcher that died,
    a daemon that left its session) become its children instead of init's, so they can
    be found and stopped: Slurm's proctrack/linuxproc only follows parent links."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        say(f"cannot become a child subreaper: {os.strerror(ctypes.get_errno())}")


def reap() -> None:
    """Collect adopted children that have exited (never while a Popen waits for its own)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def stop_leftovers() -> None:
    """What a finished line left running outside its process group (adopted by this
    subreaper): TERM, the grace period, then KILL, as at the end of a Slurm step."""
    for number, grace in ((signal.SIGTERM, KILL_GRACE_SECONDS), (signal.SIGKILL, 0)):
        reap()
        left = descendants(os.getpid())
        if not left:
            return
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            reap()
            if not descendants(os.getpid()):
                return
            time.sleep(0.1)
    reap()


def base_env(job_dir: Path, task: TaskSpec | None = None) -> dict[str, str]:
    """job_vars.base_env, TACC_WORKDIR as the task asks (runtime.workdir)."""
    return job_vars.base_env(job_dir, task is not None and job_vars.legacy_workdir(task.runtime))


def program_env(task: TaskSpec, env: dict[str, str]) -> dict[str, str]:
    return job_vars.program_env(task.environment["env"], env)


# The daemon's default pipe directory (nvidia-cuda-mps-control(1)): only looked at, and
# only a root-owned control pipe counts (anyone may create a directory in /tmp).
MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"  # noqa: S108


def gpu_share_facts(task: TaskSpec, config: AgentConfig) -> dict:
    """For a share of a GPU that Slurm served by CUDA MPS (a gres/mps job: Slurm sets
    CUDA_MPS_ACTIVE_THREAD_PERCENTAGE in its environment), what its limits are taken
    from: {"gpu_sharing": "mps", "slurm_mps_percentage", "gpu_memory_mib", "mps_daemon"
    (whether the daemon's control pipe is there)}; {} otherwise."""
    slurm_percent = os.environ.get("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "")
    if not task.resources.get("gpu_share") or not slurm_percent:
        return {}
    pipes = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or MPS_PIPE_DIRECTORY
    return {
        "gpu_sharing": "mps",
        "slurm_mps_percentage": int(slurm_percent) if slurm_percent.isdigit() else 0,
        "gpu_memory_mib": gpu_memory.smallest_mib(config.nvidia_smi, config.slurm_timeout_seconds),
        "mps_daemon": root_owned(Path(pipes, "control")),
    }


def root_owned(path: Path) -> bool:
    try:
        return path.stat().st_uid == 0
    except OSError:
        return False


# ---------------------------------------------------------------- batch step
def batch(job_dir: Path, config: AgentConfig) -> int:
    entered = time.time()
    job_dir = sweeps.batch_dir(job_dir.resolve())  # a sweep's trial works in its own
    marks = timing.Marks(job_dir, "batch")
    marks.mark("batch", entered)
    task = load(job_dir)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    become_subreaper()
    forwarder = Forwarder()
    restarts = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    # A requeued run: say what stopped the last one before its rank records go.
    lost = lost_nodes.describe(records.ranks(job_dir), config.slurm_timeout_seconds)
    records.clear_ranks(job_dir)
    timing.clear(job_dir)
    detail = {"lost": lost} if restarts and lost else {}
    # The Slurm id, in the job's own record: a submit that crashed after sbatch and
    # whose job ran out of the queue is still found without accounting (submitting.py).
    records.add_event(job_dir, "PROVISIONING", restart=restarts, slurm_job_id=job_id, **detail)
    say(f"job {job_id} on {socket.gethostname()}: provisioning (run {restarts + 1})")
    if detail:
        say(f"run {restarts} was requeued: {lost}")
    env = base_env(job_dir, task)
    try:
        if sweeps.is_trial(job_dir):
            sweeps.own_code_tree(job_dir)
        link_datasets(task, job_dir)
        container = job_container(
            task, job_dir, config, prepare=True, job_id=job_id, build_tools=True
        )
        if container:
            runtime_user(env)
        if wants_environment(task):
            environment = envcache.ensure(
                user_dir_of(job_dir),
                task.environment["requirements"],
                environment_builder(config, user_dir_of(job_dir), container),
                job_id,
                say,
                config.env_lock_timeout_seconds,
                task.environment.get("lock"),
            )
            envcache.record_for_job(job_dir, environment)
            if container:  # the venv is the image's: first on the container's PATH
                container = job_container(task, job_dir, config)
            else:
                job_vars.activate(Path(environment["path"]), env)
        marks.mark("environment")
    except AgentError as exc:
        say(str(exc))
        if forwarder.terminated:  # cancelled, halted or out of time while building
            return 128 + signal.SIGTERM
        records.add_event(job_dir, "FAILED", exit_code=1, reason=str(exc))
        return 1
    for number, line in enumerate(task.setup, 1):
        say(f"setup {number}/{len(task.setup)}: {line}")
        argv = ["bash", "-euo", "pipefail", "-c", with_modules(task, line)]
        argv = container.wrap(argv) if container else argv
        code = run_line(
            argv, job_dir / "code", program_env(task, env), forwarder, sys.stdout.buffer.write
        )
        sys.stdout.flush()
        if code != 0 or forwarder.terminated:
            reason = f"setup line {number} exited {code}"
            say(reason)
            if not forwarder.terminated:
                records.add_event(job_dir, "FAILED", exit_code=code, reason=reason)
            return code
    argv = wrapper_argv(task, job_dir)
    if forwarder.terminated:
        return 128 + signal.SIGTERM
    marks.mark("srun")
    marks.save()
    # sbatch's per-GPU requests reach the step as SLURM_CPUS_PER_GPU / SLURM_MEM_PER_GPU:
    # beside the wrapper's --cpus-per-task, any srun the program runs would refuse them
    # as mutually exclusive. The wrapper's own options say what its step gets.
    step_env = {k: v for k, v in env.items() if k not in PER_GPU_JOB_VARIABLES}
    started = time.monotonic()
    # An interactive session: stopped once idle for its idle_timeout (tasks/interactive/idle.py).
    watchdog = idle.start(task.session, job_dir, job_id, config.slurm_timeout_seconds, say)
    try:
        code = run_line(
            argv,
            job_dir,
            step_env | {"TACC_VENV": env.get("VIRTUAL_ENV", "")},
            forwarder,
            sys.stdout.buffer.write,
        )
    finally:
        if watchdog is not None:
            watchdog.stop()
    sys.stdout.flush()
    finish(job_dir, code, forwarder.terminated)
    report_outcome(task, job_dir, code, time.monotonic() - started, config)
    return code


def job_container(
    task: TaskSpec,
    job_dir: Path,
    config: AgentConfig,
    *,
    prepare: bool = False,
    job_id: str = "",
    over_image: Mapping[str, str] | None = None,
    build_tools: bool = False,
) -> containers.Container | None:
    """The job's container (None for a task without an image). `prepare` (the batch
    step): pull the image, or build it from the task's build file, if this user's cache
    lacks it, record it in the job, and make the mount points the binds need; the
    wrappers then find everything in place. `over_image`: variables the plug-ins set
    for the job (an MPS share's limits, the transport's), which win over the image's
    like the task's own. `build_tools` (the batch step, for a task with requirements):
    uv's directory bound at containers.TOOLS_TARGET, to build the venv in the image."""
    if not task.image_build and not task.image:
        return None
    user_dir = user_dir_of(job_dir)
    lock_timeout = config.image_lock_timeout_seconds
    # Before any pull or build, and before reusing a cached copy: a rerun after the
    # cluster's list of registries shrank is refused here.
    registry.check_task(task.image, task.image_build, config.image_registries)
    if task.image_build:
        # Lazy: the build file's parser (dockerfile_parse, logging) is ~8 ms of every job
        # step's start; only a task with `build:` needs it.
        from tacc_agent.tasks.images import build as imagebuild  # lazy start-up import

        hex_key, name = imagebuild.key_hex(task.image_build), imagebuild.label(task.image_build)
    else:
        ref = parse_reference(task.image) if isinstance(task.image, str) else None
        if ref is None:  # the instruction was parsed with pinned=True: never happens
            raise AgentError(f"task.image: not an image reference: {task.image!r}")
        hex_key, name = imagecache.digest_hex(ref), str(ref)
    if prepare:
        puller = imagecache.SkopeoUmoci(config.image_pull_timeout_seconds)
        if task.image_build:
            settings = imagebuild.BuildSettings(
                lock_timeout,
                config.image_build_timeout_seconds,
                config.package_index,
                config.container_runtime,
            )
            marker = imagebuild.ensure_build(
                user_dir, job_dir, task.image_build, job_id, say, settings, puller=puller
            )
        else:
            marker = imagecache.ensure(
                user_dir, task.image, job_id, say, lock_timeout, puller, config.container_runtime
            )
        imagecache.record_for_job(job_dir, {**marker, "runtime": config.container_runtime})
    else:  # a wrapper: the batch step pulled or built it
        marker = imagecache.marker_at(user_dir, hex_key, name)
    datasets = [d.cluster for d in task.datasets if d.cluster]
    # A venv on top of the image is built by uv run in the container: its directory too.
    uv = Path(envcache.uv_binary(config.uv)).resolve() if build_tools else None
    tools = [str(uv.parent)] if uv is not None and wants_environment(task) else []
    job = containers.job_binds(
        user_dir,
        config.workspace,
        datasets,
        config.container_binds,
        config.slurm_spool_dir,
        gpu_driver_dir=config.container_gpu_driver_dir,
        tools=tools,
    )
    if prepare:
        containers.prepare_mask(job, user_dir / imagecache.IMAGES / containers.MASK)
        imagecache.make_mount_points_at(user_dir, hex_key, name, job.mount_points, lock_timeout)
    runtime = containers.runtime_named(config.container_runtime)
    task_env = {**task.environment["env"], **(over_image or {})}
    env = containers.container_env(
        marker.get("env") or {}, task_env, runtime.defaults, job.search_paths
    )
    environment = envcache.job_environment(job_dir) if wants_environment(task) else None
    if environment and environment.get("path"):  # the venv built on the image, first
        venv = Path(environment["path"])
        path = env.get("PATH") or task_env.get("PATH") or containers.DEFAULT_PATH
        env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}:{path}")
    return containers.Container(
        runtime=runtime,
        rootfs=imagecache.rootfs_at(user_dir, hex_key),
        binds=job.binds,
        env=env,
        cwd=job_dir / "code",
        image=hex_key,
    )


def wants_environment(task: TaskSpec) -> bool:
    """Whether the job runs in a venv the batch step builds (or finds) for it."""
    return bool(task.environment.get("requirements") or task.environment.get("lock"))


def in_container(
    command: Callable[[str], list[str]], container: containers.Container | None, launcher: str
) -> Callable[[str], list[str]]:
    """A run line's command inside the container: the whole command (srun's rank, the
    torchrun of a node, `none`), or, for mpirun, which stays on the host and starts its
    ranks itself, each rank's line."""
    if container is None:
        return command
    if launcher == "mpirun":
        return lambda line: command(container.wrap_line(line))
    return lambda line: container.wrap(command(line))


def runtime_user(env: dict[str, str]) -> None:
    """ch-run wants $USER (Slurm sets it; a wrapper started by hand may not have it)."""
    if not env.get("USER"):
        env["USER"] = getpass.getuser()


def environment_builder(
    config: AgentConfig, user_dir: Path, container: containers.Container | None = None
) -> envcache.Builder:
    """How this job's venv is built: on the node's Python (config.python), or in the
    job's container on the image's own `python3`."""
    uv = envcache.uv_binary(config.uv)
    return envcache.Builder(
        python="python3" if container else config.python,
        uv=uv,
        # in the container: the same binary where job_container(build_tools=True) binds it
        step_uv=containers.tool_in_container(Path(uv).resolve()) if container else "",
        index=config.package_index,
        cache_dir=user_dir / ".cache" / "uv",
        wrap=container.wrap if container else None,
        image=container.image if container else "",
        # ch-run wants $USER (runtime_user), which a step started by hand may lack
        extra_env={"USER": os.environ.get("USER") or getpass.getuser()} if container else {},
    )


def job_cpus_per_node(environ: Mapping[str, str]) -> int:
    """The fewest CPUs Slurm gave the job on any of its nodes: SLURM_JOB_CPUS_PER_NODE
    ("64,32", "32(x2),16"), else this node's SLURM_CPUS_ON_NODE; 0 when neither says."""
    counts = re.findall(r"(\d+)(?:\(x\d+\))?", environ.get("SLURM_JOB_CPUS_PER_NODE", ""))
    if counts:
        return min(int(count) for count in counts)
    return int(environ.get("SLURM_CPUS_ON_NODE", "0") or 0)


def wrapper_cpus(task: TaskSpec, per_node: int) -> int:
    """CPUs per wrapper: the task's `cpus`; else (per-GPU CPUs, chosen by the task or the
    partition) an even part of what Slurm gave the job on its smallest node (one step
    size for every node: srun --ntasks-per-node)."""
    option = cpus_and_memory.cpu_option(task.resources)
    if option is not None and option[0] == "cpus-per-task":
        return int(option[1])
    return max(job_cpus_per_node(os.environ) // max(per_node, 1), 1)


def wrapper_memory(task: TaskSpec) -> list[str]:
    """Memory per node for the wrappers' step: the job's own memory when it was given per
    GPU (a step asks for memory per CPU otherwise, DefMemPerCPU, and per-GPU memory
    reaches a step only with GPUs it asks for)."""
    option = cpus_and_memory.memory_option(task.resources)
    if option is None or option[0] == "mem-per-gpu":
        return ["--mem=0"]  # all of the job's memory on each node
    return []


PER_GPU_JOB_VARIABLES = ("SLURM_CPUS_PER_GPU", "SLURM_MEM_PER_GPU")


def wrapper_argv(task: TaskSpec, job_dir: Path) -> list[str]:
    """How the batch step starts the wrappers: srun, one per process (launcher srun) or
    per node (torchrun); mpirun's one wrapper runs right here, in the batch step, so
    mpirun sees the whole allocation and starts its own daemons with srun."""
    if task.runtime["launcher"] == "mpirun":
        return [*AGENT, "exec", str(job_dir)]
    # The nodes Slurm gave the job: with a range (nodes: 2-4) anything from min to max.
    allocated = int(os.environ.get("SLURM_JOB_NUM_NODES", "0") or 0) or task.resources["nodes"]
    nodes = 1 if task.runtime["launcher"] in FIRST_NODE_LAUNCHERS else allocated
    per_node = wrappers_per_node(task)
    # Slurm 22.05's srun no longer takes the job's cpus-per-task from the environment:
    # each wrapper (and what it starts: torchrun's workers) gets the CPUs the task asked,
    # or, where Slurm chose them per GPU, its part of the node's.
    return [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={nodes}",
        f"--ntasks={nodes * per_node}",
        f"--ntasks-per-node={per_node}",
        f"--cpus-per-task={wrapper_cpus(task, per_node)}",
        *wrapper_memory(task),
        f"--mpi={task.runtime['mpi']}",
        "--export=ALL",
        *AGENT,
        "exec",
        str(job_dir),
    ]


def report_outcome(
    task: TaskSpec, job_dir: Path, code: int, seconds: float, config: AgentConfig
) -> None:
    """Each execution plug-in's line about the finished run (e.g. predicted vs actual)."""
    submitted = records.read_json(job_dir / "status" / "submit.json") or {}
    outcome = Outcome(task, job_dir, code, seconds, submitted)
    for plugin in in_layer(cluster_plugins(task, config), "execute"):
        try:
            line = plugin.finish(outcome)
        except Exception as exc:  # a plug-in's report never fails the job
            line = f"plug-in {plugin.name}: could not report: {exc}"
        if line:
            say(line)


def link_datasets(task: TaskSpec, job_dir: Path) -> None:
    for dataset in task.datasets:
        if dataset.cluster:
            link = job_dir / "datasets" / dataset.name
            link.parent.mkdir(mode=0o700, exist_ok=True)
            if not link.is_symlink():
                # A sweep's trials share one datasets/ and may start together.
                with contextlib.suppress(FileExistsError):
                    link.symlink_to(dataset.cluster)


def finish(job_dir: Path, code: int, terminated: bool) -> None:
    """Record COMPLETED/FAILED, unless someone is stopping the job (cancel, halt, time
    limit): then the agent that stops it, or Slurm's own state, has the last word."""
    ranks = records.ranks(job_dir)
    stopping = records.last_state(job_dir) in ("CANCELLED", "HALTED")
    if terminated or stopping:
        return
    # A rank that failed on its own; the others may have been stopped because of it
    # (srun --kill-on-bad-exit).
    failed = [r for r in ranks if r.get("exit_code") and not r.get("terminated")]
    if not failed and any(r.get("terminated") for r in ranks):
        return  # stopped from outside (time limit, node failure): Slurm's state decides
    exit_code = failed[0]["exit_code"] if failed else code
    if exit_code == 0 and code == 0:
        records.add_event(job_dir, "COMPLETED", exit_code=0)
    else:
        where = ", ".join(f"{r['host']}:{r['rank']}" for r in failed) or "srun"
        records.add_event(
            job_dir, "FAILED", exit_code=exit_code or code, reason=f"exit {exit_code} on {where}"
        )


# ---------------------------------------------------------------- one node
def step_hostnames(nodelist: str, timeout: float) -> list[str]:
    """The step's host names in Slurm's order: a plain list (n2, or n2,n3) as it is, a
    hostlist expression (n[2-3]) expanded here (tacc_agent.hostlist), with no scontrol
    process on a wrapper's start or an attach; `scontrol show hostnames` only for an
    expression that names nobody here."""
    if "[" not in nodelist:
        return [name for name in nodelist.split(",") if name]
    return expand_hostlist(nodelist) or slurm.nodes.hostnames(nodelist, timeout)


def slurm_node_rank(nodes: list[str], host: str) -> int:
    """This node's index in the step: Slurm's own (SLURM_NODEID, the order its ranks
    and PMIx follow, whatever the host calls itself); outside Slurm, the host's place."""
    if os.environ.get("SLURM_NODEID", "").isdigit():
        return int(os.environ["SLURM_NODEID"])
    if host not in nodes:
        raise AgentError(f"this host ({host}) is not one of the job's nodes: {', '.join(nodes)}")
    return nodes.index(host)


class RankLogs:
    """torchrun's output, filed by rank: a worker's line ("[tacc-rank 3] text") goes to
    logs/rank-3-<host>.log without its prefix; torchrun's own lines, and any line naming
    a rank that is not one of this node's workers, to the wrapper's log as they came."""

    def __init__(self, job_dir: Path, host: str, own, ranks: range = range(0)) -> None:
        self.job_dir, self.host, self.own, self.ranks = job_dir, host, own, ranks
        self.files: dict[int, object] = {}

    def write(self, raw: bytes) -> None:
        match = TORCHRUN_LINE.match(raw)
        if not match or int(match.group(1)) not in self.ranks:
            self.own.write(raw)
            return
        rank = int(match.group(1))
        if rank not in self.files:
            path = self.job_dir / "logs" / f"rank-{rank}-{self.host}.log"
            self.files[rank] = path.open("ab", buffering=0)
        self.files[rank].write(raw[match.end() :])  # type: ignore[attr-defined]

    def __enter__(self) -> RankLogs:
        return self

    def __exit__(self, *_exc) -> None:
        for handle in self.files.values():
            handle.close()  # type: ignore[attr-defined]


def node_features(host: str, config: AgentConfig) -> list[str]:
    """This node's Slurm features (AvailableFeatures), for `Launch.node_features`."""
    found = slurm.nodes.node(host, config.slurm_timeout_seconds)
    return list(found.features) if found else []


def first_output_marked(
    sink: Callable[[bytes], object], marks: timing.Marks
) -> Callable[[bytes], None]:
    """sink, and the time of the program's first output line in marks (saved then)."""

    def write(raw: bytes) -> None:
        if "first_output" not in marks.marks:
            marks.mark("first_output")
            marks.save()
        sink(raw)

    return write


def execute(job_dir: Path, config: AgentConfig) -> int:
    entered = time.time()
    job_dir = job_dir.resolve()
    task = load(job_dir)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    host = socket.gethostname()
    mpirun = task.runtime["launcher"] == "mpirun"  # runs in the batch step: the job's nodes
    step_nodes = None if mpirun else os.environ.get("SLURM_STEP_NODELIST")
    nodelist = step_nodes or os.environ.get("SLURM_JOB_NODELIST", host)
    nodes = (
        step_hostnames(nodelist, config.slurm_timeout_seconds)
        if "SLURM_JOB_ID" in os.environ
        else [host]
    )
    ips = [socket.gethostbyname(node) for node in nodes]
    node_rank = 0 if mpirun else slurm_node_rank(nodes, host)
    local_rank = 0 if mpirun else int(os.environ.get("SLURM_LOCALID", "0") or 0)
    rank = wrapper_rank(task, node_rank, local_rank)
    wrappers = 1 if mpirun else int(os.environ.get("SLURM_NTASKS", "1") or 1)
    log_path = job_dir / "logs" / f"rank-{rank}-{host}.log"
    workers = range(rank, rank + processes_per_node(task.resources))
    marks = timing.Marks(job_dir, f"rank-{rank}")
    marks.mark("wrapper", entered)
    with (
        log_path.open("ab", buffering=0) as log,
        RankLogs(job_dir, host, log, workers) as rank_logs,
    ):

        def note(message: str) -> None:
            log.write(f"tacc: {message}\n".encode())

        def on_signal(number: int) -> None:
            name = signal.Signals(number).name
            if number == signal.SIGUSR1:
                note("checkpoint signal (SIGUSR1) passed to the program")
            elif number in (signal.SIGTERM, signal.SIGINT):
                records.write_rank(job_dir, rank, terminated=True, signal=name)

        become_subreaper()
        forwarder = Forwarder(on_signal, workers_only=task.runtime["launcher"] == "torchrun")
        facts = {
            "host": host,
            "ip": ips[node_rank] if ips else "",
            "rdma": transport.local_rdma(config),
            **gpu_share_facts(task, config),
        }
        records.write_rank(job_dir, rank, **facts, state="PROVISIONING", pid=os.getpid())
        launch = Launch(
            task,
            rank,
            nodes,
            ips,
            job_id,
            program_env(task, base_env(job_dir, task)),
            job_dir=job_dir,
            config=config,
            node_rank=node_rank,
            local_rank=local_rank,
            wrappers=wrappers,
            facts=facts,
            node_features=lambda: node_features(host, config),
            agree=Agreement(job_dir, rank, wrappers, config.rendezvous_timeout_seconds),
        )
        before_plugins = dict(launch.env)
        try:
            for plugin in in_layer(cluster_plugins(task, config), "execute"):
                plugin.execute(launch)
        except AgentError as exc:  # a plug-in will not run the job as asked: why, no run
            note(str(exc))
            # Every rank (all decided alike): srun may stop the others once one exits.
            records.add_event(job_dir, "FAILED", exit_code=1, reason=str(exc))
            records.write_rank(job_dir, rank, state="EXITED", exit_code=1, ended=time.time())
            return 1
        # What the plug-ins set (an MPS share's limits, the transport's variables) wins
        # over a container image's own values, as the task's environment does.
        set_by_plugins = {k: v for k, v in launch.env.items() if before_plugins.get(k) != v}
        marks.mark("rendezvous")
        choice = launch.transport
        if rank == 0 and choice is not None:
            note(f"transport {choice.name}: {choice.reason}")
            if choice.warning:
                note(f"WARNING: {choice.warning}")
        env = launch.env
        if os.environ.get("TACC_VENV"):
            job_vars.activate(Path(os.environ["TACC_VENV"]), env)
        try:
            container = job_container(task, job_dir, config, over_image=set_by_plugins)
        except AgentError as exc:  # the batch step pulled the image: it is gone, or broken
            note(str(exc))
            records.write_rank(job_dir, rank, state="EXITED", exit_code=1, ended=time.time())
            return 1
        records.write_rank(job_dir, rank, state="RUNNING", started=time.time())
        if rank == 0:
            shaped = {k: v for k, v in launch.notes.items() if k != "transport"}
            warnings = [choice.warning] if choice and choice.warning else []
            records.add_event(
                job_dir,
                "RUNNING",
                nodes=nodes,
                transport=choice.name if choice else "none",
                **({"plugins": shaped} if shaped else {}),
                **({"warnings": warnings} if warnings else {}),
            )
        command = launch.command or (
            lambda line: ["bash", "-euo", "pipefail", "-c", with_modules(task, line)]
        )
        if container:
            runtime_user(env)
            command = in_container(command, container, task.runtime["launcher"])
        sink = first_output_marked(
            rank_logs.write if task.runtime["launcher"] == "torchrun" else log.write, marks
        )
        marks.mark("program")
        marks.save()
        code = 0
        for line in task.run:
            if forwarder.terminated:
                code = 128 + signal.SIGTERM
                break
            code = run_line(command(line), job_dir / "code", env, forwarder, sink)
            if code != 0 or forwarder.terminated:
                break
        if code != 0:
            note(f"exited {code}")
    records.write_rank(job_dir, rank, state="EXITED", exit_code=code, ended=time.time())
    return code
