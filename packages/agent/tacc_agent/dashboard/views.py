"""What each of the dashboard's API calls answers, as the caller: their jobs, one job,
cancel and halt through the same agent verbs `tcloud` calls (a session's runner: the
words checked by the verb's own declaration), their quota, the cluster's free GPUs by
type, and the Prometheus figures the broker on the monitoring host gives them.

Nothing here reads another user's job: the verbs answer from the caller's own index and
Slurm's view of the caller; the GPU counts come from `scontrol show node` (no job or
user in them); the ops figures only for a member of the admin group, and the broker
checks that again with the caller's MUNGE identity."""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import BinaryIO

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.dashboard import broker_client
from tacc_agent.dashboard.broker_asks import who
from tacc_agent.errors import AGENT_REJECTED, AgentError
from tacc_agent.slurm import gres
from tacc_contract import verbs
from tacc_contract.jobs import FINAL_STATES
from tacc_contract.verbs import Verb

# (words after `tacc-agent`, the request's stdin, a reader) -> (exit code, answer or error)
VerbRunner = Callable[[list[str], bytes, BinaryIO | None], tuple[int, object]]
ENDED = (*FINAL_STATES, "HALTED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED")
UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "MAINT", "INVALID", "FUTURE")
UNTYPED = "gpu"
JOBS_SHOWN = 200  # the newest jobs on the home page (`tcloud ps --limit 200`)
NO_BROKER = (
    "no plots: this cluster's agent has no dashboard_broker_url (the inventory has no "
    "monitoring group)"
)


class ViewError(Exception):
    """An answer the page shows as its error line, with the HTTP status it goes with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Caller:
    """The user the server runs as, and whether they may see the ops view."""

    user: str
    admin: bool
    host: str


def caller(config: AgentConfig) -> Caller:
    """The server's user and whether it is an admin, by the broker's own rule (who)."""
    found = who(os.getuid(), config.dashboard_admin_group)
    if found is None:
        raise AgentError(f"uid {os.getuid()} has no account on this login node")
    return Caller(found.name, found.admin, socket.gethostname())


@dataclass
class Views:
    """The answers, as the caller; `run` runs one verb (the session's runner)."""

    config: AgentConfig
    run: VerbRunner
    me: Caller

    def verb(self, verb: Verb, **fields: object) -> object:
        rc, answer = self.run(verb.request(**fields), b"", None)
        if rc != 0:
            message = answer.get("error") if isinstance(answer, dict) else None
            status = 404 if rc == AGENT_REJECTED else 502
            raise ViewError(str(message or f"{verb.name} failed (exit {rc})"), status)
        return answer

    def whoami(self) -> dict:
        from_agent = {"user": self.me.user, "admin": self.me.admin, "host": self.me.host}
        return {**from_agent, "version": agent_version()}

    def jobs(self) -> dict:
        return {"jobs": self.verb(verbs.JOB_PS, limit=JOBS_SHOWN)}

    def job(self, job: str) -> object:
        return self.verb(verbs.JOB_STATUS, job=job)

    def cancel(self, job: str) -> dict:
        return {"cancelled": self.verb(verbs.JOB_CANCEL, jobs=[job])}

    def halt(self, job: str) -> dict:
        return {"halted": self.verb(verbs.JOB_HALT, job=job)}

    def quota(self) -> object:
        return self.verb(verbs.QUOTA)

    def hours(self) -> object:
        """`tcloud usage`: the caller's CPU and GPU seconds by month, account, partition."""
        return self.verb(verbs.USAGE)

    def gpus(self) -> dict:
        nodes = slurm.nodes.all_nodes(self.config.slurm_timeout_seconds)
        return {"types": free_gpus(nodes), "nodes": sum(1 for node in nodes if node.gpus)}

    def usage(self, job: str) -> dict:
        status = self.job(job)
        if not isinstance(status, dict) or not str(status.get("job_id", "")).isdigit():
            return {"series": [], "problem": "plots are per job: open one trial of the sweep"}
        start, end = run_window(status.get("history") or [], status.get("state", ""))
        if start is None:
            return {"series": [], "problem": "the job has not started: no figures yet"}
        request = {"ask": "job", "job": status["job_id"], "start": start, "end": end}
        return self.broker(request, {"series": []})

    def broker(self, request: dict, empty: dict) -> dict:
        url = self.config.dashboard_broker_url
        if not url:
            return {**empty, "problem": NO_BROKER}
        try:
            return broker_client.ask(url, request)
        except broker_client.BrokerUnavailable as exc:
            return {**empty, "problem": str(exc)}

    # --- ops ------------------------------------------------------------------------

    def admin_only(self) -> None:
        if not self.me.admin:
            group = self.config.dashboard_admin_group
            raise ViewError(f"the ops view is for members of the group {group}", 403)

    def ops_nodes(self) -> dict:
        self.admin_only()
        nodes = slurm.nodes.all_nodes(self.config.slurm_timeout_seconds)
        return {"nodes": [node_row(node) for node in nodes]}

    def ops_queue(self) -> dict:
        self.admin_only()
        return self.broker({"ask": "queue"}, {"jobs": []})

    def ops_utilisation(self) -> dict:
        self.admin_only()
        return self.broker({"ask": "cluster"}, {"series": []})

    def ops_alerts(self) -> dict:
        self.admin_only()
        return self.broker({"ask": "alerts"}, {"alerts": []})


def agent_version() -> str:
    try:
        return version("tacc-agent")
    except PackageNotFoundError:
        return "unknown"


def run_window(history: list, state: str, now: float | None = None) -> tuple[float | None, float]:
    """(when the job started running, when it ended or now) from its events."""
    now = time.time() if now is None else now
    times = {event.get("state"): event.get("time") for event in history if isinstance(event, dict)}
    start = times.get("RUNNING") or times.get("PROVISIONING")
    end = next((times[s] for s in ENDED if isinstance(times.get(s), int | float)), None)
    if not isinstance(start, int | float):
        return None, now
    return float(start), float(end if end is not None and state in ENDED else now)


def usable(state: str) -> bool:
    return not any(word in UNUSABLE for word in state.replace("*", "").split("+"))


def free_gpus(nodes: list) -> list[dict]:
    """GPUs per type over every node: in all, and free on nodes that take jobs."""
    totals: dict[str, list[int]] = {}
    for node in nodes:
        if not node.gpus:
            continue
        kinds = gres.gpu_kinds(node.gres) or ((UNTYPED, node.gpus),)
        used = dict(gres.gpu_kinds(node.gres_used))
        untyped_used = gres.count(node.gres_used)
        for kind, count in kinds:
            entry = totals.setdefault(kind, [0, 0])
            entry[1] += count
            if usable(node.state):
                taken = used.get(kind, untyped_used if kind == UNTYPED else 0)
                entry[0] += max(0, count - taken)
    return [
        {"type": kind, "free": free, "total": total}
        for kind, (free, total) in sorted(totals.items())
    ]


def node_row(node) -> dict:
    return {
        "name": node.name,
        "state": node.state,
        "reason": node.reason,
        "partitions": list(node.partitions),
        "cpus": node.cpus,
        "cpus_allocated": node.cpus_allocated,
        "gpus": node.gpus,
        "gpus_free": node.gpus_free,
    }
