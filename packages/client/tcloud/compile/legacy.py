"""Read the legacy Go tcloud's `tuxiv.conf` into a TaskSpec.

Mapping: entrypoint -> run; job.name -> name; job.general ("key=value", formerly
`#SBATCH --key=value`) -> resources (nodes, ntasks-per-node -> processes_per_node,
cpus-per-task, mem, time, partition, qos, account, gres=gpu:N) and the rest to
resources.sbatch; job.module -> modules; job.env ->
env; job.log -> outputs; environment.dependencies -> pip requirements (conda "name=ver"
becomes "name==ver"; a {pip: [...]} entry is taken as is; channels cannot be honoured
by pip and are reported); datasets (paths) -> local datasets. Legacy entry points
name their files as `${TACC_WORKDIR}/train.py`: TACC_WORKDIR was the uploaded code, so
such a task runs with `runtime.workdir: code` (TACC_WORKDIR = the job's code/).
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from tacc_contract.fields import Field, Validator, non_empty, pattern, relative_path
from tacc_contract.schema import (
    CODE,
    ENVIRONMENT,
    NAME,
    RESOURCES,
    RUNTIME,
    Dataset,
    TaskSpec,
    env_name,
    fill_defaults,
    sbatch_option,
)
from tcloud.errors import TaskFileError

LEGACY = {
    "entrypoint": Field("list[str]", required=True, check=non_empty),
    "environment": Field(
        "mapping",
        default={},
        children={
            "name": Field("str"),
            "channels": Field("list[str]", default=[]),
            "dependencies": Field("any", default=[]),
        },
    ),
    "job": Field(
        "mapping",
        required=True,
        children={
            "name": Field(
                "str", required=True, check=pattern(NAME, "a name of letters, digits, _.-")
            ),
            "general": Field("list[str]", default=[], expected="a list of key=value"),
            "module": Field("list[str]", default=[]),
            "env": Field("any", default={}),
            "log": Field("str", check=relative_path),
        },
    ),
    "datasets": Field("list[str]", default=[], expected="a list of paths"),
}
RESOURCE_KEYS = {
    "nodes": ("nodes", int),
    "cpus-per-task": ("cpus", int),
    # One process per task slot, as `#SBATCH --ntasks-per-node` meant for the legacy tool.
    "ntasks-per-node": ("processes_per_node", int),
    "mem": ("mem", str),
    "time": ("time", str),
    "partition": ("partition", str),
    "qos": ("qos", str),
    "account": ("account", str),
}


def general_to_resources(lines: list[str]) -> tuple[dict, list[str]]:
    """job.general lines to (resources, problems)."""
    resources: dict = {"sbatch": {}}
    problems = []
    for line in lines:
        key, sep, value = line.lstrip("-").partition("=")
        if not sep:
            problems.append(f"{line!r}: expected key=value")
        elif key == "gres" and (match := re.fullmatch(r"gpu(?::[\w-]+)?:(\d+)", value)):
            resources["gpus_per_node"] = int(match.group(1))
        elif key in RESOURCE_KEYS:
            name, kind = RESOURCE_KEYS[key]
            try:
                resources[name] = kind(value)
            except ValueError:
                problems.append(f"{line!r}: expected a number")
                continue
            # The same limits as tcloud.yaml's resources (nodes >= 1, a size, a time, ...).
            check = RESOURCES[name].check
            if check and (wanted := check(resources[name])):
                problems.append(f"{line!r}: expected {wanted}")
        elif wanted := sbatch_option(key):
            problems.append(f"{line!r}: expected {wanted}")
        else:
            resources["sbatch"][key] = value
    return resources, problems


def requirements_from(dependencies: object) -> list[str]:
    result = []
    for dep in dependencies if isinstance(dependencies, list) else []:
        if isinstance(dep, dict):
            result += [str(item) for item in dep.get("pip", [])]
        elif isinstance(dep, str) and not dep.startswith("python"):
            name, _, ver = dep.partition("=")
            result.append(f"{name}=={ver.lstrip('=')}" if ver else name)
    return result


def env_from(value: object) -> dict[str, str]:
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, list):
        return dict(str(item).partition("=")[::2] for item in value)
    return {}


def load_legacy(path: Path, root: yaml.Node) -> TaskSpec:
    validator = Validator(str(path))
    data = validator.mapping(root, LEGACY)
    job = data.get("job") or {}
    resources, general_problems = general_to_resources(job.get("general") or [])
    for message in general_problems:
        validator.problem(root, "job.general", message)
    for name in env_from(job.get("env")):
        if wanted := env_name(name):
            validator.problem(root, f"job.env.{name}", f"expected {wanted}")
    if validator.problems:
        raise TaskFileError(validator.problems)
    environment = data.get("environment") or {}
    return TaskSpec(
        name=job["name"],
        run=list(data["entrypoint"]),
        base_dir=path.resolve().parent,
        code=fill_defaults({}, CODE),
        resources=fill_defaults(resources, RESOURCES),
        environment=fill_defaults(
            {
                "requirements": requirements_from(environment.get("dependencies")),
                "modules": job.get("module") or [],
                "env": env_from(job.get("env")),
            },
            ENVIRONMENT,
        ),
        datasets=[Dataset(Path(p).name, local=p) for p in data.get("datasets") or []],
        outputs=[job["log"]] if job.get("log") else [],
        runtime=fill_defaults({"workdir": "code"}, RUNTIME),
    )
