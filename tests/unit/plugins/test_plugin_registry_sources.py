"""Where the registry finds plug-ins: the tacc-plugins distribution's entry points (the
same modules as tacc_plugins.BUILTIN), and never silently none."""

from __future__ import annotations

import pytest

from tacc_contract import registry
from tacc_plugins import BUILTIN


def test_the_entry_points_are_the_builtin_modules_in_hook_order():
    assert set(registry.entry_point_modules()) >= set(BUILTIN)
    builtin_names = [cls.name for module in BUILTIN for cls in registry.plugins_in(module)]
    assert [n for n in registry.available() if n in builtin_names] == builtin_names


@pytest.mark.bad_input
def test_no_plugin_installed_is_an_error_not_a_run_without_launcher_or_transport(monkeypatch):
    monkeypatch.setattr(registry, "entry_point_modules", list)
    with pytest.raises(registry.PluginError, match=r"no plug-in is installed.*TACC_PLUGINS"):
        registry.available()
    # A source tree without metadata names the modules (tools/gpu_check.py does).
    assert list(registry.available(["tacc_plugins.launcher"])) == ["launcher"]
