"""The trials of a sweep (`sweep.parameters`, a grid; the compile pass writes
`sweep.trials`, the explicit list). tcloud counts them before it submits, the agent
names each trial's parameters in `status`, and the sweep plug-in turns them into a job
array: all three read them here."""

from __future__ import annotations

import itertools


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
    count = 1
    for values in parameters.values():
        count *= len(values)
    return count


def trials_of(task) -> list[dict[str, str]]:
    """The trials of a task's sweep ([] when it has none)."""
    sweep = (task.extensions or {}).get("sweep") or {}
    if sweep.get("trials"):
        return list(sweep["trials"])
    return expand(sweep["parameters"]) if sweep.get("parameters") else []
