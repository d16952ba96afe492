"""Slurm reservations (`scontrol show|create|delete reservation`): the root-only
maintenance reservation the acceptance gate tests a node in."""

from __future__ import annotations

from tacc_agent.slurm import oneliner, run


def exists(name: str, timeout: float = run.TIMEOUT) -> bool:
    """Whether Slurm has a reservation of that name; AgentError when it cannot say."""
    argv = ["scontrol", "show", "reservation", name, "--oneliner"]
    done = run.command(argv, timeout)
    records = [oneliner.parse_oneliner(line) for line in done.stdout.splitlines()]
    if done.code == 0 and any(r.get("ReservationName") == name for r in records):
        return True
    if done.code == 0 or "not found" in done.stderr + done.stdout:
        return False
    raise run.failure(argv, done)


def maintenance_argv(name: str, nodes: list[str], minutes: int) -> list[str]:
    """The scontrol command that reserves `nodes` for root alone, from now for `minutes`,
    whatever jobs run there (MAINT, IGNORE_JOBS)."""
    return [
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={name}",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
        "StartTime=now",
        f"Duration={minutes}",
        f"Nodes={','.join(nodes)}",
    ]


def create_maintenance(name: str, nodes: list[str], minutes: int, timeout: float) -> None:
    """Reserve `nodes` for root (maintenance_argv)."""
    run.output(maintenance_argv(name, nodes, minutes), timeout)


def delete(name: str, timeout: float = run.TIMEOUT) -> None:
    run.output(["scontrol", "delete", f"ReservationName={name}"], timeout)
