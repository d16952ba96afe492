"""Checking a JSON value against the type an answer declares (tacc_contract.answers):
`shape_of(JobStatus, "job status")` is the check both sides run. A value that does not
fit is a ProtocolError naming the verb and the key (`nodes[2].host: expected text, got
null`); keys beyond the type are kept."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field

from tacc_contract.wire import ProtocolError

NULL = type(None)
TYPE_NAMES = {
    str: "text",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    NULL: "null",
}


@dataclass(frozen=True)
class ListOf:
    """A JSON list whose every item has a kind."""

    item: Kind

    def check(self, value: object, verb: str, where: str) -> list:
        if not isinstance(value, list):
            raise ProtocolError(
                verb, f"{where or 'the answer'}: expected a list, got {shown(value)}"
            )
        for index, item in enumerate(value):
            check_kind(self.item, item, verb, f"{where}[{index}]")
        return value


@dataclass(frozen=True)
class Shape:
    """A JSON object: keys it must have and keys it may have, each of a kind (a type or
    tuple of types, a nested Shape or a ListOf)."""

    name: str
    required: Mapping[str, Kind]
    optional: Mapping[str, Kind] = field(default_factory=dict)

    def check(self, value: object, verb: str = "", where: str = "") -> dict:
        """value itself when it fits; ProtocolError naming the verb and the key if not."""
        verb = verb or self.name
        if not isinstance(value, dict):
            raise ProtocolError(
                verb, f"{where or 'the answer'}: expected an object, got {shown(value)}"
            )
        for key, kind in self.required.items():
            if key not in value:
                inside = f"{where}: " if where else ""
                raise ProtocolError(verb, f"{inside}the key {key!r} is missing")
            check_kind(kind, value[key], verb, f"{where}.{key}" if where else key)
        for key, kind in self.optional.items():
            if key in value:
                check_kind(kind, value[key], verb, f"{where}.{key}" if where else key)
        return value


Kind = type | tuple[type, ...] | Shape | ListOf


def shown(value: object) -> str:
    if isinstance(value, bool):
        return f"{value!r}".lower()
    for kind, name in TYPE_NAMES.items():
        if type(value) is kind:
            text = json.dumps(value)
            return name if len(text) > 40 else f"{name} {text}"
    return type(value).__name__


def expected(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:  # a float accepts a whole number: say "a number" once
        kinds = tuple(k for k in kinds if k is not int)
    return " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)


def fits(kinds: tuple[type, ...], value: object) -> bool:
    if isinstance(value, bool):  # JSON true is not the number 1
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return type(value) in kinds


def check_kind(kind: Kind, value: object, verb: str, where: str) -> object:
    if isinstance(kind, Shape | ListOf):
        return kind.check(value, verb, where)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not fits(kinds, value):
        raise ProtocolError(verb, f"{where}: expected {expected(kind)}, got {shown(value)}")
    return value


# --- from a declared type to its check --------------------------------------------------


def kind_of(hint: object, name: str) -> Kind:
    """The check of one annotation of an answer type: str, int, float, bool, None, a
    union of those, dict, list or list[X], or another answer type."""
    if hint is None or hint is NULL:
        return NULL
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        kinds: list[type] = []
        for member in typing.get_args(hint):
            member_kind = kind_of(member, name)
            if not isinstance(member_kind, type):
                raise TypeError(f"{name}: a union holds plain JSON types only, not {member}")
            kinds.append(member_kind)
        return tuple(kinds)
    if origin is list:
        (item,) = typing.get_args(hint)
        return ListOf(kind_of(item, name))
    if origin is dict or hint in (dict, list, str, int, float, bool):
        return origin or hint
    if typing.is_typeddict(hint):
        return shape_of(hint, name)
    raise TypeError(f"{name}: {hint!r} is not a JSON kind an answer may declare")


def shape_of(answer_type: type, name: str) -> Shape:
    """The check of a TypedDict answer type, under the verb's name."""
    hints = typing.get_type_hints(answer_type)
    required = answer_type.__required_keys__
    return Shape(
        name,
        {key: kind_of(hints[key], name) for key in hints if key in required},
        {key: kind_of(hints[key], name) for key in hints if key not in required},
    )


def list_of(answer_type: type, name: str) -> ListOf:
    return ListOf(shape_of(answer_type, name))
