"""Built-in execution plug-in: fail-safe transport switching. RDMA when every allocated
node has an active RDMA port, else TCP with NCCL_IB_DISABLE=1, with the reason for the
job log. The ranks agree (`Launch.agree`): rank 0 decides from every rank's facts (each
rank's `rdma` as the agent read it: the node's fresh facts file, else sysfs) and the
other ranks use what it decided, so all agree even if a rank's facts came late; a rank
that never hears the decision falls back to TCP."""

from __future__ import annotations

from dataclasses import asdict

from tacc_contract.plugins import Launch, Plugin, Transport

RDMA_ENV = {"NCCL_IB_DISABLE": "0"}
TCP_ENV = {"NCCL_IB_DISABLE": "1"}


def choose(requested: str, ranks: list[dict]) -> Transport:
    """ranks: each rank's facts {"host", "rdma": {"active_ports"}} (a node with several
    ranks is named once)."""
    if requested == "tcp":
        return Transport("tcp", "the task asks for tcp", TCP_ENV)
    ranks = list({r["host"]: r for r in ranks}.values())
    lacking = [r["host"] for r in ranks if not r.get("rdma", {}).get("active_ports")]
    if ranks and not lacking:
        counts = ", ".join(f"{r['host']}: {r['rdma']['active_ports']}" for r in ranks)
        return Transport("rdma", f"active RDMA ports on every node ({counts})", RDMA_ENV)
    why = f"no active RDMA port on {', '.join(lacking)}" if lacking else "no node facts"
    if requested == "rdma":
        why = f"the task asks for rdma, but {why}; falling back"
    return Transport("tcp", f"{why} (fail-safe switching, NCCL_IB_DISABLE=1)", TCP_ENV)


def agreed(launch: Launch) -> Transport:
    """The transport every rank of the job uses."""
    requested = launch.task.runtime["transport"]
    decided = launch.agree("transport", lambda ranks: asdict(choose(requested, ranks)))
    return Transport(**decided) if decided else choose("tcp", [])


class FailSafeTransport(Plugin):
    name = "transport"
    order = 80
    layers = ("execute",)
    summary = "RDMA when every allocated node has an active port, else TCP"

    def execute(self, launch: Launch) -> None:
        choice = agreed(launch)
        launch.transport = choice
        launch.env.update(choice.env, TACC_TRANSPORT=choice.name)
        launch.note(self.name, f"{choice.name}: {choice.reason}")
