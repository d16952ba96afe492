"""Layer 2, the compiler: a TaskSpec becomes a self-contained task instruction, the
manifest of its files plus the task as the cluster runs it, with a digest that is
identical for identical inputs on any machine (no timestamps, no local paths).

The cluster side (tacc_agent) re-validates the instruction, turns it into an sbatch
submission (layer 3) and runs it on every node (layer 4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tacc_contract.errors import Problem, Rejected, TaskFileError
from tacc_contract.instruction import FORMAT, digest_of
from tacc_contract.plugins import Plugin
from tacc_contract.registry import from_env, in_layer, select
from tacc_contract.schema import TASK_FILE, TaskSpec
from tcloud.compile import imagebuild
from tcloud.transfer.manifest import Entry, Hasher, build_manifest, sha256_file


@dataclass(frozen=True)
class Instruction:
    manifest: dict[str, Entry]
    document: dict
    digest: str

    def manifest_json(self) -> dict:
        return manifest_json(self.manifest)


def manifest_json(manifest: dict[str, Entry]) -> dict:
    """path -> [sha256, size, mode]: what the digest covers and what the cluster stores."""
    return {path: [e.sha256, e.size, e.mode] for path, e in manifest.items()}


def task_document(task: TaskSpec) -> dict:
    """The task as the cluster needs it: uploaded datasets are files of the manifest,
    so only datasets already on the cluster are named."""
    document = {
        "name": task.name,
        # Unset options stay out (the cluster applies the same defaults).
        "resources": {k: v for k, v in task.resources.items() if v is not None},
        "environment": task.environment,
        "datasets": [{"name": d.name, "cluster": d.cluster} for d in task.datasets if d.cluster],
        "setup": task.setup,
        "run": task.run,
        "outputs": task.outputs,
        "runtime": task.runtime,
    }
    if task.image:  # only when set: the digests of tasks without one stay as they were
        document["image"] = task.image
    if task.plugins:
        document["plugins"] = task.plugins
    if task.session is not None:  # only for a session: ordinary jobs keep their digests
        document["session"] = task.session
    # Fields plug-ins added (sweep, ...): only the ones the task sets.
    document.update({k: v for k, v in task.extensions.items() if v not in (None, [], {})})
    return document


# The cluster's answer to "which digest does this image reference name now?"
ImageResolver = Callable[[str], str]


def compile_task(
    task: TaskSpec,
    hasher: Hasher = sha256_file,
    plugins: list[Plugin] | None = None,
    resolve_image: ImageResolver | None = None,
    source: str | None = None,
) -> Instruction:
    """The instruction of `task`: its document after every compile pass of the plug-ins
    that are on (default: as for load_task), with a record of which were on and what
    each pass changed. `resolve_image` pins the task's image reference to the digest it
    names now (the cluster answers), so the digest covers the image's exact bits;
    without it (dry run, local checks) the reference stays as the task wrote it.
    An image built from a build file (tcloud.compile.imagebuild): the file is checked first, its
    base pinned the same way, and its key (from the files' digests) written into the
    document before the digest is taken. `source`: where the task's problems point (its
    file; default base_dir/tcloud.yaml)."""
    plugins = select(from_env(), task=task.plugins) if plugins is None else plugins
    source = source or str(task.base_dir / TASK_FILE)
    build = imagebuild.locate(task, source) if task.image_build else None
    # Asked before the files are hashed: a reference the cluster refuses costs no hashing.
    pinned = resolve_image(task.image) if task.image and resolve_image is not None else None
    base_pinned = None
    if build is not None and resolve_image is not None:
        try:
            base_pinned = resolve_image(build.build.base)
        except TaskFileError as exc:
            raise imagebuild.unresolved_base(build, exc) from None
    manifest = build_manifest(task, hasher)
    document = {"format": FORMAT, "task": task_document(task), "manifest": manifest_json(manifest)}
    if pinned is not None:
        document["task"]["image"] = pinned
    if build is not None:
        entry = imagebuild.instruction_entry(task, build, manifest, base_pinned)
        document["task"]["image_build"] = entry
    shaped = {}
    for plugin in in_layer(plugins, "compile"):
        try:
            change = plugin.compile(document)
        except Rejected as exc:  # a compile pass that refuses the task: a task problem
            where = str(task.base_dir / TASK_FILE)
            raise TaskFileError([Problem(where, 0, 0, exc.field, str(exc))]) from None
        if change:
            shaped[plugin.name] = change
    on = [p.name for p in plugins if {"schema", "compile"} & set(p.layers)]
    document["plugins"] = {"on": on, "shaped": shaped}
    return Instruction(manifest, document, digest_of(document))
