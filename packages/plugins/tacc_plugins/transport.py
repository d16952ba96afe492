"""Built-in execution plug-in: fail-safe transport switching. Rank 0 decides from every
rank's facts (RDMA when every node has an active port, else TCP with
NCCL_IB_DISABLE=1) and the other ranks use what it wrote (tacc_agent/transport.py)."""

from __future__ import annotations

from tacc_contract.plugins import Launch, Plugin


class FailSafeTransport(Plugin):
    name = "transport"
    order = 80
    layers = ("execute",)
    summary = "RDMA when every allocated node has an active port, else TCP"

    def execute(self, launch: Launch) -> None:
        from tacc_agent.tasks.execute import agree_on_transport

        choice = agree_on_transport(
            launch.task, launch.job_dir, launch.rank, launch.wrappers, launch.config
        )
        launch.transport = choice
        launch.env.update(choice.env, TACC_TRANSPORT=choice.name)
        launch.note(self.name, f"{choice.name}: {choice.reason}")
