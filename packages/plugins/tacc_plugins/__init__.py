"""Plug-ins that shape a task in one of the four layers (schema, compile, schedule,
execute): the interface is tacc_contract.plugins, discovery and selection tacc_contract.registry,
and every built-in technique is one module here. docs/plugins.md explains all three."""
