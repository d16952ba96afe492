"""Sampled sweeps (issue [24]): ranges drawn N times, at random or by a scrambled Sobol
sequence, from a seed.

    sweep:
      parameters:
        LR: {loguniform: [1.0e-4, 1.0e-1]}
        DROPOUT: {uniform: [0.0, 0.5]}
        LAYERS: {int: [2, 8]}          # both ends included
        OPT: {choice: [adam, sgd]}
        BATCH: [32, 64]                # a list is a choice too
      samples: 8
      sampler: sobol                   # or random (the default)
      seed: 23                         # optional: tcloud draws one and records it

Only the compiler draws (on the researcher's machine, Sweep.compile): it writes the
trials into the instruction as text, the seed with them, so the cluster checks them
against their ranges (`fits`) and a rerun runs the same ones without drawing again.
"""

from __future__ import annotations

import math
import random
import re
import secrets
import warnings
from collections.abc import Mapping

from tacc_contract.trials import RANGE_KINDS, text_of

SAMPLERS = ("random", "sobol")
SCALAR = (str, int, float, bool)
DIGITS = 6  # significant digits of a drawn real: the text recorded is what the trial gets
SEED_LIMIT = 2**31  # a seed tcloud draws: below it, so any tool can repeat it
SHAPES = (
    "{uniform: [low, high]}, {loguniform: [low, high]} (low > 0), "
    "{int: [low, high]} or {choice: [value, ...]}"
)


NUMBER = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")
INTEGER = re.compile(r"-?[0-9]{1,16}")
INT_LIMIT = 2**53  # an int range's ends: exact as floats too


def number(value: object) -> float | None:
    """A bound as a float; YAML 1.1 reads 1e-4 (no dot) as text, so numeric text counts
    (plain decimal or exponent notation only)."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str) and NUMBER.fullmatch(value.strip()):
            return float(value)
    except (OverflowError, ValueError):
        return None
    return None


def bounds(args: list) -> tuple[float, float]:
    """A checked range's [low, high] as floats (range_problem has checked them)."""
    low, high = (number(v) for v in args)
    if low is None or high is None:
        raise ValueError(f"not a range: {args!r}")
    return low, high


def range_problem(name: str, spec: object) -> str | None:
    """What is wrong with one sampled parameter, or None."""
    if not isinstance(spec, Mapping) or len(spec) != 1:
        return f"{name}: one of {SHAPES}"
    ((kind, args),) = spec.items()
    if kind not in RANGE_KINDS:
        return f"{name}: {kind!r} is not a kind of range; one of {SHAPES}"
    if kind == "choice":
        if not isinstance(args, list) or not args or not all(isinstance(v, SCALAR) for v in args):
            return f"{name}: choice takes a non-empty list of numbers or strings"
        return None
    bounds = [number(v) for v in args] if isinstance(args, list) and len(args) == 2 else []
    if len(bounds) != 2 or None in bounds or not all(math.isfinite(b) for b in bounds):
        return f"{name}: {kind} takes [low, high], two finite numbers"
    low, high = bounds
    if kind == "int" and not all(isinstance(v, int) and not isinstance(v, bool) for v in args):
        return f"{name}: int takes [low, high], two whole numbers"
    if kind == "int" and not -INT_LIMIT < low < high < INT_LIMIT:
        return f"{name}: int takes [low, high] with low < high, both within +-2**53"
    if not math.isfinite(high - low):
        return f"{name}: {kind} takes [low, high] whose difference is a finite number"
    if not low < high:
        return f"{name}: {kind} needs low < high, got [{args[0]}, {args[1]}]"
    if kind == "loguniform" and low <= 0:
        return f"{name}: loguniform needs low > 0, got {args[0]}"
    return None


def as_range(values: object) -> tuple[str, list]:
    """(kind, arguments) of a sampled parameter; a plain list is a choice."""
    if isinstance(values, Mapping):
        ((kind, args),) = values.items()
        return kind, list(args)
    return "choice", list(values)  # type: ignore[arg-type]


def real_text(value: float, low: float, high: float) -> str:
    """The drawn real as the text a trial gets: DIGITS significant digits, inside the
    range even after rounding."""
    text = f"{value:.{DIGITS}g}"
    return text if low <= float(text) <= high else f"{min(max(value, low), high)!r}"


def value_at(values: object, u: float) -> str:
    """The parameter's value at the point u of [0, 1)."""
    kind, args = as_range(values)
    if kind == "choice":
        return text_of(args[min(int(u * len(args)), len(args) - 1)])
    low, high = bounds(args)
    if kind == "int":
        first, last = (int(v) for v in args)
        span = last - first
        return str(first + min(int(u * (span + 1)), span))
    if kind == "loguniform":
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        value = low + u * (high - low)
    return real_text(value, low, high)


def unit_points(count: int, dimensions: int, sampler: str, seed: int) -> list[list[float]]:
    """`count` points of [0, 1)^dimensions."""
    if sampler == "sobol":
        # scipy's scrambled Sobol (Owen scrambling): only a Sobol sweep's compile, on the
        # researcher's machine, loads it; the cluster never draws.
        from scipy.stats import qmc  # lazy sampler import

        engine = qmc.Sobol(dimensions, scramble=True, rng=seed)
        with warnings.catch_warnings():  # a count not a power of two: balance not exact
            warnings.simplefilter("ignore", UserWarning)
            return engine.random(count).tolist()
    draw = random.Random(seed)  # noqa: S311 - a reproducible search, not a secret
    return [[draw.random() for _ in range(dimensions)] for _ in range(count)]


def new_seed() -> int:
    return secrets.randbelow(SEED_LIMIT)


def sample(parameters: Mapping, count: int, sampler: str, seed: int) -> list[dict[str, str]]:
    """`count` trials, each parameter drawn from its range (in the file's order)."""
    names = list(parameters)
    points = unit_points(count, len(names), sampler, seed)
    return [
        {name: value_at(parameters[name], u) for name, u in zip(names, point, strict=True)}
        for point in points
    ]


def fits(values: object, text: object) -> bool:
    """Whether a recorded trial's value can come from the parameter's range (the
    cluster's check of what the compiler wrote)."""
    if not isinstance(text, str):
        return False
    kind, args = as_range(values)
    if kind == "choice":
        return text in {text_of(v) for v in args}
    try:
        low, high = bounds(args)
    except ValueError:
        return False
    if kind == "int":
        return INTEGER.fullmatch(text) is not None and low <= int(text) <= high
    got = number(text) if NUMBER.fullmatch(text) else None
    return got is not None and math.isfinite(got) and low <= got <= high
