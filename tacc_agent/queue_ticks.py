"""The scheduling plug-ins' `tick`: read Slurm's queue, let each plug-in react, act
through Slurm (`scontrol update JobId=... Nice=...`). Run by the agent daemon every
`queue_tick_seconds` where that is set (the controller), or once with
`tacc-agent queue-tick`."""

from __future__ import annotations

import re
import time
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_plugins.api import Queue, QueuedJob
from tacc_plugins.registry import PluginError, in_layer, select

FORMAT = "%i|%u|%T|%y|%D|%b|%M"
GPUS = re.compile(r"gpu(?::[A-Za-z0-9_.-]+)?[:=](\d+)")


def elapsed_seconds(text: str) -> int:
    """squeue's %M: [days-][hours:]minutes:seconds."""
    days, _, rest = text.strip().rpartition("-")
    parts = [int(p) for p in rest.split(":") if p.isdigit()]
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + part
    return int(days or 0) * 86400 + seconds


def gpus_per_node(tres: str) -> int:
    return sum(int(n) for n in GPUS.findall(tres))


def parse_queue(text: str) -> list[QueuedJob]:
    jobs = []
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 7 or not parts[4].isdigit():
            continue
        job_id, user, state, nice, nodes, tres, elapsed = parts
        count = int(nodes)
        jobs.append(QueuedJob(job_id, user, state, int(nice) if nice.lstrip("-").isdigit() else 0,
                              gpus_per_node(tres) * count, elapsed_seconds(elapsed),
                              nodes=count))  # fmt: skip
    return jobs


def read_queue(config: AgentConfig, user: str = "") -> list[QueuedJob]:
    """Pending and running jobs (array tasks one by one), everybody's or `user`'s."""
    who = [f"--user={user}"] if user else []
    out = slurm.slurm(["squeue", "--noheader", "--array", "--states=PENDING,RUNNING", *who,
                       f"--format={FORMAT}"], config.slurm_timeout_seconds)  # fmt: skip
    return parse_queue(out)


def tick(config: AgentConfig) -> list[str]:
    """One round of every `tick` hook that is on; what each changed."""
    try:
        plugins = in_layer(select(config.plugins, policy_from=config.plugins), "schedule")
    except PluginError as exc:
        raise Rejected(str(exc), "plugins") from None

    def set_nice(job_id: str, nice: int) -> None:
        slurm.slurm(["scontrol", "update", f"JobId={job_id}", f"Nice={nice}"],
                    config.slurm_timeout_seconds)  # fmt: skip

    queue = Queue(read_queue(config), set_nice, time.time(), Path(config.state_dir), config)
    for plugin in plugins:
        plugin.tick(queue)
    return queue.notes
