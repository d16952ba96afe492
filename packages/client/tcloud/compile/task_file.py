"""A task file on the researcher's machine: found (tcloud.yaml or a legacy
tuxiv.conf), read and validated with the contract's schema (tacc_contract.schema), and
its local paths checked (inside its directory, never a place of secrets)."""

from __future__ import annotations

from pathlib import Path

import yaml

from tacc_contract.errors import Problem, TaskFileError
from tacc_contract.fields import Validator
from tacc_contract.registry import from_env
from tacc_contract.schema import TASK_FILE, TaskSpec, compose, node_at, validated
from tcloud.compile import local_paths
from tcloud.compile.legacy import load_legacy

LEGACY_FILE = "tuxiv.conf"


def load_task(
    path: Path, selection: list[str] | None = None, allow_outside: bool = False
) -> TaskSpec:
    """Read and validate a task file (tcloud.yaml, or a legacy tuxiv.conf) with the
    schema plug-ins that are on: the defaults, then `selection` (default: $TACC_PLUGINS),
    then the task's own `plugins:` words. Its local paths must be inside its directory
    unless `allow_outside`, and never a place of secrets (tcloud.compile.local_paths)."""
    try:
        return _load_task(path, from_env() if selection is None else selection, allow_outside)
    except RecursionError:
        message = "nested too deeply to be a task file"
        raise TaskFileError([Problem(str(path), 0, 0, "", message)]) from None


def _load_task(path: Path, selection: list[str], allow_outside: bool) -> TaskSpec:
    root = compose(path)
    if root is None:
        raise TaskFileError([Problem(str(path), 1, 1, "", "empty file; `tcloud init` writes one")])
    legacy = path.name == LEGACY_FILE
    task = load_legacy(path, root) if legacy else validated(path, root, selection)
    check_local_paths(path, root, task, allow_outside)
    return task


def local_path_fields(task: TaskSpec) -> list[tuple[str, str]]:
    """(field, path as written) of every local path the task uploads from."""
    found = [("code.workdir", str(task.code["workdir"]))]
    for i, dataset in enumerate(task.datasets):
        if dataset.local is not None:
            found.append((f"datasets[{i}].local", dataset.local))
    return found


def check_local_paths(path: Path, root: yaml.Node, task: TaskSpec, allow_outside: bool) -> None:
    validator = Validator(str(path))
    for name, text in local_path_fields(task):
        if why := local_paths.problem(task.base_dir, text, allow_outside):
            validator.problem(node_at(root, name), name, why)
    if validator.problems:
        raise TaskFileError(validator.problems)


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
