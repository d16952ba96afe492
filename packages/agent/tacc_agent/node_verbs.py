"""The agent's own verbs, which tcloud never calls: the node's (Slurm's health check,
the daemon, the batch step and the wrappers srun runs) and ops' (acceptance, the queue
tick, the usage report). Declared with the contract's record (tacc_contract.verbs.Verb),
so the one parser (tacc_agent/verb_parser.py) reads them as it reads tcloud's verbs."""

from __future__ import annotations

from tacc_contract.answers import QueueTick
from tacc_contract.verbs import JOB_CONNECT as CONNECT
from tacc_contract.verbs import (
    PERIOD,
    Field,
    Verb,
    command_problem,
    connect_target_problem,
    whole,
)

JSON = Field("json", bool, "--json", help="machine-readable output")
JOB_DIR = Field("jobdir", help="the job directory")
# `job connect`'s target, as the relay it runs on the node takes it.
RELAY_TARGET = tuple(item for item in CONNECT.fields if item.name in ("port", "socket", "check"))

CHECK = Verb(
    ("check",),
    "run the node health checks once (Slurm's HealthCheckProgram); drain or resume the node",
    (JSON, Field("no_slurm", bool, "--no-slurm", help="do not drain or resume")),
    errors=("failed", "cluster"),
    streams=True,
)
SERVE = Verb(
    ("serve",),
    "the node daemon: checks on an interval, /metrics, facts",
    (
        Field("port", int, "--port", help="metrics port (default: metrics_port)"),
        Field("interval", float, "--interval", help="seconds between check runs (60)"),
    ),
    streams=True,
)
ACCEPT = Verb(
    ("accept",),
    "acceptance tests of a new or rebooted node (root, on the controller); it stays "
    "drained unless it passes",
    (
        Field("node", help="the Slurm node to test"),
        Field("peer", flag="--peer", help="the node in service to test with (default: first)"),
        JSON,
        Field("thresholds", flag="--thresholds", help="JSON object over the config's"),
    ),
    errors=("failed", "rejected", "cluster"),
    streams=True,
)
ACCOUNTS_SYNC = Verb(
    ("accounts", "sync"),
    "(root) Slurm accounts and workspaces from the directory's groups (the config's "
    "directory_accounts)",
    (
        Field("no_slurm", bool, "--no-slurm", help="leave Slurm's associations alone"),
        Field("workspace_root", flag="--workspace-root", help="make members' workspaces here"),
        Field("dry_run", bool, "--dry-run", help="say what would change, change nothing"),
        JSON,
    ),
    errors=("failed", "cluster"),
    streams=True,
)
QUEUE_TICK = Verb[QueueTick](
    ("queue-tick",),
    "one round of the scheduling plug-ins' queue hooks (root)",
    returns=QueueTick,
)
REPORT_USAGE = Verb(
    ("report", "usage"),
    "(root) every user's GPU hours, allocated and used",
    (
        Field("format", flag="--format", default="table", choices=("table", "csv", "json")),
        *PERIOD,
    ),
    streams=True,
)
BATCH = Verb(("batch",), "(Slurm) a job's batch step", (JOB_DIR,), streams=True)
EXEC = Verb(("exec",), "(srun) one node's execution wrapper", (JOB_DIR,), streams=True)
ENTER = Verb(
    ("enter",),
    "(srun) a command in a job's environment on a node",
    (
        JOB_DIR,
        whole("--rank", "the rank of this node", default=0),
        Field("command", list, problem=command_problem, default=(), help="words after --"),
    ),
    streams=True,
)
RELAY = Verb(
    ("relay",),
    "(srun) a port or socket here to stdin/stdout, or with --back to a connection back "
    "to `job connect` (its offer on stdin)",
    (
        *RELAY_TARGET,
        Field("back", bool, "--back", help="connect back to `job connect` (its offer on stdin)"),
    ),
    streams=True,
    across=connect_target_problem,
)
NODE_USAGE = Verb(
    ("node-usage",), "(srun, by `job top`) this node's figures of the job", streams=True
)
DASHBOARD_SERVE = Verb(
    ("dashboard", "serve"),
    "(by `dashboard open` and `connect`) the caller's dashboard server on its private "
    "socket; it exits when unused for the config's dashboard_idle_seconds",
    streams=True,
)

NODE_VERBS: tuple[Verb, ...] = (
    CHECK,
    SERVE,
    ACCEPT,
    ACCOUNTS_SYNC,
    QUEUE_TICK,
    REPORT_USAGE,
    BATCH,
    EXEC,
    ENTER,
    RELAY,
    NODE_USAGE,
    DASHBOARD_SERVE,
)
