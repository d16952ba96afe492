"""A small validator for YAML node trees that keeps line/column for every error.

Fields are declared as data (`Field`), values are read from `yaml.compose()` nodes so
every problem can say where it is, unknown keys are errors with a did-you-mean, and all
problems are collected before anything is reported.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import yaml

from tacc_contract.errors import Problem

Check = Callable[[Any], str | None]  # returns what is expected, or None when fine


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its kind, whether it is required, its default. `each`
    checks every entry of a list[str], `keys` every key of a map[str]."""

    kind: str  # str | int | number | bool | list[str] | map[str] | mapping | list[mapping] | any
    required: bool = False
    default: Any = None
    check: Check | None = None
    children: dict[str, Field] = field(default_factory=dict)
    expected: str = ""
    each: Check | None = None
    keys: Check | None = None


def pattern(regex: str, expected: str) -> Check:
    compiled = re.compile(regex)
    return lambda value: None if compiled.fullmatch(str(value)) else expected


def at_least(minimum: int) -> Check:
    return lambda value: None if value >= minimum else f"an integer >= {minimum}"


def between(minimum: int, maximum: int) -> Check:
    return lambda value: (
        None if minimum <= value <= maximum else f"an integer from {minimum} to {maximum}"
    )


def one_of(*choices: str) -> Check:
    return lambda value: None if value in choices else "one of " + ", ".join(choices)


def non_empty(value: Any) -> str | None:
    return None if value else "at least one entry"


def single_line(value: str) -> str | None:
    return "one line of text" if not value.strip() or "\n" in value or "\r" in value else None


def relative_path(value: str) -> str | None:
    """A path or glob inside the directory it belongs to: not absolute, no '..'."""
    if value.startswith(("/", "~")) or ".." in value.split("/"):
        return "a path relative to the directory, without '..' (and not absolute)"
    return None


_SCALAR = yaml.constructor.SafeConstructor()
_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "number": "a number",
    "bool": "true or false",
    "list[str]": "a list of strings",
    "map[str]": "a mapping of names to strings",
    "mapping": "a mapping",
    "list[mapping]": "a list of mappings",
    "any": "a value",
}
_NODE_WORDS = {yaml.SequenceNode: "a list", yaml.MappingNode: "a mapping"}


def holds_nul(value: Any) -> bool:
    """Whether a constructed value has a NUL in any string, key or value, at any depth.
    Each list or mapping is looked at once: YAML aliases may share or nest them."""
    pending, seen = [value], set()
    while pending:
        item = pending.pop()
        if isinstance(item, str) and "\0" in item:
            return True
        if isinstance(item, dict | list) and id(item) not in seen:
            seen.add(id(item))
            pending.extend([*item.keys(), *item.values()] if isinstance(item, dict) else item)
    return False


def is_null(node: yaml.Node) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null"


def shown(node: yaml.Node) -> str:
    """What a node is, for messages: its text for a scalar, else its kind."""
    if is_null(node):
        return "nothing (null)"
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value)
    return _NODE_WORDS.get(type(node), "a value")


class Validator:
    """Reads one document against a field table; `problems` holds what was wrong."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def problem(self, node: yaml.Node, name: str, message: str) -> None:
        mark = node.start_mark
        self.problems.append(Problem(self.path, mark.line + 1, mark.column + 1, name, message))

    def key_of(self, key_node: yaml.Node, prefix: str) -> str | None:
        """A mapping key as text; a list or mapping used as a key is a problem."""
        if isinstance(key_node, yaml.ScalarNode):
            return str(key_node.value)
        where = prefix.rstrip(".") or "(top)"
        self.problem(key_node, where, f"expected a key name, got {shown(key_node)} as a key")
        return None

    def mapping(self, node: yaml.Node, fields: dict[str, Field], prefix: str = "") -> dict:
        if is_null(node):  # `resources:` with nothing under it: all defaults
            node = yaml.MappingNode("tag:yaml.org,2002:map", [], node.start_mark, node.end_mark)
        if not isinstance(node, yaml.MappingNode):
            where = prefix.rstrip(".") or "(top)"
            self.problem(node, where, f"expected a mapping of keys to values, got {shown(node)}")
            return {}
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = self.key_of(key_node, prefix)
            if key is None:
                continue
            name = f"{prefix}{key}"
            if key not in fields:
                hint = difflib.get_close_matches(key, list(fields), n=1)
                suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
                known = ", ".join(fields)
                self.problem(key_node, name, f"unknown key{suggestion}; known keys: {known}")
                continue
            if key in seen:
                self.problem(key_node, name, "appears twice")
                continue
            seen[key] = value_node
        result = {}
        for key, spec in fields.items():
            name = f"{prefix}{key}"
            if key not in seen:
                if spec.required:
                    self.problem(node, name, f"missing; expected {self.expected(spec)}")
                result[key] = spec.default
                continue
            result[key] = self.value(seen[key], spec, name)
        return result

    def expected(self, spec: Field) -> str:
        return spec.expected or _KIND_WORDS[spec.kind]

    def value(self, node: yaml.Node, spec: Field, name: str) -> Any:
        if spec.kind == "any":
            value = _SCALAR.construct_object(node, deep=True)
            if holds_nul(value):  # no argv word, variable or path can carry one
                self.problem(node, name, "expected text without NUL characters")
                return spec.default
            wanted = spec.check(value) if spec.check is not None else None
            if wanted:
                got = repr(value) if isinstance(node, yaml.ScalarNode) else shown(node)
                self.problem(node, name, f"expected {wanted}, got {got}")
                return spec.default
            return value
        if is_null(node) and spec.kind not in ("mapping", "list[str]"):
            # An empty value: the default for an optional key, a problem for a required one.
            if spec.required:
                self.problem(node, name, f"expected {self.expected(spec)}, got nothing (null)")
            return spec.default
        if spec.kind == "mapping":
            return self.mapping(node, spec.children, prefix=f"{name}.")
        if spec.kind == "list[mapping]":
            if not isinstance(node, yaml.SequenceNode):
                self.problem(node, name, f"expected {self.expected(spec)}, got {shown(node)}")
                return spec.default
            return [
                self.mapping(item, spec.children, prefix=f"{name}[{i}].")
                for i, item in enumerate(node.value)
            ]
        value = self.plain(node, spec, name)
        if value is not None and spec.check is not None:
            wanted = spec.check(value)
            if wanted:
                self.problem(node, name, f"expected {wanted}, got {value!r}")
                return spec.default
        return value

    def plain(self, node: yaml.Node, spec: Field, name: str) -> Any:
        wanted = self.expected(spec)
        if spec.kind == "list[str]":
            if is_null(node):
                return []
            if not isinstance(node, yaml.SequenceNode):
                self.problem(node, name, f"expected {wanted}, got {shown(node)}")
                return spec.default
            items = []
            for i, item in enumerate(node.value):
                text = self.scalar(item, "str", f"{name}[{i}]")
                if text is not None and spec.each and (problem := spec.each(text)):
                    self.problem(item, f"{name}[{i}]", f"expected {problem}, got {text!r}")
                elif text is not None:
                    items.append(text)
            return items
        if spec.kind == "map[str]":
            if not isinstance(node, yaml.MappingNode):
                self.problem(node, name, f"expected {wanted}, got {shown(node)}")
                return spec.default
            result: dict[str, str] = {}
            for key_node, value_node in node.value:
                key = self.key_of(key_node, f"{name}.")
                if key is None:
                    continue
                if key in result:
                    self.problem(key_node, f"{name}.{key}", "appears twice")
                    continue
                if spec.keys and (problem := spec.keys(key)):
                    self.problem(key_node, f"{name}.{key}", f"expected {problem}")
                    continue
                text = self.scalar(value_node, "str", f"{name}.{key}")
                if text is not None:
                    result[key] = text
            return result
        return self.scalar(node, spec.kind, name, wanted)

    def scalar(self, node: yaml.Node, kind: str, name: str, wanted: str = "") -> Any:
        wanted = wanted or _KIND_WORDS[kind]
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, name, f"expected {wanted}, got {shown(node)}")
            return None
        value = _SCALAR.construct_object(node)
        if kind == "str" and isinstance(value, str | int | float) and not isinstance(value, bool):
            # A number where text is wanted keeps the text as written: YAML 1.1 reads
            # `time: 1:30:00` as 5400 and `LR: 0.10` as 0.1.
            text = value if isinstance(value, str) else node.value
            if "\0" in text:  # no argv word, variable or path can carry one
                self.problem(node, name, "expected text without NUL characters")
                return None
            return text
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "number" and isinstance(value, int | float) and not isinstance(value, bool):
            return value
        if kind == "bool" and isinstance(value, bool):
            return value
        self.problem(node, name, f"expected {wanted}, got {shown(node)}")
        return None
