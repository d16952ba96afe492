"""How far each trial of a sweep got and which is best (issue [24]): the metric its
program last reported at a rung through tacc_fluid (the fluid plug-in's result file in
the trial's own directory, read with that plug-in's checks), for `tcloud status SWEEP`
(trials best first) and `tcloud download SWEEP --best`."""

from __future__ import annotations

import math
from pathlib import Path

from tacc_plugins import fluid


def progress(trial_dir: Path, adaptive: dict | None) -> dict:
    """The trial's metric, its value at the last rung it reached, that rung and whether
    ASHA stopped it; {} when the sweep is not adaptive or the trial reported nothing."""
    if adaptive is None:
        return {}
    result = fluid.read_result(trial_dir)
    if result is None:
        return {}
    return {
        "metric": adaptive["metric"],
        "value": finite(result.get("value")),
        "rung": result["rung"],
        "rungs": result["rungs"],
        "stopped": result.get("stopped") is True,
    }


def finite(value: object) -> float | None:
    """A reported value as a finite float, None for anything else (the result file is
    the trial program's: text, NaN, an integer too large for a float)."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def best_first(trials: list[dict], mode: str) -> list[dict]:
    """The trials ordered best first: the highest rung reached, then the best value there
    (`mode` max or min); trials with no value after, in their own order."""

    def key(trial: dict) -> tuple:
        value = trial.get("value")
        if value is None:
            return (1, 0, 0.0, trial.get("trial", 0))
        return (0, -trial["rung"], -value if mode == "max" else value, trial.get("trial", 0))

    return sorted(trials, key=key)


def best_of(ranked: list[dict]) -> str | None:
    """The best trial's id, None while no trial has a value."""
    return ranked[0]["job_id"] if ranked and ranked[0].get("value") is not None else None
