"""Which plug-ins exist and which are on.

Plug-ins come from two places, in this order: the Python entry point group
`tacc.plugins` (an installed package registers `name = "module"`; the built-ins of the
tacc-plugins distribution come first), and modules named in a selection
(`TACC_PLUGINS=mylab.plugin`, a task's `plugins:`, the agent's `plugins:` setting).
A module contributes every `Plugin` subclass it defines.

A selection is a list of words: `name` or `+name` turns a plug-in on, `-name` off, and a
dotted module path loads that module and turns its plug-ins on. Anything else is a
PluginError that names the word and what exists.

Only the operator's words (the agent's `plugins:` setting) and the researcher's own
environment ($TACC_PLUGINS) may name modules. A task's words (`task=`) come from a file
anyone may have written, so they name registered plug-ins only: a module path there is
an unknown plug-in, and nothing is imported for it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import re
from collections.abc import Iterable

from tacc_contract.plugins import LAYERS, Plugin

# The distribution of the built-in plug-ins: its entry points come first, in file order.
BUILTIN_DISTRIBUTION = "tacc-plugins"
ENTRY_POINT_GROUP = "tacc.plugins"
ENV = "TACC_PLUGINS"
WORD = re.compile(r"[+-]?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class PluginError(Exception):
    """A selection word that names no plug-in, or a module that cannot be loaded."""

    def __init__(self, message: str, word: str = "") -> None:
        super().__init__(message)
        self.word = word


def plugins_in(module_name: str) -> list[type[Plugin]]:
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a broken third-party module: say which and why
        raise PluginError(
            f"plug-in module {module_name!r} cannot be loaded: {exc}", module_name
        ) from None
    found = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if issubclass(cls, Plugin) and cls.__module__ == module.__name__ and cls.name
    ]
    if not found:
        raise PluginError(
            f"module {module_name!r} defines no plug-in (a Plugin subclass)", module_name
        )
    return found


def entry_point_modules() -> list[str]:
    """The modules of the `tacc.plugins` entry points: the built-ins first."""
    return list(installed_entry_point_modules())


@functools.cache
def installed_entry_point_modules() -> tuple[str, ...]:
    """entry_point_modules, read once per process: scanning every installed
    distribution's metadata is most of a plug-in selection's cost, and a job's wrapper
    selects more than once. A plug-in installed later is seen by the next process (the
    tacc_agent role restarts the daemon after every install)."""
    # Lazy: importlib.metadata (email, zipfile, csv) costs every start that imports the
    # schema; only a plug-in selection reads entry points.
    import importlib.metadata  # lazy start-up import

    points = list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))
    builtin = [ep for ep in points if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION]
    others = [ep for ep in points if ep not in builtin]
    return tuple(dict.fromkeys(ep.value.split(":")[0] for ep in [*builtin, *others]))


def available(modules: Iterable[str] = ()) -> dict[str, type[Plugin]]:
    """name -> class, in the order hooks run within a layer (`Plugin.order`, then as
    found: entry points, built-ins first, then `modules`)."""
    found: dict[str, type[Plugin]] = {}
    sources = [*entry_point_modules(), *modules]
    if not sources:
        # Never run without the launcher and the fail-safe transport by accident.
        raise PluginError(
            f"no plug-in is installed: the entry point group {ENTRY_POINT_GROUP!r} is empty "
            f"(install tacc-plugins; from a source tree without its metadata, name the "
            f"modules in ${ENV})"
        )
    for module_name in sources:
        for cls in plugins_in(module_name):
            found.setdefault(cls.name, cls)
    ranked = sorted(enumerate(found.items()), key=lambda item: (item[1][1].order, item[0]))
    return {name: cls for _, (name, cls) in ranked}


def is_module(word: str) -> bool:
    return "." in word.lstrip("+-")


def check_words(words: Iterable[str]) -> str | None:
    """None when every word is well-formed, else what is expected."""
    for word in words:
        if not WORD.fullmatch(word):
            return f"plug-in names (+name, -name) or module paths, not {word!r}"
    return None


def unknown(word: str, known: dict[str, type[Plugin]]) -> PluginError:
    return PluginError(
        f"unknown plug-in {word.lstrip('+-')!r}; available: {', '.join(sorted(known))}", word
    )


def select(
    *selections: Iterable[str], task: Iterable[str] = (), policy_from: Iterable[str] = ()
) -> list[Plugin]:
    """The plug-ins that are on, in registry order, after applying each selection in
    turn to the defaults, then the task's own words. Words in `policy_from` may also
    turn off policy plug-ins (ops' configuration); other selections (a task's own) may
    not. Only `selections` may name modules; a module path among `task` is refused
    before anything is imported."""
    trusted = [w for selection in selections for w in selection]
    modules = [w.lstrip("+") for w in trusted if is_module(w) and not w.startswith("-")]
    known = available(modules)
    task_words = list(task)
    for word in task_words:
        if is_module(word):
            raise PluginError(
                f"{unknown(word, known)}; a task names registered plug-ins only (a module "
                f"path belongs in ${ENV} or the agent's plugins setting)",
                word,
            )
    words = [*trusted, *task_words]
    on = {name for name, cls in known.items() if cls.default_on}
    ops_words = set(policy_from)
    for word in words:
        if is_module(word):
            if not word.startswith("-"):
                on.update(cls.name for cls in plugins_in(word.lstrip("+")))
            continue
        name = word.lstrip("+-")
        if name not in known:
            raise unknown(word, known)
        if word.startswith("-"):
            if known[name].policy and word not in ops_words:
                raise PluginError(
                    f"plug-in {name!r} is cluster policy; only ops can turn it off", word
                )
            on.discard(name)
        else:
            on.add(name)
    return [cls() for name, cls in known.items() if name in on]


def from_env() -> list[str]:
    return [w for w in os.environ.get(ENV, "").replace(",", " ").split() if w]


def in_layer(plugins: Iterable[Plugin], layer: str) -> list[Plugin]:
    if layer not in LAYERS:
        raise ValueError(f"unknown layer {layer!r}; the layers: {', '.join(LAYERS)}")
    return [p for p in plugins if layer in p.layers]


def describe(known: dict[str, type[Plugin]], on: Iterable[Plugin]) -> list[dict]:
    """One row per plug-in, for `tcloud plugins` and docs."""
    active = {p.name for p in on}
    return [
        {
            "name": name,
            "layers": list(cls.layers),
            "on": name in active,
            "default": "on" if cls.default_on else "off",
            "policy": cls.policy,
            "summary": cls.summary,
        }
        for name, cls in known.items()
    ]
