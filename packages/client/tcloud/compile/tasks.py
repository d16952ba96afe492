"""The tasks the SDK takes, before any cluster: a task file (or its directory) or a dict
with the fields of tcloud.yaml, read and validated with the contract's schema, checked
as the cluster will read it (sbatch options, sweep) and compiled. `validate` and
`dry_run` are the SDK's; `tcloud validate` and `tcloud submit --dry-run` print them.

A dict task's problems name the field as a file's do, with `task` where a file's path
and line would be (`task: resources.nodes: expected a node count >= 1, got 0`); its
local paths (code.workdir, datasets[].local) are relative to `base_dir`, which it must
name (the current directory is not assumed) and which is also the code directory it
uploads unless code.workdir says otherwise.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from tacc_contract.errors import Problem, Rejected, TaskFileError
from tacc_contract.instruction import parse
from tacc_contract.registry import from_env
from tacc_contract.sbatch import ClusterDefaults, sbatch_argv
from tacc_contract.schema import TASK_FILE, TaskSpec, validated
from tacc_contract.trials import planned_count
from tcloud.compile import local_paths
from tcloud.compile.compiler import ImageResolver, Instruction, compile_task
from tcloud.compile.task_file import (
    LEGACY_FILE,
    check_local_paths,
    find_task_file,
    load_task,
    local_path_fields,
)
from tcloud.errors import UsageError
from tcloud.transfer.hashcache import HashCache
from tcloud.transfer.manifest import shown

# A task as the SDK takes it: a task file or its directory, or tcloud.yaml's fields.
TaskLike = str | os.PathLike[str] | Mapping[str, Any]
DICT_SOURCE = "task"  # where a dict task's problems say they are
# What validate and a dry run say of a task's image: they do not connect, so the
# reference stays as written (and the digest differs from the one submit sends).
IMAGE_AT_SUBMIT = "as written; resolved to a digest at submit"


@dataclass(frozen=True)
class Task:
    """A task read and validated here: where it came from and what it says."""

    source: str  # the task file's path, or "task" for a dict
    spec: TaskSpec

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class DryRun:
    """What a submit would send, with no cluster contacted."""

    digest: str
    files: int
    bytes: int
    sbatch: list[str]  # as the cluster builds it, before its scheduling plug-ins
    instruction: dict
    outside_paths: list[str]

    def as_dict(self) -> dict:
        return asdict(self)


def existing(path: str | os.PathLike[str], what: str = "path") -> Path:
    """A path the user named that must be there: UsageError (exit 2) when it is not."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise UsageError(f"{what} {shown(path)}: no such file or directory")
    return path


def read(
    task: TaskLike, *, base_dir: str | os.PathLike[str] | None = None, allow_outside: bool = False
) -> Task:
    """The task read and validated with the schema (file, line and field in every
    problem); its local paths inside its directory unless `allow_outside`."""
    if isinstance(task, Mapping):
        if base_dir is None:
            # Not the current directory by default: from a notebook or a project's root
            # that would upload everything under it.
            raise UsageError(
                "a dict task needs base_dir: the directory its code and local paths are "
                "relative to (an empty one when it needs no files)"
            )
        return from_dict(task, existing(base_dir, "base_dir"), allow_outside)
    if not isinstance(task, str | os.PathLike):
        raise UsageError(
            "a task is a task file, its directory or a dict of its fields, got "
            f"{type(task).__name__}"
        )
    path = find_task_file(existing(task))
    return Task(str(path), load_task(path, allow_outside=allow_outside))


def plain(value: Any) -> Any:
    """A dict task's values as YAML can write them: paths as text, tuples as lists."""
    if isinstance(value, Mapping):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def unpositioned(error: TaskFileError) -> TaskFileError:
    """A dict task's problems: the field and what is expected, no file or line."""
    return TaskFileError([replace(p, path=DICT_SOURCE, line=0, column=0) for p in error.problems])


def from_dict(data: Mapping[str, Any], base_dir: Path, allow_outside: bool) -> Task:
    """A dict with tcloud.yaml's fields, checked by the same schema as a file."""
    try:
        text = yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError) as exc:
        detail = "nested too deeply" if isinstance(exc, RecursionError) else str(exc).split("\n")[0]
        problem = Problem(DICT_SOURCE, 0, 0, "", f"not a task of plain values: {detail}")
        raise TaskFileError([problem]) from None
    path = base_dir.resolve() / TASK_FILE  # where its local paths are relative to
    try:
        spec = validated(path, root, from_env())
        check_local_paths(path, root, spec, allow_outside)
    except TaskFileError as exc:
        raise unpositioned(exc) from None
    return Task(DICT_SOURCE, spec)


def local_sbatch(task: Task, spec: TaskSpec) -> list[str]:
    """The sbatch line as the cluster will build it: sbatch options a task may not set
    are refused here, before anything is uploaded (exit 3)."""
    try:
        return sbatch_argv(spec, Path("$TACC_WORKDIR"), ClusterDefaults())
    except Rejected as exc:
        raise TaskFileError([Problem(task.source, 0, 0, exc.field, str(exc))]) from None


def unhashed(_path: Path, _stat: os.stat_result) -> str:
    """A hasher for checks that need the manifest's files but not their contents."""
    return ""


def sbatch_line(task: Task) -> list[str]:
    """Everything submit refuses before connecting: the task's sbatch options as written
    and after the compile passes (exit 3). The sbatch line as the cluster will read the
    task (after the compile passes, which do not depend on the files' contents)."""
    local_sbatch(task, task.spec)
    document = compile_task(task.spec, unhashed, source=task.source).document
    compiled = parse(json.dumps(document), "instruction")
    return local_sbatch(task, compiled)


def check_sweep(task: Task, sweep: bool) -> int:
    """A sweep can start many jobs: it runs only when asked for (--sweep, sweep=True).
    Returns how many trials it has."""
    trials = planned_count((task.spec.extensions or {}).get("sweep") or {})
    if trials and not sweep:
        message = (
            f"this task is a sweep of {trials} trial(s); submit it with --sweep to run them "
            "(one Slurm job array), or remove the sweep section"
        )
        raise TaskFileError([Problem(task.source, 0, 0, "sweep", message)])
    if sweep and not trials:
        message = "--sweep given, but the task file has no sweep section"
        raise TaskFileError([Problem(task.source, 0, 0, "", message)])
    return trials


def validate(
    task: TaskLike, *, base_dir: str | os.PathLike[str] | None = None, allow_outside: bool = False
) -> Task:
    """The task, checked as `tcloud validate` does: schema, local paths, sbatch options.
    TaskFileError (exit 3) names every problem's field."""
    checked = read(task, base_dir=base_dir, allow_outside=allow_outside)
    sbatch_line(checked)
    return checked


def prepare(
    task: TaskLike,
    *,
    sweep: bool = False,
    base_dir: str | os.PathLike[str] | None = None,
    allow_outside: bool = False,
) -> tuple[Task, list[str]]:
    """What submit checks before connecting, in its order: the task, its sweep flag,
    its sbatch line (returned with it)."""
    checked = read(task, base_dir=base_dir, allow_outside=allow_outside)
    check_sweep(checked, sweep)
    return checked, sbatch_line(checked)


def compiled(task: Task, resolve_image: ImageResolver | None = None) -> Instruction:
    """The instruction to upload, its files hashed through the local hash cache; its
    image (when it names one) pinned by `resolve_image` (the cluster's answer)."""
    with HashCache() as hasher:
        return compile_task(task.spec, hasher, resolve_image=resolve_image, source=task.source)


def dry_run(
    task: TaskLike,
    *,
    sweep: bool = False,
    base_dir: str | os.PathLike[str] | None = None,
    allow_outside: bool = False,
) -> DryRun:
    """The digest, files, sbatch line and instruction a submit would send; no cluster."""
    checked, sbatch = prepare(task, sweep=sweep, base_dir=base_dir, allow_outside=allow_outside)
    instruction = compile_task(checked.spec, source=checked.source)
    return DryRun(
        digest=instruction.digest,
        files=len(instruction.manifest),
        bytes=sum(entry.size for entry in instruction.manifest.values()),
        sbatch=sbatch,
        instruction=instruction.document,
        outside_paths=outside_paths(checked.spec),
    )


def outside_paths(spec: TaskSpec) -> list[str]:
    """The local paths the task uploads from outside its directory (allow_outside)."""
    texts = [text for _, text in local_path_fields(spec)]
    return [str(path) for path in local_paths.outside(spec.base_dir, texts)]


def with_sweep(
    task: TaskLike,
    parameters: Mapping[str, Any] | None,
    parallel: int | None,
    base_dir: str | os.PathLike[str] | None,
    drawn: Mapping[str, Any] | None = None,
) -> tuple[TaskLike, str | os.PathLike[str] | None]:
    """(task, base_dir) with a sweep section of these parameters (and parallel, and
    `drawn`: samples, sampler, seed where not None): a task file is read as a dict whose
    local paths stay relative to its directory."""
    drawn = {k: v for k, v in (drawn or {}).items() if v is not None}
    if parameters is None and parallel is None and not drawn:
        return task, base_dir
    if not isinstance(task, Mapping):
        path = find_task_file(existing(task))
        loaded = read_mapping(path)
        task, base_dir = loaded, path.resolve().parent
    sweep = dict(task.get("sweep") or {})
    if parameters is not None:
        sweep["parameters"] = dict(parameters)
    if parallel is not None:
        sweep["parallel"] = parallel
    sweep.update(drawn)
    return {**task, "sweep": sweep}, base_dir


def with_session(
    task: TaskLike,
    overrides: Mapping[str, Any],
    base_dir: str | os.PathLike[str] | None,
) -> tuple[TaskLike, str | os.PathLike[str] | None]:
    """(task, base_dir) as an interactive session (`tcloud dev`): the task's own
    `session:` block (none: the defaults) with `overrides` (ports, idle_timeout,
    stop_on_disconnect) laid over it; a task file is read as a dict whose local paths
    stay relative to its directory."""
    if not isinstance(task, Mapping):
        path = find_task_file(existing(task))
        if path.name == LEGACY_FILE:
            raise UsageError(f"{shown(path)}: a session needs a tcloud.yaml task")
        load_task(path, allow_outside=True)  # its problems name line and field
        task, base_dir = yaml.safe_load(path.read_text(encoding="utf-8")), path.resolve().parent
    session = dict(task.get("session") or {})
    session.update(overrides)
    return {**task, "session": session}, base_dir


def read_mapping(path: Path) -> dict:
    """A task file as a dict, after the schema has read it (so its problems name line
    and field)."""
    if path.name == LEGACY_FILE:
        raise UsageError(f"{shown(path)}: sweep parameters need a tcloud.yaml task")
    load_task(path, allow_outside=True)  # local paths: checked again as the dict's
    return yaml.safe_load(path.read_text(encoding="utf-8"))
