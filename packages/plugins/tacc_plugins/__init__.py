"""Plug-ins that shape a task in one of the four layers (schema, compile, schedule,
execute): the interface is tacc_contract.plugins, discovery and selection
tacc_contract.registry, and every built-in technique is one module here. docs/plugins.md
explains all three. They are found through this distribution's `tacc.plugins` entry
points (pyproject.toml); BUILTIN names the same modules for a source tree without
installed metadata (tools/gpu_check.py; a test keeps the two equal)."""

BUILTIN = (
    "tacc_plugins.gpu_share",
    "tacc_plugins.elastic",
    "tacc_plugins.gpu_types",
    "tacc_plugins.sweep",
    "tacc_plugins.duration",
    "tacc_plugins.las",
    "tacc_plugins.tiresias",
    "tacc_plugins.allox",
    "tacc_plugins.oort",
    "tacc_plugins.launcher",
    "tacc_plugins.transport",
    "tacc_plugins.fluid",
)
