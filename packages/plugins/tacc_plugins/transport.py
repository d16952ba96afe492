"""Built-in execution plug-in: fail-safe transport switching. RDMA when every allocated
node has an active RDMA port (NCCL over InfiniBand/RoCE, OpenMPI's UCX), else TCP with
NCCL_IB_DISABLE=1 and the nodes' OpenMPI defaults (the mpi role: UCX off), with the
reason for the job log. Where a node the inventory gives RDMA (group rdma_nodes) has
none active, the fallback is a warning the job's owner sees in `tcloud status` and
`tcloud logs`; a task that asks for `transport: rdma` is not run over TCP: it fails
with the reason. The ranks
agree (`Launch.agree`): rank 0 decides from every rank's facts (each rank's `rdma` as
the agent read it: the node's fresh facts file, else sysfs) and the other ranks use what
it decided, so all agree even if a rank's facts came late; a rank that never hears the
decision falls back to TCP."""

from __future__ import annotations

from dataclasses import asdict, replace

from tacc_contract.errors import AgentError
from tacc_contract.plugins import Launch, Plugin, Transport

# OpenMPI through UCX (pml and one-sided), its RDMA-era BTLs off, for the whole job: the
# ranks agree on the transport, so every rank selects the same PML (a job whose ranks
# mix ucx and ob1 fails in MPI_Init). mpirun passes OMPI_MCA_* on to the ranks it starts.
# OpenMPI's own UCX device list is mlx* only: on another vendor's RDMA NIC (irdma,
# bnxt_re) the ucx PML would refuse to start and fail MPI_Init, so any device and any
# UCX transport are allowed (UCX then takes the RDMA one between nodes, shared memory
# within one).
RDMA_ENV = {
    "NCCL_IB_DISABLE": "0",
    "OMPI_MCA_pml": "ucx",
    "OMPI_MCA_osc": "ucx",
    "OMPI_MCA_btl": "^uct,openib,ofi",
    "OMPI_MCA_pml_ucx_devices": "any",
    "OMPI_MCA_pml_ucx_tls": "any",
}
TCP_ENV = {"NCCL_IB_DISABLE": "1"}


def choose(requested: str, ranks: list[dict]) -> Transport:
    """ranks: each rank's facts {"host", "rdma": {"active_ports", "declared"}} (a node
    with several ranks is named once)."""
    if requested == "tcp":
        return Transport("tcp", "the task asks for tcp", TCP_ENV)
    ranks = list({r["host"]: r for r in ranks}.values())
    lacking = [r for r in ranks if not r.get("rdma", {}).get("active_ports")]
    if ranks and not lacking:
        counts = ", ".join(f"{r['host']}: {r['rdma']['active_ports']}" for r in ranks)
        return Transport("rdma", f"active RDMA ports on every node ({counts})", RDMA_ENV)
    names = ", ".join(r["host"] for r in lacking)
    why = f"no active RDMA port on {names}" if lacking else "no node facts"
    if requested == "rdma":
        error = f"transport: rdma: {why}; the job does not run over TCP (transport: auto would)"
        return Transport("none", error, {}, error=error)
    fallback = Transport("tcp", f"{why} (fail-safe switching, NCCL_IB_DISABLE=1)", TCP_ENV)
    down = [r["host"] for r in lacking if r.get("rdma", {}).get("declared")]
    if not down:
        return fallback
    warning = (
        f"RDMA is down on {', '.join(down)}, which the inventory gives RDMA: this job runs "
        "over TCP, slower (the node's rdma health check says why; transport: rdma fails "
        "instead of falling back)"
    )
    return replace(fallback, warning=warning)


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
        if choice.error:
            raise AgentError(choice.error)
        launch.transport = choice
        # OpenMPI settings the task makes itself stay (an MPI built without UCX keeps
        # its ob1): the same on every rank, so the ranks still agree.
        own = launch.task.environment["env"]
        env = {k: v for k, v in choice.env.items() if not (k.startswith("OMPI_MCA_") and k in own)}
        launch.env.update(env, TACC_TRANSPORT=choice.name)
        launch.note(self.name, f"{choice.name}: {choice.reason}")
