"""Stub: the `fluid` plug-in of issue [16] (being built)."""

from __future__ import annotations

from tacc_contract.plugins import Plugin


class Fluid(Plugin):
    name = "fluid"
    order = 85
    layers = ("execute",)
    summary = "(being built)"
    default_on = False
