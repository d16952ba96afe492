"""Checking a plug-in's settings from the agent's config (`plugin_settings.<plug-in>`):
unknown keys and values of the wrong kind stop its tick with an error naming the key,
what is expected and what was given."""

from __future__ import annotations

from collections.abc import Iterable

from tacc_contract.errors import AGENT_CLUSTER, AgentError
from tacc_contract.plugins import settings_of


def bad_setting(plugin: str, key: str, expected: str, value: object) -> AgentError:
    return AgentError(
        f"agent config: plugin_settings.{plugin}.{key}: expected {expected}, got {value!r}",
        AGENT_CLUSTER,
    )


def known_settings(config: object, plugin: str, known: Iterable[str]) -> dict:
    """The plug-in's settings; AgentError when one of its keys is none of `known`."""
    given = settings_of(config, plugin)
    known = tuple(known)
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise AgentError(
            f"agent config: plugin_settings.{plugin}: unknown key(s) "
            f"{', '.join(unknown)} (known: {', '.join(known)})",
            AGENT_CLUSTER,
        )
    return given


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def is_whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
