"""Running a task's lines inside its container image: the binds a job gets and the
command line of the node's container runtime (agent setting `container_runtime`).

Every runtime has the one interface `command(rootfs, argv, cwd, binds, env) -> argv`:
the argv that runs `argv` in the directory image `rootfs`, in `cwd`, with `binds`
(host source -> container target) mounted and `env` (the image's own variables: PATH,
...) set over the environment the process inherits (the wrapper's: TACC_*, SLURM_*,
transport variables, OMPI_MCA_*, the task's environment.env). Secrets never go on the
command line: only the image's own variables (public, from its config) are passed
there, and for a GPU job the search paths PATH and LD_LIBRARY_PATH with the driver's
directories appended (the task's own value of one, when it sets it: a list of
directories, not a secret); everything else is inherited.

- Charliecloud (`ch-run`, Debian's charliecloud-runtime 0.31): TESTED in the lab, as the
  user (an unprivileged user namespace: no root inside that is root outside). ch-run
  execs the program (no process of its own stays), so signals to the process group
  reach the program as without a container; no PID namespace, so the processes are
  visible and stoppable on the node. Host /tmp, /dev, /proc, /sys and /etc/passwd are
  ch-run's own binds; $HOME is not mounted.
- Apptainer (`apptainer exec`) and Enroot (`enroot start`): the same interface, for
  production clusters; NOT TESTED here (neither is in Debian 12): argv builders from
  their documentation only.

Binds: the user's own directory (workspace/<user>: the job's files, TACC_WORKDIR) and
each dataset's cluster path, at the same paths as on the host, so every path the job
knows keeps its meaning; ops' extra binds (`container_binds`, default /shared) with the
workspace root masked by an empty private directory, so other users' directories are
not visible even where Unix permissions would allow it; Slurm's spool directory (the
PMIx server's sockets of `srun --mpi=pmix`). GPUs: the node's /dev comes in and Slurm's
cgroup limits it to the job's devices; CUDA_VISIBLE_DEVICES is inherited. The driver's
user-space files (libcuda, nvidia-smi, ...: they must match the node's kernel module, so
they cannot come from the image) come from the directory the nvidia_gpu role assembles
(agent setting `container_gpu_driver_dir`), bound at /usr/local/nvidia (read-only in
effect: root's files; ch-run 0.31 has no read-only bind option), the
place nvidia-docker 1.0 used and CUDA base images still put on PATH and LD_LIBRARY_PATH;
only for a job Slurm gave GPUs (SLURM_JOB_GPUS / SLURM_STEP_GPUS), on a node that has
the directory; its two search paths go after the task's own values too. NOT TESTED on a
real GPU.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import ClassVar, Protocol

from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected

MASK = ".mask"  # <userdir>/images/.mask: the empty view of the workspace root
# Where the node's NVIDIA driver directory appears in the container, and what of it goes
# at the end of the image's search paths (nvidia-docker 1.0's layout).
GPU_DRIVER_TARGET = "/usr/local/nvidia"
GPU_SEARCH_PATHS = {
    "PATH": f"{GPU_DRIVER_TARGET}/bin",
    "LD_LIBRARY_PATH": f"{GPU_DRIVER_TARGET}/lib64",
}
# Slurm's variables naming the GPUs it gave the job or step; "NoDevFiles": a Gres without
# devices. Not CUDA_VISIBLE_DEVICES: a user's shell may set it, and sbatch's
# --export=ALL brings it into the job whatever Slurm gave.
GPU_VARIABLES = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS")
NO_GPUS = ("", "NoDevFiles")
# The PATH of an image whose config sets none (the OCI/Docker default): never the node's.
# Where the node's tools a build step runs in the image are bound: a path of its own, so
# the bind hides nothing of the image's (a uv in /usr/local/bin would hide its python3).
TOOLS_TARGET = "/.tacc-tools"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Bind:
    source: str
    target: str


def tool_in_container(tool: Path) -> str:
    """Where the host tool `tool` is in a container whose job_binds got its folder in
    `tools` (bound at TOOLS_TARGET)."""
    return f"{TOOLS_TARGET}/{tool.name}"


def under(path: str, root: str) -> bool:
    """Whether path is root or below it (lexically: both are absolute, normalised)."""
    return (
        PurePosixPath(path) == PurePosixPath(root)
        or PurePosixPath(root) in PurePosixPath(path).parents
    )


class Runtime(Protocol):
    name: str
    # Variables the runtime's way of running needs set in the container, unless the task
    # sets them itself.
    defaults: dict[str, str]

    def command(
        self,
        rootfs: Path,
        argv: Sequence[str],
        cwd: Path,
        binds: Sequence[Bind],
        env: dict[str, str],
    ) -> list[str]: ...


class Charliecloud:
    """`ch-run` (Charliecloud 0.31): tested in the lab. Bind targets must exist in the
    image (a directory image is mounted read-only); the batch step makes the missing
    ones (job_binds' mount_points) before the first line runs."""

    name = "charliecloud"
    # Each ch-run is a user namespace of its own, so OpenMPI's shared-memory transport
    # cannot use CMA between two ranks of a node (it warns, then falls back): say so up
    # front instead of a warning per rank (Charliecloud's documentation does the same).
    defaults: ClassVar[dict[str, str]] = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}

    def __init__(self, binary: str = "ch-run") -> None:
        self.binary = binary

    def command(
        self,
        rootfs: Path,
        argv: Sequence[str],
        cwd: Path,
        binds: Sequence[Bind],
        env: dict[str, str],
    ) -> list[str]:
        return [
            self.binary,
            "--env-no-expand",  # the image's values as they are, no $ expansion
            *(f"--set-env={key}={value}" for key, value in sorted(env.items())),
            *(f"--bind={b.source}:{b.target}" for b in binds),
            f"--cd={cwd}",
            str(rootfs),
            "--",
            *argv,
        ]


class Apptainer:
    """`apptainer exec` on a sandbox (directory) image. NOT TESTED here (Apptainer is not
    in Debian 12): built from Apptainer's documentation. --no-home: the user's home stays
    out, as with ch-run; --containall is not used so /tmp and the environment pass as
    with ch-run."""

    name = "apptainer"
    defaults: ClassVar[dict[str, str]] = {}

    def __init__(self, binary: str = "apptainer") -> None:
        self.binary = binary

    def command(
        self,
        rootfs: Path,
        argv: Sequence[str],
        cwd: Path,
        binds: Sequence[Bind],
        env: dict[str, str],
    ) -> list[str]:
        return [
            self.binary,
            "exec",
            "--no-home",
            *(f"--env={key}={value}" for key, value in sorted(env.items())),
            *(f"--bind={b.source}:{b.target}" for b in binds),
            f"--pwd={cwd}",
            str(rootfs),
            *argv,
        ]


class Enroot:
    """`enroot start` (what Pyxis runs under `srun --container-image`). NOT TESTED here
    (Enroot is not in Debian 12): built from Enroot's documentation. Enroot starts a
    container by name from its data path (`enroot create` of the image first, which the
    role's documentation describes) or a directory; it has no working-directory option,
    so the line changes into `cwd` itself."""

    name = "enroot"
    # a user namespace each, as with ch-run
    defaults: ClassVar[dict[str, str]] = {"OMPI_MCA_btl_vader_single_copy_mechanism": "none"}

    def __init__(self, binary: str = "enroot") -> None:
        self.binary = binary

    def command(
        self,
        rootfs: Path,
        argv: Sequence[str],
        cwd: Path,
        binds: Sequence[Bind],
        env: dict[str, str],
    ) -> list[str]:
        enter = f'cd {shlex.quote(str(cwd))} && exec "$@"'
        return [
            self.binary,
            "start",
            *(f"--env={key}={value}" for key, value in sorted(env.items())),
            *(f"--mount={b.source}:{b.target}" for b in binds),
            str(rootfs),
            "sh",
            "-c",
            enter,
            "sh",
            *argv,
        ]


RUNTIMES: dict[str, type] = {"charliecloud": Charliecloud, "apptainer": Apptainer, "enroot": Enroot}


def runtime_named(name: str) -> Runtime:
    if name not in RUNTIMES:
        raise AgentError(
            f"container_runtime: expected one of {', '.join(RUNTIMES)}, not {name!r}", AGENT_CLUSTER
        )
    return RUNTIMES[name]()


@dataclass(frozen=True)
class JobBinds:
    """What a job's container sees of the host, and what must exist for it."""

    binds: list[Bind]
    # Targets to make as empty directories in the image (not below another bind).
    mount_points: list[str] = field(default_factory=list)
    # Directories to make in the mask (the user's own place in the masked workspace).
    mask_dirs: list[Path] = field(default_factory=list)
    # Directories to add at the end of the container's search paths {variable: dir}.
    search_paths: dict[str, str] = field(default_factory=dict)


# Characters the runtimes' bind syntax gives a meaning (SRC:DST, Apptainer's a,b lists).
BIND_SEPARATORS = (":", ",")


def bindable(path: str) -> str:
    """A dataset's cluster path as a bind: normalised, not the root, no separator."""
    normal = os.path.normpath(path)
    if normal == "/" or any(c in normal for c in BIND_SEPARATORS) or not normal.isprintable():
        raise Rejected(
            f"datasets: the cluster path {path!r} cannot be bound into the container "
            "(expected a directory below /, without ':' or ',')",
            "datasets",
        )
    return normal


def given_gpus(environ: Mapping[str, str]) -> bool:
    """Whether Slurm gave this job (or step) GPUs: SLURM_JOB_GPUS or SLURM_STEP_GPUS names
    some. CUDA_VISIBLE_DEVICES alone is no sign: the user's own shell may have set it."""
    return any(environ.get(name, "") not in NO_GPUS for name in GPU_VARIABLES)


def gpu_driver_source(directory: str | None) -> str | None:
    """The agent setting `container_gpu_driver_dir` as a bind source (None: unset)."""
    if not directory:
        return None
    normal = os.path.normpath(directory)
    if (
        not normal.startswith("/")
        or normal == "/"
        or not normal.isprintable()
        or any(c in normal for c in BIND_SEPARATORS)
    ):
        raise AgentError(
            f"container_gpu_driver_dir: expected an absolute directory below / without ':' "
            f"or ',', not {directory!r}",
            AGENT_CLUSTER,
        )
    return normal


def job_binds(
    user_dir: Path,
    workspace: str,
    datasets: Sequence[str],
    extra: Sequence[str],
    spool_dir: str,
    *,
    gpu_driver_dir: str | None = None,
    environ: Mapping[str, str] | None = None,
    tools: Sequence[str] = (),
) -> JobBinds:
    """The job's binds, in mount order: ops' extra binds that exist on this node, the
    mask over the workspace root when an extra bind shows it, the user's directory,
    the datasets' cluster paths, Slurm's spool directory, `tools` (a directory of the
    node's programs the batch step runs in the image: uv, to build a venv on top of
    it) at TOOLS_TARGET where it exists, and for a job given GPUs
    (`environ`'s Slurm variables, default the process's) the node's NVIDIA driver
    directory `gpu_driver_dir` at /usr/local/nvidia where it exists (its
    mount point is made in the image wherever the setting is on, so a node without the
    directory does not leave the image without it for the nodes that have one)."""
    datasets = [bindable(path) for path in datasets]
    driver = gpu_driver_source(gpu_driver_dir)
    gpus = driver is not None and given_gpus(os.environ if environ is None else environ)
    user = str(user_dir)
    root = str(PurePosixPath(workspace))
    mask = user_dir / "images" / MASK
    binds = [Bind(path, path) for path in extra if Path(path).is_dir()]
    masked = any(under(root, b.target) for b in binds)
    if masked:
        binds.append(Bind(str(mask), root))
    own = [user, *(d for d in datasets if not under(d, user))]
    binds += [Bind(path, path) for path in own]
    if spool_dir and Path(spool_dir).is_dir():
        binds.append(Bind(spool_dir, spool_dir))
    binds += [Bind(path, TOOLS_TARGET) for path in tools[:1] if Path(path).is_dir()]
    points, mask_dirs = [], []
    for index, bind in enumerate(binds):
        covering = [b for b in binds[:index] if under(bind.target, b.target)]
        if not covering:
            points.append(bind.target)
        elif covering[-1].source == str(mask) and bind.target != root:
            relative = PurePosixPath(bind.target).relative_to(root)
            mask_dirs.append(mask / relative)
    search_paths: dict[str, str] = {}
    if gpus:
        if not any(under(GPU_DRIVER_TARGET, b.target) for b in binds):
            points.append(GPU_DRIVER_TARGET)
        if driver is not None and Path(driver).is_dir():
            binds.append(Bind(driver, GPU_DRIVER_TARGET))
            search_paths = dict(GPU_SEARCH_PATHS)
    return JobBinds(binds, points, mask_dirs, search_paths)


def prepare_mask(job: JobBinds, mask: Path) -> None:
    """The mask: a private, otherwise empty directory holding only the user's own
    place(s) in the workspace root (each a mount point, never written)."""
    mask.mkdir(mode=0o700, parents=True, exist_ok=True)
    for directory in job.mask_dirs:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def container_env(
    image_env: dict[str, str],
    task_env: dict[str, str],
    runtime_defaults: dict[str, str] | None = None,
    search_paths: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The image's own variables (PATH of the image, not the node's) and the runtime's
    defaults, except those the task sets itself (environment.env wins, as it would on
    the node, and is inherited). Each of `search_paths` ({variable: directory}: the
    job's binds' JobBinds.search_paths) goes at the end of its variable unless already
    there: of the image's value, or of the task's own when the task sets the variable
    (then that value, a search path from the task's tcloud.yaml, is set here too)."""
    image = {"PATH": DEFAULT_PATH, **(runtime_defaults or {}), **image_env}
    env = {k: v for k, v in image.items() if k not in task_env}
    for variable, directory in (search_paths or {}).items():
        value = task_env[variable] if variable in task_env else image.get(variable, "")
        if directory not in value.split(":"):
            value = f"{value}:{directory}" if value else directory
        if variable in env or value != task_env.get(variable):
            env[variable] = value
    return env


@dataclass(frozen=True)
class Container:
    """One job's container: wrap(argv) is argv run inside it."""

    runtime: Runtime
    rootfs: Path
    binds: list[Bind]
    env: dict[str, str]
    cwd: Path
    image: str = ""  # the image's digest (hex) or build key: what a venv on it is keyed by

    def wrap(self, argv: Sequence[str]) -> list[str]:
        return self.runtime.command(self.rootfs, argv, self.cwd, self.binds, self.env)

    def wrap_line(self, line: str) -> str:
        """A shell line that runs `line` (bash) inside the container: for launchers that
        stay on the host and start each rank themselves (mpirun: its daemons come from
        srun on the node, each rank runs in the image)."""
        return shlex.join(self.wrap(["bash", "-euo", "pipefail", "-c", line]))
