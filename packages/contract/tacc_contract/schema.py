"""Layer 1, the task schema: `tcloud.yaml` read into a validated `TaskSpec`.

Every problem names the file, line, column, field and what is expected; unknown keys
are errors with a suggestion. docs/tcloud.md documents each field.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from tacc_contract import cpus_and_memory
from tacc_contract.errors import Problem, Rejected, TaskFileError
from tacc_contract.fields import (
    Field,
    Validator,
    at_least,
    between,
    non_empty,
    one_of,
    pattern,
    relative_path,
    shown,
    single_line,
)
from tacc_contract.images import EXPECTED as IMAGE_EXPECTED
from tacc_contract.images import image_reference
from tacc_contract.plugins import Plugin
from tacc_contract.registry import ENV, PluginError, check_words, in_layer, select
from tacc_contract.sbatch_options import why_refused

TASK_FILE = "tcloud.yaml"

NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
# Slurm partition, QoS and account names: one word, nothing a shell or sbatch would split.
SLURM_NAME = pattern(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}", "a Slurm name (letters, digits, _.+-)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE = re.compile(r"(\d+)([KMGT]?)")
_UNITS = {"": 1 << 20, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
# Slurm's time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S (sbatch --time).
_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
NICE_MAX = 2147483645  # sbatch --nice bound
MAX_PROCESSES_PER_NODE = 1024


def size_bytes(text: str) -> int:
    """Bytes in a size like 512M or 4G (no unit: MiB, as Slurm reads --mem)."""
    match = _SIZE.fullmatch(text)
    return int(match.group(1)) * _UNITS[match.group(2)] if match else 0


def positive_size(value: str) -> str | None:
    return None if size_bytes(value) > 0 else "a size > 0 like 4G or 512M"


def slurm_time(value: str) -> str | None:
    """None for a Slurm time limit > 0 (or UNLIMITED), else what is expected."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    match = _TIME.fullmatch(value)
    if not match:
        return "a Slurm time"
    days, first, *rest = match.groups()
    later = [int(part) for part in rest if part is not None]
    if any(part >= 60 for part in later) or (days is not None and int(first) >= 24):
        return "a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS) with fields in range"
    if int(days or 0) + int(first) + sum(later) == 0:
        # Slurm reads 0 as "no limit": the task must say UNLIMITED if that is meant.
        return "a Slurm time > 0 (or UNLIMITED)"
    return None


def env_name(key: str) -> str | None:
    return None if _ENV_NAME.fullmatch(key) else "a shell variable name ([A-Za-z_]\\w*)"


_PINNED = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_.,-]+\])?==[A-Za-z0-9.+!_-]+"
    r"( +--hash=sha256:[0-9a-f]{64})*"
)


# A direct reference as uv writes it in a lock: "name @ https://...whl" (no spaces).
_DIRECT = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_.,-]+\])? @ (https?|git\+\w+|file)://\S+"
)


def pinned_requirement(line: str) -> str | None:
    if _PINNED.fullmatch(line.strip()) or _DIRECT.fullmatch(line.strip()):
        return None
    return "a pinned requirement line: name==version or name @ URL"


def sbatch_option(key: str) -> str | None:
    """An extra sbatch option's name: never one the agent sets from the task's own
    fields or for itself, in any spelling sbatch reads (tacc_contract.sbatch_options)."""
    return why_refused(key)


CODE = {
    "workdir": Field("str", default="."),
    "include": Field("list[str]", default=["**"], each=relative_path),
    "exclude": Field("list[str]", default=[], each=relative_path),
}
RESOURCES = {
    "nodes": Field("int", default=1, check=at_least(1)),
    "gpus_per_node": Field("int", default=0, check=at_least(0)),
    # Processes per node: torchrun's --nproc-per-node, or the ranks srun/mpirun start on
    # each node (sbatch --ntasks-per-node). Unset: gpus_per_node, or 1 without GPUs.
    "processes_per_node": Field(
        "int",
        check=between(1, MAX_PROCESSES_PER_NODE),
        expected=f"processes per node (1 to {MAX_PROCESSES_PER_NODE})",
    ),
    # Unset: per GPU, the partition's DefCpuPerGPU / DefMemPerGPU for a task with whole
    # GPUs, else 1 CPU per process and 4G per node (tacc_contract.cpus_and_memory).
    "cpus": Field("int", check=at_least(1), expected="CPUs per task (>= 1)"),
    "mem": Field("str", check=positive_size, expected="a size like 4G or 512M"),
    "cpus_per_gpu": Field("int", check=at_least(1), expected="CPUs per GPU (>= 1)"),
    "mem_per_gpu": Field("str", check=positive_size, expected="a size like 64G or 512M"),
    # Unset: the cluster's default (tacc-agent default_time_limit, 01:00:00), or a
    # prediction from earlier runs (the duration plug-in).
    "time": Field("str", check=slurm_time, expected="a Slurm time"),
    "partition": Field("str", check=SLURM_NAME),
    "qos": Field("str", check=SLURM_NAME),
    "priority": Field("int", check=between(0, NICE_MAX), expected="a nice value >= 0"),
    "account": Field("str", check=SLURM_NAME),
    # The program saves a checkpoint at its checkpoint signal (SIGUSR1) and resumes from
    # it when started again: a scheduling policy (tiresias) may then checkpoint and
    # requeue it to run a job that comes first, as `tcloud halt` and `resume` would.
    "preemptible": Field("bool", default=False),
    "sbatch": Field(
        "map[str]", default={}, expected="extra sbatch options, name: value", keys=sbatch_option
    ),
}
ENVIRONMENT = {
    "requirements": Field(
        "list[str]", default=[], expected="pip requirement lines", each=single_line
    ),
    "modules": Field("list[str]", default=[], each=single_line),
    "env": Field("map[str]", default={}, keys=env_name),
    # Exact versions (name==version lines, as in a lock file): the environment is built
    # from these alone, with no resolution. `tcloud rerun` sets it from the past job's
    # lock; a task may set it too.
    "lock": Field(
        "list[str]",
        default=[],
        expected="pinned requirement lines (name==version)",
        each=pinned_requirement,
    ),
}
DATASET = {
    "name": Field("str", required=True, check=pattern(NAME, "a name of letters, digits, _.-")),
    "local": Field("str", check=single_line, expected="a local path to upload"),
    "cluster": Field("str", check=pattern(r"/.*", "an absolute path on the cluster")),
}
RUNTIME = {
    "launcher": Field("str", default="srun", check=one_of("srun", "torchrun", "mpirun", "none")),
    # What $TACC_WORKDIR names: the job's directory (code/, outputs/, logs/), or, as the
    # legacy Go tcloud did (tuxiv.conf files), the uploaded code itself.
    "workdir": Field("str", default="job", check=one_of("job", "code")),
    "transport": Field("str", default="auto", check=one_of("auto", "rdma", "tcp")),
    # Slurm's MPI plug-in for the job's srun steps (srun --mpi): `pmix` for MPI programs
    # started by launcher srun; `none` by default, so steps of non-MPI programs never
    # depend on PMIx.
    "mpi": Field("str", default="none", check=one_of("none", "pmix", "pmi2")),
}
MAX_SESSION_PORTS = 8
SESSION_PORTS_EXPECTED = (
    f"a list of at most {MAX_SESSION_PORTS} distinct port numbers (whole numbers 1 to 65535)"
)


def session_ports(value: object) -> str | None:
    """None for a list of at most 8 distinct whole numbers 1..65535 (or nothing), else
    what is expected and which entry is wrong."""
    if value is None:
        return None
    if not isinstance(value, list):
        return SESSION_PORTS_EXPECTED
    if len(value) > MAX_SESSION_PORTS:
        return f"{SESSION_PORTS_EXPECTED}; {len(value)} given"
    for i, port in enumerate(value):
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            return f"{SESSION_PORTS_EXPECTED}; entry {i} is {port!r}"
        if port in value[:i]:
            return f"{SESSION_PORTS_EXPECTED}; {port} appears twice"
    return None


IDLE_TIMEOUT_EXPECTED = "a Slurm time (30 = 30 minutes, 1:00:00, 0:20 = 20 s) or 0 for never"


def idle_timeout(value: str) -> str | None:
    """None for "0" (never idle-stopped) or a Slurm time > 0, else what is expected."""
    if value.strip() == "0" or not slurm_time(value):
        return None
    return IDLE_TIMEOUT_EXPECTED


# An interactive session (docs/interactive.md): a job the user shells into and forwards
# ports to, cancelled by the agent's idle watchdog (tacc_agent.tasks.interactive.idle) once nothing
# has used it for idle_timeout.
SESSION = {
    "ports": Field("any", default=[], check=session_ports, expected=SESSION_PORTS_EXPECTED),
    "idle_timeout": Field("str", default="30", check=idle_timeout, expected=IDLE_TIMEOUT_EXPECTED),
    "stop_on_disconnect": Field("bool", default=False),
}
TASK = {
    "name": Field("str", required=True, check=pattern(NAME, "a name of letters, digits, _.-")),
    "code": Field("mapping", default={}, children=CODE),
    "resources": Field("mapping", default={}, children=RESOURCES),
    "environment": Field("mapping", default={}, children=ENVIRONMENT),
    "datasets": Field("list[mapping]", default=[], children=DATASET),
    # A container image the setup and run lines run in (docs/containers.md): a registry
    # reference, resolved to its digest at submit, or {build: PATH}, a build file in the
    # task directory, built on the cluster (check_image_value reads both). It holds the
    # task's software, so it does not go with environment.requirements, lock or modules
    # (check_image).
    "image": Field("any"),
    "setup": Field("list[str]", default=[], expected="a list of shell lines"),
    "run": Field("list[str]", required=True, check=non_empty, expected="a list of shell lines"),
    "outputs": Field(
        "list[str]", default=[], expected="a list of paths or globs", each=relative_path
    ),
    "runtime": Field("mapping", default={}, children=RUNTIME),
    # Absent: an ordinary job; present (even empty): an interactive session.
    "session": Field("mapping", children=SESSION),
    "plugins": Field(
        "list[str]",
        default=[],
        expected="plug-ins for this task: name or +name turns one on, -name off",
        each=lambda word: check_words([word]),
    ),
}


@dataclass(frozen=True)
class Dataset:
    name: str
    local: str | None = None
    cluster: str | None = None


@dataclass(frozen=True)
class TaskSpec:
    """A validated task. `base_dir` is where relative local paths start."""

    name: str
    run: list[str]
    base_dir: Path
    code: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    environment: dict = field(default_factory=dict)
    datasets: list[Dataset] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    runtime: dict = field(default_factory=dict)
    # The container image (tacc_contract.images), None: the node's own system.
    image: str | None = None
    # An image built from a build file (tacc_contract.buildfile), None: none. From
    # tcloud.yaml: {"build": PATH}; from an instruction: {"file", "context", "base", "key"}.
    image_build: dict | None = None
    # The task's own plug-in words, and the top-level fields plug-ins added (sweep, ...).
    plugins: list[str] = field(default_factory=list)
    extensions: dict = field(default_factory=dict)
    # An interactive session's settings (SESSION, defaults filled), None: an ordinary job.
    session: dict | None = None


def processes_per_node(resources: dict) -> int:
    """The task's processes per node: its own setting, else one per GPU (a GPU share
    counts as one), else 1."""
    if resources.get("processes_per_node"):
        return int(resources["processes_per_node"])
    gpus = resources.get("gpus_per_node") or 0
    return max(int(gpus), 1)


def task_fields(plugins: Iterable[Plugin]) -> dict[str, Field]:
    """The task's field table with the fields of `plugins` added or put in place of a
    built-in one ("resources.nodes")."""
    table = dict(TASK)
    for plugin in plugins:
        for path, spec in plugin.fields.items():
            section, _, name = path.rpartition(".")
            if not section:
                table[name] = spec
                continue
            parent = table.get(section)
            if parent is None:  # its section's plug-in is off: the field has no place
                continue
            table[section] = replace(parent, children={**parent.children, name: spec})
    return table


def fill_defaults(value: dict | None, fields: dict[str, Field]) -> dict:
    value = value or {}
    return {key: value.get(key, spec.default) for key, spec in fields.items()}


def read_text(path: Path) -> str:
    """A task file's text; a file that is unreadable or not UTF-8 is a TaskFileError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TaskFileError([Problem(str(path), 0, 0, "", exc.strerror or str(exc))]) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        byte = data[exc.start : exc.start + 1].hex()
        message = f"not UTF-8 text: byte 0x{byte} cannot be decoded; save the file as UTF-8"
        raise TaskFileError([Problem(str(path), line, column, "", message)]) from None


def compose(path: Path) -> yaml.Node | None:
    text = read_text(path)
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        message = f"not valid YAML: {exc.problem or exc.context}"
        raise TaskFileError([Problem(str(path), line, column, "", message)]) from None
    except yaml.reader.ReaderError as exc:  # a control character: no mark, a position
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        character = chr(exc.character) if isinstance(exc.character, int) else exc.character
        message = f"not valid YAML: control character {character!r} is not allowed"
        raise TaskFileError([Problem(str(path), line, column, "", message)]) from None


def child(node: yaml.Node, key: str) -> yaml.Node | None:
    """The value node of `key` in a mapping node, if there is one."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node
    return None


def spec_from(data: dict, base_dir: Path, table: dict[str, Field] = TASK) -> TaskSpec:
    return TaskSpec(
        name=data["name"],
        run=list(data["run"] or []),
        base_dir=base_dir,
        code=fill_defaults(data["code"], CODE),
        resources=fill_defaults(data["resources"], table["resources"].children),
        environment=fill_defaults(data["environment"], ENVIRONMENT),
        datasets=[Dataset(d["name"], d["local"], d["cluster"]) for d in data["datasets"] or []],
        setup=list(data["setup"] or []),
        outputs=list(data["outputs"] or []),
        runtime=fill_defaults(data["runtime"], RUNTIME),
        image=image if isinstance(image := data.get("image"), str) else None,
        image_build=data.get("image_build") or (image if isinstance(image, dict) else None),
        plugins=list(data.get("plugins") or []),
        extensions={key: data.get(key) for key in table if key not in TASK and key not in CLUSTER},
        session=session_of(data.get("session")),
    )


def session_of(value: dict | None) -> dict | None:
    """The session settings with defaults filled (ports a fresh list), None when absent."""
    if value is None:
        return None
    session = fill_defaults(value, SESSION)
    session["ports"] = list(session["ports"] or [])
    return session


def check_datasets(validator: Validator, node: yaml.Node, data: dict) -> None:
    names = set()
    for i, dataset in enumerate(data["datasets"] or []):
        where = f"datasets[{i}]"
        if (dataset.get("local") is None) == (dataset.get("cluster") is None):
            validator.problem(node, where, "expected exactly one of 'local' or 'cluster'")
        if dataset.get("name") in names:
            validator.problem(node, f"{where}.name", f"{dataset['name']!r} is used twice")
        names.add(dataset.get("name"))


SESSION_TIME_REFUSED = (
    "a session needs a time limit (UNLIMITED is refused); set resources.time, e.g. 8:00:00, "
    "or leave it out for the cluster's default"
)


def check_session(validator: Validator, root: yaml.Node, data: dict, prefix: str = "") -> None:
    """A session always ends: its job may not ask for no time limit (a forgotten session
    would hold its nodes for ever); a missing time takes the cluster's default."""
    if data.get("session") is None:
        return
    limit = str((data.get("resources") or {}).get("time") or "")
    if limit.strip().upper() in ("UNLIMITED", "INFINITE"):
        name = "resources.time"
        validator.problem(node_at(root, name), f"{prefix}{name}", SESSION_TIME_REFUSED)


def check_cpus_and_memory(
    validator: Validator, root: yaml.Node, data: dict, prefix: str = ""
) -> None:
    """cpus_per_gpu and mem_per_gpu need whole GPUs and go instead of cpus and mem."""
    resources = data.get("resources") or {}
    for name, message in cpus_and_memory.conflicts(resources):
        field = f"resources.{name}"
        validator.problem(node_at(root, field), f"{prefix}{field}", message)


# The environment fields that do not go with an image: Lmod modules are the node's
# software, which a container does not see. Requirements (and a rerun's lock) do: a venv
# built in the image, on top of its Python (issue [24]).
IMAGE_EXCLUDES = ("modules",)
BUILD_PATH_EXPECTED = (
    "a path relative to the task directory, without '..' (and not absolute): a build file, "
    "or a directory holding Containerfile or Dockerfile"
)


def build_path(value: str) -> str | None:
    if not value.strip() or "\n" in value or relative_path(value):
        return BUILD_PATH_EXPECTED
    return None


IMAGE_BUILD = {"build": Field("str", required=True, check=build_path, expected=BUILD_PATH_EXPECTED)}
# The task's fields only an instruction has: what tcloud compiled (a built image's file,
# context, pinned base and key; tacc_contract.buildfile).
IMAGE_BUILD_KEY = r"sha256:[0-9a-f]{64}"
CLUSTER = {
    "image_build": Field(
        "mapping",
        children={
            "file": Field("str", required=True, check=build_path, expected=BUILD_PATH_EXPECTED),
            "context": Field("str", default="", check=relative_path),
            "base": Field("str", required=True, check=image_reference, expected=IMAGE_EXPECTED),
            # Only with the base pinned (tcloud's dry run has neither): check_pinned.
            "key": Field("str", check=pattern(IMAGE_BUILD_KEY, "sha256:<64 hex>")),
        },
    ),
}


def check_image_value(
    validator: Validator, root: yaml.Node, data: dict, prefix: str = "", builds: bool = True
) -> None:
    """`image`: a registry reference, or (`builds`, a task file's) {build: PATH}. Leaves
    data["image"] the checked value: the reference, the mapping, or None after a problem."""
    node, name = child(root, "image"), f"{prefix}image"
    if node is None or data.get("image") is None:
        return
    data["image"] = None
    if isinstance(node, yaml.MappingNode):
        keys = {key.value for key, _ in node.value if isinstance(key, yaml.ScalarNode)}
        if not builds or "build" not in keys:
            where = " without 'build' (a build file is image: {build: PATH})" if builds else ""
            validator.problem(node, name, f"expected {IMAGE_EXPECTED}, got a mapping{where}")
            return
        before = len(validator.problems)
        value = validator.mapping(node, IMAGE_BUILD, prefix=f"{name}.")
        data["image"] = value if len(validator.problems) == before else None
        return
    if not isinstance(node, yaml.ScalarNode):
        validator.problem(node, name, f"expected {IMAGE_EXPECTED}, got {shown(node)}")
        return
    text = node.value
    if image_reference(text):
        validator.problem(node, name, f"expected {IMAGE_EXPECTED}, got {text!r}")
        return
    data["image"] = text


def check_image(validator: Validator, root: yaml.Node, data: dict, prefix: str = "") -> None:
    """Lmod modules (the node's software) do not go with an image: build what they give
    into the image. Python requirements do (a venv on top of the image's Python)."""
    if not data.get("image") and not data.get("image_build"):
        return
    environment = data.get("environment") or {}
    for key in IMAGE_EXCLUDES:
        if environment.get(key):
            name = f"environment.{key}"
            validator.problem(
                node_at(root, name),
                f"{prefix}{name}",
                "not with 'image': modules are the node's software, which the container "
                "does not see (build it into the image; Python packages may go in "
                "environment.requirements, installed on top of the image)",
            )


def validated(path: Path, root: yaml.Node, selection: list[str]) -> TaskSpec:
    """A tcloud.yaml's TaskSpec: its fields, then the checks of its schema plug-ins."""
    plugins = task_plugins(path, root, selection)
    validator = Validator(str(path))
    table = task_fields(plugins)
    data = validator.mapping(root, table)
    if isinstance(root, yaml.MappingNode):
        check_datasets(validator, child(root, "datasets") or root, data)
        check_image_value(validator, root, data)
        check_image(validator, root, data)
        check_session(validator, root, data)
        check_cpus_and_memory(validator, root, data)
    if not validator.problems:
        # Plug-ins see every section with its defaults filled in.
        for section in ("code", "resources", "environment", "runtime"):
            data[section] = fill_defaults(data[section], table[section].children)
        for plugin in in_layer(plugins, "schema"):
            try:
                plugin.check(
                    data,
                    lambda name, message: validator.problem(node_at(root, name), name, message),
                )
            except Rejected as exc:  # a plug-in that refuses instead of naming a problem
                validator.problem(node_at(root, exc.field), exc.field, str(exc))
    if validator.problems:
        raise TaskFileError(validator.problems)
    return spec_from(data, path.resolve().parent, table)


def field_position(path: Path, dotted: str) -> tuple[int, int]:
    """Line and column of a dotted field's value in the task file at `path` (or of the
    nearest field that exists); (0, 0) when there is no such file to point into, or it
    cannot be read again."""
    if not path.is_file():
        return 0, 0
    try:
        root = compose(path)
    except TaskFileError:
        return 0, 0
    if root is None:
        return 0, 0
    mark = node_at(root, dotted).start_mark
    return mark.line + 1, mark.column + 1


def node_at(root: yaml.Node, dotted: str) -> yaml.Node:
    """The node of a dotted field (resources.nodes, datasets[0].local), or the nearest
    one that exists."""
    node = root
    for key in dotted.split("."):
        name, _, index = key.partition("[")
        below = child(node, name)
        if below is None:
            break
        node = below
        position = index.rstrip("]")
        if isinstance(node, yaml.SequenceNode) and position.isdigit():
            if int(position) >= len(node.value):
                break
            node = node.value[int(position)]
    return node


def task_plugins(path: Path, root: yaml.Node, selection: list[str]) -> list[Plugin]:
    """The plug-ins on for this task file: its `plugins:` words come after `selection`."""
    validator = Validator(str(path))
    node = child(root, "plugins")
    words = validator.value(node, TASK["plugins"], "plugins") if node is not None else []
    if validator.problems:
        raise TaskFileError(validator.problems)
    try:
        return select(selection, task=words or [])
    except PluginError as exc:
        # The word's own line when it is in the file; else ($TACC_PLUGINS) the file's top.
        items = node.value if isinstance(node, yaml.SequenceNode) else []
        found = [(i, item) for i, item in enumerate(items) if item.value == exc.word]
        name, where = (f"plugins[{found[0][0]}]", found[0][1]) if found else ("plugins", root)
        if not found and exc.word in selection:
            name = f"plugins (${ENV})"
        mark = where.start_mark
        raise TaskFileError(
            [Problem(str(path), mark.line + 1, mark.column + 1, name, str(exc))]
        ) from None
