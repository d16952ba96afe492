"""The compiled task instruction as the cluster receives it (instruction.json in the
job directory), re-validated here with the same field tables tcloud uses (JSON is
YAML, so every problem still names its line and field): never trust the laptop."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import yaml

from tacc_agent.errors import Rejected
from tcloud.fields import Field, Validator, one_of
from tcloud.schema import TASK, TaskSpec, spec_from

FORMAT = "tacc-instruction/1"
FILE = "instruction.json"

# What the cluster reads of a task: everything but the laptop-side `code` section.
CLUSTER_TASK = {key: spec for key, spec in TASK.items() if key != "code"}
INSTRUCTION = {
    "format": Field("str", required=True, check=one_of(FORMAT)),
    "task": Field("mapping", required=True, children=CLUSTER_TASK),
    "manifest": Field("any", default={}),
}


class InvalidInstruction(Rejected):
    """Every problem of an instruction, one per line."""


def canonical(document: dict) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def digest_of(document: dict) -> str:
    """The instruction's identity: equal inputs give equal digests on any machine."""
    return hashlib.sha256(canonical(document)).hexdigest()


def parse(text: str, source: str) -> TaskSpec:
    """A TaskSpec from instruction text; InvalidInstruction lists every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        raise InvalidInstruction(f"{source}: not valid JSON: {exc}") from None
    validator = Validator(source)
    data = validator.mapping(root, INSTRUCTION) if root is not None else {}
    if root is None:
        raise InvalidInstruction(f"{source}: empty instruction")
    if validator.problems:
        problems = sorted(validator.problems, key=lambda p: (p.line, p.column))
        raise InvalidInstruction("\n".join(str(p) for p in problems))
    task = dict(data["task"])
    task["code"] = {}
    task["datasets"] = [d for d in task["datasets"] or [] if d.get("cluster")]
    return spec_from(task, Path("."))


def load(job_dir: Path) -> TaskSpec:
    path = job_dir / FILE
    try:
        text = path.read_text()
    except OSError as exc:
        raise InvalidInstruction(f"{path}: {exc.strerror}") from None
    return parse(text, str(path))
