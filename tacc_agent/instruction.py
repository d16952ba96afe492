"""The compiled task instruction as the cluster receives it (instruction.json in the
job directory), re-validated here with the same field tables tcloud uses (JSON is
YAML, so every problem still names its line and field): never trust the laptop."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from tacc_agent.errors import Rejected
from tacc_plugins.registry import available, from_env, is_module
from tcloud.fields import Field, Validator, one_of, pattern
from tcloud.schema import TaskSpec, spec_from, task_fields

FORMAT = "tacc-instruction/1"
FILE = "instruction.json"


# Plug-in modules ops named in the agent config (`plugins`), set by the CLI at start.
CONFIGURED: list[str] = []


def configure(words: tuple | list) -> None:
    CONFIGURED[:] = [str(w) for w in words]


def cluster_task_fields() -> dict[str, Field]:
    """What the cluster reads of a task: everything but the laptop-side `code` section,
    with the fields of every plug-in installed here (the laptop chose which were on)."""
    modules = [w.lstrip("+") for w in [*from_env(), *CONFIGURED] if is_module(w)]
    table = task_fields(available(modules).values())
    return {key: spec for key, spec in table.items() if key != "code"}


def instruction_fields() -> dict[str, Field]:
    return {
        "format": Field("str", required=True, check=one_of(FORMAT)),
        "task": Field("mapping", required=True, children=cluster_task_fields()),
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


def parse(text: str, source: str) -> TaskSpec:
    """A TaskSpec from instruction text; InvalidInstruction lists every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise InvalidInstruction(f"{source}: not valid JSON: {exc}") from None
    validator = Validator(source)
    fields = instruction_fields()
    data = validator.mapping(root, fields) if root is not None else {}
    if root is None:
        raise InvalidInstruction(f"{source}: empty instruction")
    if validator.problems:
        problems = sorted(validator.problems, key=lambda p: (p.line, p.column))
        raise InvalidInstruction("\n".join(str(p) for p in problems))
    task = dict(data["task"])
    task["code"] = {}
    task["datasets"] = [d for d in task["datasets"] or [] if d.get("cluster")]
    return spec_from(task, Path("."), {"code": Field("mapping"), **fields["task"].children})


def load(job_dir: Path) -> TaskSpec:
    path = job_dir / FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInstruction(f"{path}: {exc.strerror}") from None
    return parse(text, str(path))
