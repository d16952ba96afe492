"""`tacc-agent check`: every enabled health check once (the registry in health.catalog,
less what the agent config's `checks` turns off), each bounded in time; on a failure the
node is drained in Slurm with reason "tacc: <check>: <detail>", and only a node drained
with that tag is resumed when the checks pass again: a node an admin drained is never
touched. A check turned off does not run, so it can neither drain nor hold a node.
Usable as Slurm's HealthCheckProgram."""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.health.catalog import CHECKS
from tacc_agent.health.checks.base import Result
from tacc_agent.health.registry import Check, CheckContext, Registry
from tacc_agent.procfs.system import boot_id

TAG = "tacc:"
# Drains of the acceptance gate (`tacc-agent accept`) and of rolling maintenance
# (playbooks/rolling.yml): only they resume such a node, never a passing check run.
HELD_TAGS = ("tacc: acceptance", "tacc: rolling")


def context(config: AgentConfig) -> CheckContext:
    return CheckContext(
        config, Path(config.state_dir), config.check_timeout_seconds, boot_id(config.proc_root)
    )


def enabled(config: AgentConfig, registry: Registry = CHECKS) -> list[Check]:
    """The checks this node runs; an unknown name in its `checks` setting is an error."""
    return registry.selected(config.checks)


def run(checks: list[Check], config: AgentConfig) -> list[Result]:
    ctx = context(config)
    return [check(ctx) for check in checks]


def run_checks(config: AgentConfig, registry: Registry = CHECKS) -> list[Result]:
    return run(enabled(config, registry), config)


def drain_reason(results: list[Result]) -> str:
    first = next(r for r in results if r.failed)
    return f"{TAG} {first.check}: {first.detail}"[:200]


@dataclass(frozen=True)
class SlurmOutcome:
    """What a check run did to the node in Slurm."""

    said: str  # in words, for the journal and `tacc-agent check`
    drained_by_agent: bool = False  # drained now, for this agent's failing check


def apply_to_slurm(results: list[Result], node: str, timeout: float) -> SlurmOutcome:
    """Drain or resume this node."""
    try:
        found = slurm.nodes.node(node, timeout)
    except AgentError as exc:
        return SlurmOutcome(f"slurm: not asked ({exc})")
    if found is None:
        return SlurmOutcome(f"slurm: {node} is not a Slurm node here")
    state, reason = found.state, found.reason
    ours = reason.startswith(TAG) and not reason.startswith(HELD_TAGS)
    drained = "DRAIN" in state
    failing = any(r.failed for r in results)
    if failing and drained and not ours:
        return SlurmOutcome(f"slurm: {node} was drained by an admin ({reason}); left alone")
    if failing:
        wanted = drain_reason(results)
        if drained and reason == wanted:
            return SlurmOutcome(f"slurm: {node} already drained: {wanted}", drained_by_agent=True)
        slurm.nodes.drain(node, wanted, timeout)
        return SlurmOutcome(f"slurm: drained {node}: {wanted}", drained_by_agent=True)
    if drained and ours:
        slurm.nodes.resume(node, timeout)
        return SlurmOutcome(f"slurm: resumed {node} (was: {reason})")
    return SlurmOutcome(f"slurm: {node} {state.lower() or 'unknown'}, nothing to do")


def check(config: AgentConfig, as_json: bool, use_slurm: bool) -> int:
    results = run_checks(config)
    node = socket.gethostname()
    action = (
        apply_to_slurm(results, node, config.slurm_timeout_seconds).said
        if (use_slurm and config.drain)
        else "slurm: not asked"
    )
    failed = any(r.failed for r in results)
    if as_json:
        print(
            json.dumps(
                {
                    "node": node,
                    "healthy": not failed,
                    "slurm": action,
                    "checks": [asdict(r) for r in results],
                },
                indent=1,
            )
        )
    else:
        for r in results:
            print(f"{r.check:<9} {r.status:<7} {r.seconds:6.3f}s  {r.detail}")
        print(action)
    return 1 if failed else 0
