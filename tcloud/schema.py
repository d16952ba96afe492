"""Layer 1, the task schema: `tcloud.yaml` read into a validated `TaskSpec`.

Every problem names the file, line, column, field and what is expected; unknown keys
are errors with a suggestion. docs/tcloud.md documents each field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tcloud.errors import Problem, TaskFileError
from tcloud.fields import Field, Validator, at_least, non_empty, one_of, pattern

TASK_FILE = "tcloud.yaml"
LEGACY_FILE = "tuxiv.conf"

SLURM_TIME = r"(\d+-)?\d+(:\d{1,2}){0,2}|\d+-\d+|UNLIMITED|INFINITE"
NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

CODE = {
    "workdir": Field("str", default="."),
    "include": Field("list[str]", default=["**"]),
    "exclude": Field("list[str]", default=[]),
}
RESOURCES = {
    "nodes": Field("int", default=1, check=at_least(1)),
    "gpus_per_node": Field("int", default=0, check=at_least(0)),
    "cpus": Field("int", default=1, check=at_least(1), expected="CPUs per task (>= 1)"),
    "mem": Field("str", default="4G", check=pattern(r"\d+[KMGT]?", "a size like 4G or 512M")),
    "time": Field("str", default="01:00:00", check=pattern(SLURM_TIME, "a Slurm time")),
    "partition": Field("str"),
    "qos": Field("str"),
    "priority": Field("int", check=at_least(0), expected="a nice value >= 0"),
    "account": Field("str"),
    "sbatch": Field("map[str]", default={}, expected="extra sbatch options, name: value"),
}
ENVIRONMENT = {
    "requirements": Field("list[str]", default=[], expected="pip requirement lines"),
    "modules": Field("list[str]", default=[]),
    "env": Field("map[str]", default={}),
}
DATASET = {
    "name": Field("str", required=True, check=pattern(NAME, "a name of letters, digits, _.-")),
    "local": Field("str", expected="a local path to upload"),
    "cluster": Field("str", check=pattern(r"/.*", "an absolute path on the cluster")),
}
RUNTIME = {
    "launcher": Field("str", default="srun", check=one_of("srun", "torchrun", "mpirun", "none")),
    "transport": Field("str", default="auto", check=one_of("auto", "rdma", "tcp")),
}
TASK = {
    "name": Field("str", required=True, check=pattern(NAME, "a name of letters, digits, _.-")),
    "code": Field("mapping", default={}, children=CODE),
    "resources": Field("mapping", default={}, children=RESOURCES),
    "environment": Field("mapping", default={}, children=ENVIRONMENT),
    "datasets": Field("list[mapping]", default=[], children=DATASET),
    "setup": Field("list[str]", default=[], expected="a list of shell lines"),
    "run": Field("list[str]", required=True, check=non_empty, expected="a list of shell lines"),
    "outputs": Field("list[str]", default=[], expected="a list of paths or globs"),
    "runtime": Field("mapping", default={}, children=RUNTIME),
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


def fill_defaults(value: dict | None, fields: dict[str, Field]) -> dict:
    value = value or {}
    return {key: value.get(key, spec.default) for key, spec in fields.items()}


def compose(path: Path) -> yaml.Node | None:
    try:
        text = path.read_text()
    except OSError as exc:
        raise TaskFileError([Problem(str(path), 0, 0, "", exc.strerror or str(exc))]) from None
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (0, 0)
        message = f"not valid YAML: {exc.problem or exc.context}"
        raise TaskFileError([Problem(str(path), line, column, "", message)]) from None


def child(node: yaml.Node, key: str) -> yaml.Node | None:
    """The value node of `key` in a mapping node, if there is one."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node
    return None


def check_env_names(validator: Validator, root: yaml.Node) -> None:
    env = child(child(root, "environment") or root, "env")
    for key_node, _ in env.value if isinstance(env, yaml.MappingNode) else []:
        if not _ENV_NAME.fullmatch(str(key_node.value)):
            name = f"environment.env.{key_node.value}"
            validator.problem(key_node, name, "expected a shell variable name ([A-Za-z_]\\w*)")


def spec_from(data: dict, base_dir: Path) -> TaskSpec:
    return TaskSpec(
        name=data["name"],
        run=list(data["run"] or []),
        base_dir=base_dir,
        code=fill_defaults(data["code"], CODE),
        resources=fill_defaults(data["resources"], RESOURCES),
        environment=fill_defaults(data["environment"], ENVIRONMENT),
        datasets=[Dataset(d["name"], d["local"], d["cluster"]) for d in data["datasets"] or []],
        setup=list(data["setup"] or []),
        outputs=list(data["outputs"] or []),
        runtime=fill_defaults(data["runtime"], RUNTIME),
    )


def check_datasets(validator: Validator, node: yaml.Node, data: dict) -> None:
    names = set()
    for i, dataset in enumerate(data["datasets"] or []):
        where = f"datasets[{i}]"
        if (dataset.get("local") is None) == (dataset.get("cluster") is None):
            validator.problem(node, where, "expected exactly one of 'local' or 'cluster'")
        if dataset.get("name") in names:
            validator.problem(node, f"{where}.name", f"{dataset['name']!r} is used twice")
        names.add(dataset.get("name"))


def load_task(path: Path) -> TaskSpec:
    """Read and validate a task file (tcloud.yaml, or a legacy tuxiv.conf)."""
    root = compose(path)
    if root is None:
        raise TaskFileError([Problem(str(path), 1, 1, "", "empty file; `tcloud init` writes one")])
    if path.name == LEGACY_FILE:
        from tcloud.legacy import load_legacy

        return load_legacy(path, root)
    validator = Validator(str(path))
    data = validator.mapping(root, TASK)
    if isinstance(root, yaml.MappingNode):
        check_env_names(validator, root)
        check_datasets(validator, child(root, "datasets") or root, data)
    if validator.problems:
        raise TaskFileError(validator.problems)
    return spec_from(data, path.resolve().parent)


def find_task_file(path: Path | None) -> Path:
    """PATH itself, or tcloud.yaml / tuxiv.conf in PATH (a directory, default: here)."""
    path = path or Path(".")
    if path.is_dir():
        for name in (TASK_FILE, LEGACY_FILE):
            if (path / name).is_file():
                return path / name
        problem = Problem(str(path / TASK_FILE), 0, 0, "", "no task file; `tcloud init` writes one")
        raise TaskFileError([problem])
    return path
