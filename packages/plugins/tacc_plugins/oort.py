"""Stub: the `oort` plug-in of issue [16] (being built)."""

from __future__ import annotations

from tacc_contract.plugins import Plugin


class Oort(Plugin):
    name = "oort"
    order = 85
    layers = ("execute",)
    summary = "(being built)"
    default_on = False
