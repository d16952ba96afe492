"""Slurm's reading of a hostlist expression, written for the tests: test_hostlist.py and
tests/playbook/test_slurm_conf_render.py expand what the slurm role writes with it."""

from __future__ import annotations

import re


def expand(expr: str) -> list[str]:
    """Slurm's reading of a hostlist, written for the tests: comma-separated terms, each a
    plain name or PREFIX[LO-HI,N,...] (the bracket ending the name); every range printed
    with the width of its LO."""
    names: list[str] = []
    for term in re.findall(r"[^,\[\]]*\[[^\]]*\]|[^,]+", expr):
        assert term and not re.search(r"\s", term), f"bad term {term!r} in {expr!r}"
        if "[" not in term:
            assert "]" not in term, expr
            names.append(term)
            continue
        prefix, body = term.split("[")
        assert body.endswith("]"), f"the range must end the name: {term!r}"
        for element in body[:-1].split(","):
            lo, _, hi = element.partition("-")
            assert lo.isdigit() and (not hi or hi.isdigit()), f"bad range {element!r}"
            assert int(lo) <= int(hi or lo), f"descending range {element!r}"
            names += [f"{prefix}{v:0{len(lo)}d}" for v in range(int(lo), int(hi or lo) + 1)]
    return names
