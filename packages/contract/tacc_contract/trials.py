"""The trials of a sweep. `sweep.parameters` is a grid (lists: every combination) or,
with `sweep.samples`, ranges sampled N times; the compile pass writes `sweep.trials`,
the explicit list, so the cluster never samples and a rerun runs the same trials.
tcloud counts them before it submits, the agent names each trial's parameters in
`status`, and the sweep plug-in turns them into a job array: all three read them here."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

# A sampled parameter: {KIND: ARGUMENTS} (tacc_plugins/sampling.py draws and checks them).
RANGE_KINDS = ("uniform", "loguniform", "int", "choice")


def text_of(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def expand(parameters: dict[str, list]) -> list[dict[str, str]]:
    """Every combination, the first parameter varying slowest."""
    names = list(parameters)
    combos = itertools.product(*(parameters[n] for n in names))
    return [{n: text_of(v) for n, v in zip(names, combo, strict=True)} for combo in combos]


def trial_count(parameters: dict[str, list]) -> int:
    """The grid's size: the product of its lists' lengths."""
    count = 1
    for values in parameters.values():
        count *= len(values)
    return count


def is_sampled(sweep: Mapping) -> bool:
    """A sweep whose trials are drawn (a range among its parameters, or `samples` set)
    rather than every combination of its lists."""
    parameters = sweep.get("parameters") or {}
    return sweep.get("samples") is not None or any(
        isinstance(values, Mapping) for values in parameters.values()
    )


def planned_count(sweep: Mapping) -> int:
    """How many trials the sweep has: its compiled list, else `samples` for a sampled
    one, else the grid's size."""
    if sweep.get("trials"):
        return len(sweep["trials"])
    if is_sampled(sweep):
        return int(sweep.get("samples") or 0)
    return trial_count(sweep["parameters"]) if sweep.get("parameters") else 0


def trials_of(task) -> list[dict[str, str]]:
    """The trials of a task's sweep ([] when it has none, or a sampled sweep not yet
    compiled: only the compiler draws them)."""
    sweep = (task.extensions or {}).get("sweep") or {}
    if sweep.get("trials"):
        return list(sweep["trials"])
    if not sweep.get("parameters") or is_sampled(sweep):
        return []
    return expand(sweep["parameters"])
