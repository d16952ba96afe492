"""Plug-ins that shape a task in one of the four layers (schema, compile, schedule,
execute): the interface is tacc_plugins.api, discovery and selection tacc_plugins.registry,
and every built-in technique is one module here. docs/plugins.md explains all three."""
