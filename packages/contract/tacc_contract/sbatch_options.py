"""Which sbatch options a task's `resources.sbatch` may set (issue [10] point 13).

The agent builds every option that shapes the job's layout, limits, files and identity
from the task's checked fields; an extra option must never set one of those again.
Read by tcloud's schema (so `tcloud validate` names file, line and field) and by the
agent, which re-validates every instruction and puts the extras first in sbatch's argv,
before the options it sets (a later option wins in sbatch). Keys are long option names
without dashes (`mail-type`): `-N2` or `nodes 2` never get that far. sbatch also takes
any unambiguous prefix of a long option (`--nod=2` is `--nodes=2`), so a key that
begins one of these names is refused as well.
"""

from __future__ import annotations

import re

# Set by the agent from one of the task's own fields: use the field instead.
FROM_FIELDS = {
    "nodes": "resources.nodes",
    "ntasks": "resources.nodes and resources.processes_per_node",
    "ntasks-per-node": "resources.processes_per_node",
    "tasks-per-node": "resources.processes_per_node",
    "ntasks-per-core": "resources.processes_per_node",
    "ntasks-per-socket": "resources.processes_per_node",
    "ntasks-per-gpu": "resources.processes_per_node",
    "ntasks-per-tres": "resources.processes_per_node",
    "cpus-per-task": "resources.cpus",
    "cpus-per-gpu": "resources.cpus_per_gpu",
    "mincpus": "resources.cpus",
    "mem": "resources.mem",
    "mem-per-cpu": "resources.mem",
    "mem-per-gpu": "resources.mem_per_gpu",
    "gres": "resources.gpus_per_node",
    "gpus": "resources.gpus_per_node",
    "gpus-per-node": "resources.gpus_per_node",
    "gpus-per-task": "resources.gpus_per_node",
    "gpus-per-socket": "resources.gpus_per_node",
    "tres-per-task": "resources.gpus_per_node and resources.cpus",
    "time": "resources.time",
    "time-min": "resources.time",
    "partition": "resources.partition",
    "qos": "resources.qos",
    "account": "resources.account",
    "nice": "resources.priority",
    "priority": "resources.priority",
    "job-name": "name",
    "array": "sweep",
}
# The agent's own: where the job runs and logs, its environment and signals, its tag
# (comment), its user, and an sbatch that answers with the job id and nothing else.
AGENT_OWNED = (
    "chdir",
    "output",
    "error",
    "input",
    "open-mode",
    "export",
    "export-file",
    "get-user-env",
    "uid",
    "gid",
    "comment",
    "wrap",
    "signal",
    "requeue",
    "no-requeue",
    "parsable",
    "test-only",
    "wait",
    "help",
    "usage",
    "version",
    "cluster",
    "clusters",
)
RESERVED = (*FROM_FIELDS, *AGENT_OWNED)
OPTION_NAME = re.compile(r"[a-z][a-z0-9-]*")
SHAPE = "an sbatch option name such as exclusive or mail-type (lowercase, no leading --)"


def reserved_meaning(name: str) -> str | None:
    """The reserved option sbatch would read `name` as (itself, or the option it is an
    abbreviation of); None when it is none of them."""
    if name in RESERVED:
        return name
    return next((option for option in RESERVED if option.startswith(name)), None)


def why_refused(name: str) -> str | None:
    """What is expected instead of sbatch option `name`; None when a task may set it."""
    if not OPTION_NAME.fullmatch(name):
        return SHAPE
    meant = reserved_meaning(name)
    if meant is None:
        return None
    if meant in FROM_FIELDS:
        reason = f"set {FROM_FIELDS[meant]} instead"
    else:
        reason = f"the agent sets --{meant}"
    if meant != name:
        reason = f"sbatch may take it for --{meant}; {reason}"
    return (
        f"an option the agent leaves to the task: sbatch option {name!r} cannot be set by "
        f"a task ({reason})"
    )
