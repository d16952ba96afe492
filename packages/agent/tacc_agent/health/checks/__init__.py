"""Node health checks (issue [6]), one module per subject, each bounded in time and
reading from configurable sysfs/procfs roots so tests run them on fixture trees.

CHECKS is the registry: every check the agent knows, in the order they run (the first
failing one names the drain). A new check declares itself in its module as a
registry.Check (name, `run(ctx) -> Result`, default-on flag, metric families) and is
added here."""

from tacc_agent.health.checks import gpu, mounts, rdma, system
from tacc_agent.health.registry import Registry

CHECKS = Registry((gpu.CHECK, rdma.CHECK, mounts.CHECK, system.SERVICES, system.DISK,
                   system.MEMORY))  # fmt: skip
