"""CHECKS: every node health check the agent knows, in the order they run (the first
failing one names the drain). A new check (a registry.Check in its module under
health/checks/) is added here."""

from __future__ import annotations

from tacc_agent.health.checks import gpu, mounts, rdma, system
from tacc_agent.health.registry import Registry

CHECKS = Registry(
    (gpu.CHECK, rdma.CHECK, mounts.CHECK, system.SERVICES, system.DISK, system.MEMORY)
)
