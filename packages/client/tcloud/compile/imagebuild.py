"""A task's image built from its build file (`image: {build: PATH}`, tacc_contract.buildfile)
on tcloud's side.

Before anything is hashed or sent: the build file is found (PATH names it, or a directory
holding Containerfile or Dockerfile), must lie inside the task directory and be one of the
files tcloud uploads, and is parsed (its problems name `<build file>:<line>`). At submit
its base is pinned to a digest by the cluster (the same `tacc-agent image resolve` as
`image:`), and once the files are hashed the build's key is computed from the digests of
exactly the files its COPY steps read. The instruction then carries `task.image_build`
{file, context, base, key}: the file and context relative to the uploaded code directory
(`<job dir>/code/` on the cluster), the base pinned, the key the cluster builds under
(once per key and user).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

from tacc_contract.buildfile import (
    MAX_BYTES,
    BuildFile,
    BuildFileError,
    build_key,
    copied_files,
    find_build_file,
    parse,
    source_files,
    unmatched,
)
from tacc_contract.errors import Problem, TaskFileError
from tacc_contract.schema import TaskSpec, field_position
from tcloud.compile import local_paths
from tcloud.transfer.manifest import Entry, code_excludes, dir_excluded, file_excluded

FIELD = "image.build"
CODE_PREFIX = "code/"
# What validate and a dry run say of a build: no cluster, so the base stays as written.
BUILT_ON_CLUSTER = "built on the cluster once per content"


@dataclass(frozen=True)
class LocalBuild:
    """A task's build file, found and parsed."""

    file: str  # relative to the uploaded code directory, '/'-separated
    context: str  # the build file's directory, likewise; '' for the code directory itself
    build: BuildFile  # build.source: the file's path relative to the task directory


def position(source: str) -> tuple[int, int]:
    """Line and column of `image.build` in the task file; (0, 0) when there is no file
    to point into (a dict task)."""
    return field_position(Path(source), FIELD)


def refused(source: str, message: str) -> TaskFileError:
    """A problem of the task file, on its `image.build` line."""
    line, column = position(source)
    return TaskFileError([Problem(source, line, column, FIELD, message)])


def locate(task: TaskSpec, source: str) -> LocalBuild:
    """The build file `image.build` names, checked: inside the task directory, uploaded,
    and a valid build file. `source`: the task file (where problems point)."""
    text = task.image_build["build"]
    base = task.base_dir.resolve()
    named = base / text
    try:
        real = named.resolve(strict=True)
    except (OSError, RuntimeError):
        raise refused(source, f"{text}: no such file or directory in the task directory") from None
    if not local_paths.is_inside(real, base):
        raise refused(
            source,
            f"{text} resolves to {real}, outside the task directory {base}: the build "
            "file and its context must be inside it",
        )
    if real.is_dir():
        found = find_build_file(name for name in os.listdir(real) if (real / name).is_file())
        if found is None:
            raise refused(source, f"{text}: the directory holds no Containerfile or Dockerfile")
        file_path = inside(real / found, base, f"{text}/{found}", source)
    elif real.is_file():
        file_path = real
    else:
        raise refused(source, f"{text}: not a file or a directory")
    shown = file_path.relative_to(base).as_posix()
    relative = uploaded_path(task, file_path, shown, source)
    build = read_build_file(file_path, shown)
    return LocalBuild(relative, posixpath.dirname(relative), build)


def inside(path: Path, base: Path, shown: str, source: str) -> Path:
    """`path` resolved (a symlinked build file followed), refused unless it is a file
    inside the task directory: nothing outside it is read."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise refused(source, f"{shown}: no such file in the task directory") from None
    if not local_paths.is_inside(real, base) or not real.is_file():
        raise refused(
            source,
            f"{shown} resolves outside the task directory {base} (or to no file): "
            "the build file must be a file inside it",
        )
    return real


def uploaded_path(task: TaskSpec, file_path: Path, shown: str, source: str) -> str:
    """The build file's path in the upload (relative to the code directory); a problem
    when the task's code settings leave it out."""
    workdir = local_paths.resolve(task.base_dir, task.code["workdir"])
    if not local_paths.is_inside(file_path, workdir):
        raise refused(
            source,
            f"{shown} is outside the code directory tcloud uploads "
            f"(code.workdir {task.code['workdir']!r}): the cluster builds from the uploaded files",
        )
    relative = file_path.relative_to(workdir).as_posix()
    if is_left_out(task, workdir, relative):
        raise refused(
            source,
            f"{shown} is left out of the upload by code.include, code.exclude or "
            ".tcloudignore: the cluster builds from the uploaded files; upload it",
        )
    return relative


def is_left_out(task: TaskSpec, workdir: Path, relative: str) -> bool:
    """Whether the upload (tcloud.transfer.manifest's rules) leaves out this file of the
    code dir."""
    exclude = code_excludes(task, workdir)
    parts = relative.split("/")
    directories = ["/".join(parts[: i + 1]) for i in range(len(parts) - 1)]
    if any(dir_excluded(directory, exclude) for directory in directories):
        return True
    return file_excluded(relative, list(task.code["include"]), exclude)


def read_build_file(path: Path, shown: str) -> BuildFile:
    """The build file parsed; its problems name `shown:line`."""
    try:
        if path.stat().st_size > MAX_BYTES:
            message = f"over {MAX_BYTES // 1024} KiB: not a build file"
            raise TaskFileError([Problem(shown, 0, 0, "", message)])
        data = path.read_bytes()
    except OSError as exc:
        raise TaskFileError([Problem(shown, 0, 0, "", f"cannot read: {exc.strerror}")]) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        message = "not UTF-8 text; save the build file as UTF-8"
        raise TaskFileError([Problem(shown, line, 0, "", message)]) from None
    try:
        return parse(text, shown)
    except BuildFileError as exc:
        raise TaskFileError(exc.problems) from None


def context_files(local: LocalBuild, manifest: dict[str, Entry]) -> dict[str, tuple[str, bool]]:
    """The uploaded files of the build's context: path relative to it -> (sha256,
    executable), what the key covers of each (the cluster copies it 0755 or 0644)."""
    prefix = CODE_PREFIX + (f"{local.context}/" if local.context else "")
    return {
        path[len(prefix) :]: (entry.sha256, bool(entry.mode & 0o111))
        for path, entry in manifest.items()
        if path.startswith(prefix)
    }


def check_copies(local: LocalBuild, files: dict[str, tuple[str, bool]], context_dir: Path) -> None:
    """Every COPY source matches an uploaded file of the context; one that matches only
    files the upload leaves out says so."""
    try:
        copied_files(local.build, files)
    except BuildFileError:
        pass
    else:
        return
    on_disk = files_under(context_dir)
    problems = []
    for step in local.build.steps:
        if step.kind != "COPY":
            continue
        for source in step.args[0]:
            if source_files(source, files):
                continue
            if not source_files(source, on_disk):
                problems.append(unmatched(local.build, step.line, source))
                continue
            message = (
                f"source {source!r}: its files are left out of the upload by "
                "code.include, code.exclude or .tcloudignore (the cluster builds from the "
                "uploaded files); upload them"
            )
            problems.append(Problem(local.build.source, step.line, 0, "COPY", message))
    raise TaskFileError(problems)


def files_under(directory: Path) -> list[str]:
    """Every file below `directory` (relative, '/'-separated); symlinks not followed."""
    found = []
    for dirpath, _, filenames in os.walk(directory):
        below = Path(dirpath).relative_to(directory).as_posix()
        found += [name if below == "." else f"{below}/{name}" for name in filenames]
    return found


def instruction_entry(
    task: TaskSpec, local: LocalBuild, manifest: dict[str, Entry], base_pinned: str | None
) -> dict:
    """`task.image_build` of the instruction: with the base pinned, its key; without (a
    dry run, validate) the base as written and no key."""
    files = context_files(local, manifest)
    workdir = local_paths.resolve(task.base_dir, task.code["workdir"])
    check_copies(local, files, workdir / local.context)
    entry = {"file": local.file, "context": local.context, "base": base_pinned or local.build.base}
    if base_pinned is not None:
        entry["key"] = build_key(local.build, base_pinned, files)
    return entry


def unresolved_base(local: LocalBuild, error: TaskFileError) -> TaskFileError:
    """The cluster could not resolve the build's base: a problem of its FROM line."""
    build = local.build
    return TaskFileError(
        [Problem(build.source, build.base_line, 0, "FROM", p.message) for p in error.problems]
    )


def summary(entry: dict) -> str:
    """One line for people: `built from FILE (key 12hex) FROM BASE`."""
    key = f" (key {entry['key'].removeprefix('sha256:')[:12]})" if entry.get("key") else ""
    return f"built from {entry['file']}{key} FROM {entry['base']}"
