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

from tcloud.errors import Problem

Check = Callable[[Any], str | None]  # returns what is expected, or None when fine


@dataclass(frozen=True)
class Field:
    """One key of a mapping: its kind, whether it is required, its default."""

    kind: str  # str | int | bool | list[str] | map[str] | mapping | list[mapping] | any
    required: bool = False
    default: Any = None
    check: Check | None = None
    children: dict[str, Field] = field(default_factory=dict)
    expected: str = ""


def pattern(regex: str, expected: str) -> Check:
    compiled = re.compile(regex)
    return lambda value: None if compiled.fullmatch(str(value)) else expected


def at_least(minimum: int) -> Check:
    return lambda value: None if value >= minimum else f"an integer >= {minimum}"


def one_of(*choices: str) -> Check:
    return lambda value: None if value in choices else "one of " + ", ".join(choices)


def non_empty(value: Any) -> str | None:
    return None if value else "at least one entry"


_SCALAR = yaml.constructor.SafeConstructor()
_KIND_WORDS = {
    "str": "a string",
    "int": "an integer",
    "bool": "true or false",
    "list[str]": "a list of strings",
    "map[str]": "a mapping of names to strings",
    "mapping": "a mapping",
    "list[mapping]": "a list of mappings",
    "any": "a value",
}


class Validator:
    """Reads one document against a field table; `problems` holds what was wrong."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.problems: list[Problem] = []

    def problem(self, node: yaml.Node, name: str, message: str) -> None:
        mark = node.start_mark
        self.problems.append(Problem(self.path, mark.line + 1, mark.column + 1, name, message))

    def mapping(self, node: yaml.Node, fields: dict[str, Field], prefix: str = "") -> dict:
        if not isinstance(node, yaml.MappingNode):
            self.problem(node, prefix or "(top)", "expected a mapping of keys to values")
            return {}
        seen: dict[str, yaml.Node] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            name = f"{prefix}{key}"
            if key not in fields:
                hint = difflib.get_close_matches(str(key), list(fields), n=1)
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
            return _SCALAR.construct_object(node, deep=True)
        if spec.kind == "mapping":
            return self.mapping(node, spec.children, prefix=f"{name}.")
        if spec.kind == "list[mapping]":
            if not isinstance(node, yaml.SequenceNode):
                self.problem(node, name, f"expected {self.expected(spec)}")
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
            if isinstance(node, yaml.ScalarNode) and node.tag.endswith(":null"):
                return []
            if not isinstance(node, yaml.SequenceNode):
                self.problem(node, name, f"expected {wanted}")
                return spec.default
            items = [self.scalar(item, "str", f"{name}[{i}]") for i, item in enumerate(node.value)]
            return [item for item in items if item is not None]
        if spec.kind == "map[str]":
            if not isinstance(node, yaml.MappingNode):
                self.problem(node, name, f"expected {wanted}")
                return spec.default
            result = {}
            for key_node, value_node in node.value:
                key = str(key_node.value)
                text = self.scalar(value_node, "str", f"{name}.{key}")
                if text is not None:
                    result[key] = text
            return result
        return self.scalar(node, spec.kind, name, wanted)

    def scalar(self, node: yaml.Node, kind: str, name: str, wanted: str = "") -> Any:
        wanted = wanted or _KIND_WORDS[kind]
        if not isinstance(node, yaml.ScalarNode):
            self.problem(node, name, f"expected {wanted}")
            return None
        value = _SCALAR.construct_object(node)
        if kind == "str" and isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        if kind == "int" and isinstance(value, int) and not isinstance(value, bool):
            return value
        if kind == "bool" and isinstance(value, bool):
            return value
        self.problem(node, name, f"expected {wanted}, got {node.value!r}")
        return None
