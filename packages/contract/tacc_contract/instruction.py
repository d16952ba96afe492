"""The compiled task instruction (instruction.json in a job directory): its format, its
digest, and its validation with the same field tables and plug-in checks the task file
had (JSON is YAML, so every problem still names its line and field). tcloud builds it;
the agent re-validates it with `parse` before anything is made from it (never trust
the laptop), passing the plug-in words its operator configured."""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Sequence
from pathlib import Path

import yaml

from tacc_contract.errors import Rejected
from tacc_contract.fields import Field, Validator, one_of, pattern
from tacc_contract.images import unpinned
from tacc_contract.registry import PluginError, available, from_env, in_layer, is_module, select
from tacc_contract.schema import (
    CLUSTER,
    TaskSpec,
    check_cpus_and_memory,
    check_image,
    check_image_value,
    check_session,
    child,
    fill_defaults,
    node_at,
    spec_from,
    task_fields,
)

# libyaml's composer when PyYAML has it: a 1,000-file instruction composes in 0.017 s, not
# 0.16-0.23 s (lab node), and the agent parses it at commit, at sbatch and at job start.
# Its composer recurses in C without Python's depth check (a 100,000-deep list crashes
# the process), so text reaches it only after json.loads, which does check, accepted it.
FAST_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

FORMAT = "tacc-instruction/1"
FILE = "instruction.json"


def cluster_task_fields(configured: Sequence[str] = ()) -> dict[str, Field]:
    """What the cluster reads of a task: everything but the laptop-side `code` section,
    with the fields of every plug-in installed here (the laptop chose which were on) and
    those only tcloud writes (`image_build`).
    `configured`: the plug-in words of the agent's operator (its `plugins` setting)."""
    modules = [w.lstrip("+") for w in [*from_env(), *configured] if is_module(w)]
    table = task_fields(available(modules).values())
    return {**{key: spec for key, spec in table.items() if key != "code"}, **CLUSTER}


def instruction_fields(configured: Sequence[str] = ()) -> dict[str, Field]:
    return {
        "format": Field("str", required=True, check=one_of(FORMAT)),
        "task": Field("mapping", required=True, children=cluster_task_fields(configured)),
        "manifest": Field("any", default={}),
        # Which schema and compile plug-ins were on, and what each changed.
        "plugins": Field("any", default={}),
        # The job this one reruns (`tcloud rerun`): same files, the environment locked.
        "rerun_of": Field("str", check=pattern(r"\d+", "a job id")),
    }


class InvalidInstruction(Rejected):
    """Every problem of an instruction, one per line."""


def canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(document: dict) -> str:
    """The instruction's identity: equal inputs give equal digests on any machine."""
    return hashlib.sha256(canonical(document)).hexdigest()


def code_digest(document: dict) -> str:
    """The identity of a job's files (the manifest alone): equal for a job and its reruns."""
    return digest_of({"manifest": document.get("manifest", {})})


def refused(validator: Validator) -> InvalidInstruction:
    problems = sorted(validator.problems, key=lambda p: (p.line, p.column))
    return InvalidInstruction("\n".join(str(p) for p in problems))


def check_with_plugins(
    validator: Validator, task_node: yaml.Node, task: dict, configured: Sequence[str]
) -> None:
    """The schema checks of the plug-ins on for this task here (ops' words, then the
    task's own), as tcloud ran them: sweep sizes, GPU shares, node ranges, ..."""
    try:
        plugins = select(configured, task=task["plugins"] or [], policy_from=configured)
    except PluginError as exc:
        validator.problem(node_at(task_node, "plugins"), "task.plugins", str(exc))
        return
    for plugin in in_layer(plugins, "schema"):
        plugin.check(
            task,
            lambda name, message: validator.problem(
                node_at(task_node, name), f"task.{name}", message
            ),
        )


def parse(
    text: str, source: str, configured: Sequence[str] = (), *, pinned: bool = False
) -> TaskSpec:
    """A TaskSpec from instruction text; InvalidInstruction lists every problem.
    `configured`: the plug-in words of the agent's operator. `pinned`: the cluster's
    reading, where an image must be pinned to its digest (tcloud resolved it at submit);
    tcloud's own check of a task before it resolves leaves it False."""
    try:
        return _parse(text, source, list(configured), pinned)
    except RecursionError:
        raise InvalidInstruction(f"{source}: nested too deeply to be an instruction") from None


def compose(text: str) -> yaml.Node | None:
    """The instruction's YAML node tree. Valid JSON (what tcloud writes) goes to libyaml once
    json.loads has bounded its depth (RecursionError past it); anything else to the pure-Python
    composer, whose error names the line."""
    try:
        json.loads(text)
    except ValueError:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    return yaml.compose(text, Loader=FAST_LOADER)


def check_pinned(validator: Validator, task_node: yaml.Node, task: dict) -> None:
    if task.get("image"):
        problem = unpinned(task["image"])
        if problem:
            validator.problem(node_at(task_node, "image"), "task.image", f"expected {problem}")
    build = task.get("image_build")
    if build and build.get("base"):
        problem = unpinned(build["base"])
        if problem:
            where = node_at(task_node, "image_build.base")
            validator.problem(where, "task.image_build.base", f"expected {problem}")
    if build and not build.get("key"):
        where = node_at(task_node, "image_build")
        message = (
            "missing; expected the build's key (sha256:<64 hex>), which tcloud computes at submit"
        )
        validator.problem(where, "task.image_build.key", message)


def check_image_build(validator: Validator, task_node: yaml.Node, task: dict) -> None:
    """At most one of task.image and task.image_build; the build's context is the
    directory of its file."""
    build = task.get("image_build")
    if not build:
        return
    if task.get("image"):
        validator.problem(
            node_at(task_node, "image_build"),
            "task.image_build",
            "not with task.image: a task runs in one image, pulled or built",
        )
    if build.get("file") and posixpath.dirname(build["file"]) != (build.get("context") or ""):
        validator.problem(
            node_at(task_node, "image_build.context"),
            "task.image_build.context",
            f"expected the build file's directory {posixpath.dirname(build['file'])!r}, "
            f"got {build.get('context') or ''!r}",
        )


def _parse(text: str, source: str, configured: list[str], pinned: bool) -> TaskSpec:
    try:
        root = compose(text)
    except yaml.YAMLError as exc:
        raise InvalidInstruction(f"{source}: not valid JSON: {exc}") from None
    validator = Validator(source)
    fields = instruction_fields(configured)
    data = validator.mapping(root, fields) if root is not None else {}
    if root is None:
        raise InvalidInstruction(f"{source}: empty instruction")
    if validator.problems:
        raise refused(validator)
    table = fields["task"].children
    task = dict(data["task"])
    # Plug-ins see every section with its defaults filled in, as in tacc_contract.schema.
    for section in ("resources", "environment", "runtime"):
        task[section] = fill_defaults(task[section], table[section].children)
    task_node = child(root, "task") or root
    check_image_value(validator, task_node, task, prefix="task.", builds=False)
    check_image_build(validator, task_node, task)
    check_image(validator, task_node, task, prefix="task.")
    check_session(validator, task_node, task, prefix="task.")
    check_cpus_and_memory(validator, task_node, task, prefix="task.")
    if pinned:
        check_pinned(validator, task_node, task)
    check_with_plugins(validator, task_node, task, configured)
    if validator.problems:
        raise refused(validator)
    task["code"] = {}
    task["datasets"] = [d for d in task["datasets"] or [] if d.get("cluster")]
    return spec_from(task, Path("."), {"code": Field("mapping"), **table})


def load(job_dir: Path, configured: Sequence[str] = (), *, pinned: bool = False) -> TaskSpec:
    path = job_dir / FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInstruction(f"{path}: {exc.strerror}") from None
    return parse(text, str(path), configured, pinned=pinned)
