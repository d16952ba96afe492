"""`tacc-agent accept NODE`: the acceptance gate of a new or rebooted node, run as root on
the Slurm controller. The node stays drained until it passes:

1. NODE (and --peer) must match NODE_NAME and be a node of Slurm's node list; the
   thresholds (agent config `acceptance`, then --thresholds) must be known keys of the
   right type: else exit 2 and nothing is done. A node still running jobs is refused.
2. Not drained: drained with reason "tacc: acceptance pending".
3. A root-only maintenance reservation tacc-accept-NODE on NODE (and the peer) is created
   (one of that name left by a killed run is removed first), then NODE is resumed: no
   user job can start on it, and the tests run there as Slurm steps of that reservation.
4. The tests, each bounded in time (srun --time and a timeout on srun itself):
   agent checks (`tacc-agent check --no-slurm` on NODE); an MPI allreduce within NODE
   (2 ranks) and between NODE and the peer (one rank each); nccl-tests' all_reduce_perf
   where NODE has gpu gres and the binary; perftest's ib_write_bw between NODE and the
   peer where both have RDMA devices; a torch.distributed all_reduce between NODE and
   the peer (the path researchers' jobs take: NCCL, one GPU each, where both have GPUs,
   else gloo) with the python the setting torch_python names (one with torch, at the
   same path on every node, root's only; run as nobody). What cannot run is
   "skipped: <why>", never passed.
5. Pass: NODE stays resumed. Fail (a figure under its threshold, a failed check, a step
   Slurm refused or that timed out, an interrupt): NODE is drained with reason
   "tacc: acceptance failed: <test> <figure> < <threshold>" (or the cause). The
   reservation is deleted in every case, after that drain, signals held off meanwhile
   (only a failed node Slurm refused to drain keeps it, so no job lands there untested).
   The record (figures, thresholds, time, verdict) goes to <state_dir>/acceptance/NODE.json.

The peer is --peer, else the node in service (idle or mixed, no drain, down, fail,
maintenance or reservation flag) of NODE's first partition that has one with the fewest
CPUs allocated (the first listed among equals). A node drained with a reason
starting "tacc: acceptance" is the gate's: the health loop must leave it drained.
Every Slurm command is an argv list; each is bounded by slurm_timeout_seconds.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AGENT_CLUSTER, AGENT_REJECTED, AgentError, Rejected
from tacc_agent.health.checks.base import Output, write_state
from tacc_agent.slurm import gres
from tacc_agent.slurm.nodes import NodeRecord

TAG = "tacc: acceptance"
PENDING_REASON = f"{TAG} pending"
FAILED_PREFIX = f"{TAG} failed: "
REASON_CHARACTERS = 160
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# What the thresholds and settings are, with their defaults: the agent config's
# `acceptance` mapping overrides them, --thresholds (a JSON object) overrides that.
# A threshold of 0 measures and reports, and never fails.
DEFAULTS: dict[str, float | int | str] = {
    "mpi_allreduce_node_min_mbps": 0.0,  # MB/s (10^6 bytes/s), 2 ranks on the node
    "mpi_allreduce_pair_min_mbps": 0.0,  # MB/s, one rank on the node, one on the peer
    "nccl_allreduce_min_gbps": 0.0,  # GB/s, all_reduce_perf's average bus bandwidth
    "rdma_write_min_gbps": 0.0,  # Gb/s (gigabits), ib_write_bw's average
    "torch_allreduce_pair_min_gbps": 0.0,  # GB/s, torch.distributed's bus bandwidth
    "test_timeout_seconds": 300,  # each test (Slurm step)
    "mpi_message_mib": 32,  # the allreduce's message
    "mpi_iterations": 10,
    "all_reduce_perf": "all_reduce_perf",  # nccl-tests' binary: a path, or a name on PATH
    # A python with torch at this path on every node (root-owned: root runs it); empty
    # skips the torch.distributed test.
    "torch_python": "",
}
THRESHOLDS = (
    "mpi_allreduce_node_min_mbps",
    "mpi_allreduce_pair_min_mbps",
    "nccl_allreduce_min_gbps",
    "rdma_write_min_gbps",
    "torch_allreduce_pair_min_gbps",
)
# The torch step runs as nobody, not root: what torch_python loads (its venv, .pth
# files, anything they point at) never runs with root's rights, even if the check of its
# files (facts step) misses a way in.
UNPRIVILEGED = (
    "setpriv",
    "--reuid=nobody",
    "--regid=nogroup",
    "--clear-groups",
    "--no-new-privs",
    "--",
)
MIG_TYPE = re.compile(r"^[0-9]+g\.[0-9]+gb$")  # a MIG profile as a Gres type: 3g.40gb
# torch.distributed's rendezvous port on NODE (rank 0's), one of these at random.
TORCH_PORTS = range(29400, 29500)
# The program the steps run on the nodes, by its path (the agent sits at the same path on
# every node); not imported here, it is the OS python3's.
PROBE = Path(__file__).with_name("accept_probe.py")
IMMEDIATE_SECONDS = 60  # srun gives up when the reservation cannot start the step by then
STEP_MEMORY = "1G"  # per node of a step (the peer may run other jobs: ask for little)
AVAILABLE = ("IDLE", "MIXED")
OUT_OF_SERVICE = {
    "DRAIN",
    "DRAINING",
    "DRAINED",
    "DOWN",
    "FAIL",
    "FAILING",
    "NOT_RESPONDING",
    "MAINT",
    "MAINTENANCE",
    "RESERVED",
    "POWERED_DOWN",
    "POWERING_DOWN",
    "POWER_DOWN",
    "POWERING_UP",
    "REBOOT_REQUESTED",
    "REBOOT_ISSUED",
    "INVALID_REG",
    "COMPLETING",
    "PLANNED",
}
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP during the run: the node fails, cleanup still runs."""


# --- thresholds -------------------------------------------------------------------------


def settings(configured: dict | None, overrides: str | None) -> dict:
    """DEFAULTS, then the agent config's `acceptance`, then --thresholds (JSON)."""
    found = dict(DEFAULTS)
    found.update(checked(configured or {}, "agent config: acceptance", AGENT_CLUSTER))
    if overrides is not None:
        try:
            given = json.loads(overrides)
        except ValueError as exc:
            raise Rejected(f"--thresholds: expected a JSON object: {exc}") from None
        if not isinstance(given, dict):
            raise Rejected(f"--thresholds: expected a JSON object, not {overrides!r}")
        found.update(checked(given, "--thresholds", AGENT_REJECTED))
    return found


def checked(given: dict, where: str, code: int) -> dict:
    unknown = sorted(set(given) - set(DEFAULTS))
    if unknown:
        raise AgentError(
            f"{where}: unknown key(s) {', '.join(map(str, unknown))}; expected "
            f"some of {', '.join(DEFAULTS)}",
            code,
        )
    for key, value in given.items():
        default = DEFAULTS[key]
        if key == "torch_python":
            good = isinstance(value, str) and (value == "" or value.startswith("/"))
            good = good and "\0" not in value
            expected = "an absolute path to a python with torch, or empty"
        elif isinstance(default, str):
            good = isinstance(value, str) and value != "" and "\0" not in value
            expected = "a non-empty string"
        else:
            least = 0 if key in THRESHOLDS else sys.float_info.min
            good = isinstance(value, int | float) and not isinstance(value, bool)
            good = good and math.isfinite(value) and value >= least
            expected = "a number of at least 0" if key in THRESHOLDS else "a number above 0"
        if not good:
            raise AgentError(f"{where}: {key}: expected {expected}, not {value!r}", code)
    return given


# --- Slurm ------------------------------------------------------------------------------


def state_words(node: NodeRecord) -> list[str]:
    """Its state's words without their marks (IDLE+DRAIN -> IDLE, DRAIN)."""
    return [word.strip("*~#!%$@^-") for word in node.state.upper().split("+")]


def drained(node: NodeRecord) -> bool:
    return "DRAIN" in state_words(node)


def busy(node: NodeRecord) -> bool:
    return node.cpus_allocated > 0 or state_words(node)[0] in ("ALLOCATED", "MIXED")


def in_service(node: NodeRecord) -> bool:
    base, *flags = state_words(node)
    return base in AVAILABLE and not set(flags) & OUT_OF_SERVICE


class Admin:
    """The admin commands the gate runs (the slurm package's), each bounded by timeout."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout

    def nodes(self) -> list[NodeRecord]:
        return slurm.nodes.all_nodes(self.timeout)

    def drain(self, node: str, reason: str) -> None:
        slurm.nodes.drain(node, reason, self.timeout)

    def resume(self, node: str) -> None:
        slurm.nodes.resume(node, self.timeout)

    def reservation_exists(self, name: str) -> bool:
        return slurm.reservations.exists(name, self.timeout)

    def create_reservation(self, name: str, nodes: list[str], minutes: int) -> None:
        slurm.reservations.create_maintenance(name, nodes, minutes, self.timeout)

    def delete_reservation(self, name: str) -> None:
        slurm.reservations.delete(name, self.timeout)


def one_line(text: str) -> str:
    return " ".join(text.split())


# --- the plan ---------------------------------------------------------------------------


@dataclass
class Plan:
    node: NodeRecord
    peer: NodeRecord | None
    partition: str
    peer_note: str = ""  # why there is no peer

    @property
    def reservation(self) -> str:
        return f"tacc-accept-{self.node.name}"

    @property
    def nodes(self) -> list[str]:
        return [self.node.name, *([self.peer.name] if self.peer else [])]


def check_name(name: str, what: str) -> None:
    if not NODE_NAME.fullmatch(name):
        raise Rejected(
            f"{what}: {name!r} is not a node name (letters, digits, '.', '_', '-'; at most 63)"
        )


def plan(nodes: list[NodeRecord], name: str, peer_name: str | None) -> Plan:
    """The node, the peer and the partition the steps use; Rejected when they cannot be."""
    by_name = {node.name: node for node in nodes}
    node = by_name.get(name)
    if node is None:
        raise Rejected(f"{name}: not a node of this Slurm cluster (scontrol show node)")
    if not node.partitions:
        raise Rejected(f"{name}: in no partition, so no test can run there")
    if busy(node):
        raise Rejected(f"{name} runs jobs ({node.state}): drain it and let them end first")
    if peer_name is not None:
        peer = by_name.get(peer_name)
        if peer is None:
            raise Rejected(f"--peer {peer_name}: not a node of this Slurm cluster")
        if peer.name == name:
            raise Rejected("--peer: another node than the one under test")
        if not in_service(peer):
            raise Rejected(f"--peer {peer_name}: not in service ({peer.state})")
        shared = [p for p in node.partitions if p in peer.partitions]
        if not shared:
            raise Rejected(f"--peer {peer_name}: shares no partition with {name}")
        return Plan(node, peer, shared[0])
    for partition in node.partitions:
        candidates = [
            c for c in nodes if c.name != name and in_service(c) and partition in c.partitions
        ]
        if candidates:
            # The least busy: its one-rank step starts at once and disturbs the fewest jobs.
            return Plan(node, min(candidates, key=lambda c: c.cpus_allocated), partition)
    return Plan(node, None, node.partitions[0], "no other node in service")


# --- the tests --------------------------------------------------------------------------


@dataclass
class Test:
    name: str
    status: str
    detail: str = ""
    figure: float | None = None
    unit: str = ""
    threshold: float | None = None

    def failure(self) -> str:
        """The drain reason's part: "<test> <figure> < <threshold>" or "<test>: <cause>"."""
        if self.figure is not None and self.threshold:
            # Whole units from 10 on; below, three digits (a gloo pair's 0.412 GB/s).
            figure = f"{self.figure:.0f}" if self.figure >= 10 else f"{self.figure:.3g}"
            return f"{self.name} {figure} {self.unit} < {self.threshold:g} {self.unit}"
        return f"{self.name}: {self.detail}"


def measured(name: str, figure: float | None, unit: str, threshold: float, detail: str) -> Test:
    test = Test(name, PASSED, detail, figure, unit, threshold)
    if figure is None:
        test.status, test.detail = FAILED, f"no figure: {detail}"
    elif threshold and figure < threshold:
        test.status = FAILED
    return test


def json_lines(text: str) -> list[dict]:
    found = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                found.append(data)
    return found


class Steps:
    """The tests as Slurm steps in the plan's reservation."""

    def __init__(
        self,
        plan: Plan,
        limits: dict,
        config: AgentConfig,
        progress: Callable[[Test], None] = lambda test: None,
    ) -> None:
        self.plan = plan
        self.progress = progress
        self.limits = limits
        self.config = config
        self.timeout = float(limits["test_timeout_seconds"])

    def srun(
        self,
        nodes: list[str],
        tasks_per_node: int,
        program: list[str],
        memory: str = STEP_MEMORY,
        extra: tuple[str, ...] = (),
        secrets_env: dict[str, str] | None = None,
    ) -> Output:
        """The step; `secrets_env` reaches its tasks through srun's environment (never
        its command line, which other users on the nodes can read)."""
        minutes = math.ceil(self.timeout / 60) + 1
        argv = [
            "srun",
            f"--reservation={self.plan.reservation}",
            f"--partition={self.plan.partition}",
            f"--nodelist={','.join(nodes)}",
            f"--nodes={len(nodes)}",
            f"--ntasks={len(nodes) * tasks_per_node}",
            f"--ntasks-per-node={tasks_per_node}",
            f"--time={minutes}",
            f"--immediate={IMMEDIATE_SECONDS}",
            f"--mem={memory}",
            "--export=" + ",".join(["PATH", "HOME", *sorted(secrets_env or {})]),
            "--job-name=tacc-accept",
            *extra,
            *program,
        ]
        try:
            done = slurm.run.command(argv, self.timeout, env=secrets_env)
        except AgentError as exc:  # srun missing or hung (killed: its step ends)
            return Output(None, "", str(exc))
        return Output(done.code, done.stdout, done.stderr.strip())

    def probe(self, *words: str) -> list[str]:
        return [self.config.python, "-I", str(PROBE), *words]

    @staticmethod
    def cause(out: Output) -> str:
        errors = [d["error"] for d in json_lines(out.stdout) if "error" in d]
        text = "; ".join(errors) or out.problem or out.stdout or f"exit {out.code}"
        return one_line(text)[:200]

    def agent_checks(self) -> Test:
        argv = [sys.executable, "-I", "-m", "tacc_agent", "check", "--json", "--no-slurm"]
        out = self.srun([self.plan.node.name], 1, argv)
        found = next((d for d in json_lines_whole(out.stdout) if "checks" in d), None)
        if found is None:
            return Test("agent checks", FAILED, f"no answer: {self.cause(out)}")
        checks = [c for c in found["checks"] if isinstance(c, dict)]
        failing = [c for c in checks if c.get("status") in ("fail", "stuck")]
        if failing or not found.get("healthy") or out.code != 0:
            first = failing[0] if failing else {"check": "?", "detail": self.cause(out)}
            return Test("agent checks", FAILED, f"{first.get('check')}: {first.get('detail')}")
        return Test("agent checks", PASSED, f"{len(checks)} checks ok")

    def facts(self) -> dict[str, dict]:
        """Each node's facts (GPUs, RDMA devices, tools); AgentError when the step fails."""
        binary = str(self.limits["all_reduce_perf"])
        words = ["facts", "--tool", binary, "--tool", "ib_write_bw"]
        if self.limits["torch_python"]:
            words += ["--python", str(self.limits["torch_python"])]
        out = self.srun(self.plan.nodes, 1, self.probe(*words))
        found = {d.get("node"): d for d in json_lines(out.stdout) if "error" not in d}
        if out.code != 0 or set(found) != set(self.plan.nodes):
            raise AgentError(f"node facts: {self.cause(out)}", AGENT_CLUSTER)
        return found

    def mpi(self, nodes: list[str], per_node: int, name: str, threshold: float) -> Test:
        words = ("allreduce", *self.message_words())
        out = self.srun(nodes, per_node, self.probe(*words), extra=("--mpi=pmix",))
        found = next((d for d in json_lines(out.stdout) if "mbps" in d), None)
        if out.code != 0 or found is None or not isinstance(found["mbps"], int | float):
            return Test(name, FAILED, self.cause(out), unit="MB/s", threshold=threshold)
        detail = f"{found.get('bytes', 0) // (1 << 20)} MiB x {found.get('iterations')}"
        return measured(name, float(found["mbps"]), "MB/s", threshold, detail)

    def nccl(self, facts: dict) -> Test:
        name, threshold = "nccl all_reduce", float(self.limits["nccl_allreduce_min_gbps"])
        gpus = self.plan.node.gpus
        binary = facts.get("tools", {}).get(str(self.limits["all_reduce_perf"]))
        if gpus <= 0:
            return Test(name, SKIPPED, "skipped: no GPUs")
        mig = [kind for kind, _ in gres.gpu_kinds(self.plan.node.gres) if MIG_TYPE.match(kind)]
        if mig:  # its Gres counts MIG devices, and all_reduce_perf wants whole GPUs
            return Test(name, SKIPPED, f"skipped: MIG devices ({', '.join(mig)})")
        if not binary:
            return Test(name, SKIPPED, f"skipped: {self.limits['all_reduce_perf']} not installed")
        program = self.probe(
            "nccl",
            "--gpus",
            str(gpus),
            "--binary",
            binary,
            "--timeout",
            f"{max(1.0, self.timeout - 10):g}",
        )
        out = self.srun(
            [self.plan.node.name], 1, program, memory="0", extra=(f"--gres=gpu:{gpus}",)
        )
        found = next((d for d in json_lines(out.stdout) if "busbw_gbytes" in d), None)
        if out.code != 0 or found is None:
            return Test(name, FAILED, self.cause(out), unit="GB/s", threshold=threshold)
        return measured(name, float(found["busbw_gbytes"]), "GB/s", threshold, f"{gpus} GPUs")

    def rdma(self, facts: dict[str, dict]) -> Test:
        peer = self.plan.peer
        name = f"rdma write with {peer.name}" if peer else "rdma write"
        threshold = float(self.limits["rdma_write_min_gbps"])
        if peer is None:
            return Test(name, SKIPPED, f"skipped: {self.plan.peer_note}")
        for node in self.plan.nodes:
            if not facts[node].get("rdma_devices"):
                return Test(name, SKIPPED, f"skipped: no RDMA device on {node}")
            if not facts[node].get("tools", {}).get("ib_write_bw"):
                return Test(name, SKIPPED, f"skipped: ib_write_bw not installed on {node}")
        program = self.probe(
            "rdma", "--server-node", self.plan.node.name, "--server-address", self.plan.node.address
        )
        out = self.srun(self.plan.nodes, 1, program)
        found = next((d for d in json_lines(out.stdout) if "gbits" in d), None)
        if out.code != 0 or found is None:
            return Test(name, FAILED, self.cause(out), unit="Gb/s", threshold=threshold)
        return measured(name, float(found["gbits"]), "Gb/s", threshold, str(found.get("device")))

    def torch(self, facts: dict[str, dict]) -> Test:
        peer = self.plan.peer
        name = f"torch all_reduce with {peer.name}" if peer else "torch all_reduce"
        threshold = float(self.limits["torch_allreduce_pair_min_gbps"])
        python = str(self.limits["torch_python"])
        if peer is None:
            return Test(name, SKIPPED, f"skipped: {self.plan.peer_note}")
        if not python:
            return Test(name, SKIPPED, "skipped: no torch_python in the acceptance settings")
        for node in self.plan.nodes:  # root runs it: nobody else may change what it runs
            if why := facts[node].get("python_unsafe"):
                return Test(name, FAILED, f"torch_python not run as root on {node}: {why}")
        gpus = self.plan.node.gpus > 0 and peer.gpus > 0
        if gpus and peer.gpus_free < 1:
            return Test(name, SKIPPED, f"skipped: every GPU of {peer.name} is in a job")
        program = [
            *UNPRIVILEGED,
            python,
            "-I",
            str(PROBE),
            "torch",
            "--backend",
            "nccl" if gpus else "gloo",
            *self.message_words(),
            "--master-node",
            self.plan.node.name,
            "--master-address",
            self.plan.node.address,
            "--port",
            str(secrets.choice(TORCH_PORTS)),
            "--timeout",
            f"{max(1.0, self.timeout - 10):g}",
        ]
        out = self.srun(
            self.plan.nodes,
            1,
            program,
            extra=("--gres=gpu:1",) if gpus else (),
            secrets_env={"TACC_ACCEPT_TOKEN": secrets.token_hex(16)},
        )
        found = next((d for d in json_lines(out.stdout) if "busbw_gbytes" in d), None)
        if out.code != 0 or found is None or not isinstance(found["busbw_gbytes"], int | float):
            return Test(name, FAILED, self.cause(out), unit="GB/s", threshold=threshold)
        mib = found.get("bytes", 0) // (1 << 20)
        detail = f"{found.get('backend')}, {mib} MiB x {found.get('iterations')}"
        return measured(name, float(found["busbw_gbytes"]), "GB/s", threshold, detail)

    def message_words(self) -> tuple[str, ...]:
        return (
            "--mib",
            f"{self.limits['mpi_message_mib']:g}",
            "--iterations",
            str(int(self.limits["mpi_iterations"])),
        )

    def run_all(self, tests: list[Test]) -> None:
        """Each test into `tests` as it ends: an interrupt or a failed facts step keeps
        the ones that ran in the record."""
        tests.append(self.said(self.agent_checks()))
        facts = self.facts()
        node = self.plan.node.name
        node_threshold = float(self.limits["mpi_allreduce_node_min_mbps"])
        tests.append(self.said(self.mpi([node], 2, "mpi allreduce within node", node_threshold)))
        pair_threshold = float(self.limits["mpi_allreduce_pair_min_mbps"])
        if self.plan.peer:
            pair = self.mpi(
                self.plan.nodes, 1, f"mpi allreduce with {self.plan.peer.name}", pair_threshold
            )
        else:
            pair = Test("mpi allreduce with a peer", SKIPPED, f"skipped: {self.plan.peer_note}")
        tests.append(self.said(pair))
        tests.append(self.said(self.nccl(facts[node])))
        tests.append(self.said(self.rdma(facts)))
        tests.append(self.said(self.torch(facts)))

    def said(self, test: Test) -> Test:
        self.progress(test)
        return test


def json_lines_whole(text: str) -> list[dict]:
    """`tacc-agent check --json` prints one indented object: the whole text, else lines."""
    with contextlib.suppress(ValueError):
        data = json.loads(text)
        return [data] if isinstance(data, dict) else []
    return json_lines(text)


# --- the run ----------------------------------------------------------------------------


@contextlib.contextmanager
def interrupts_raise() -> Iterator[None]:
    """SIGINT / SIGTERM / SIGHUP raise Interrupted here, so cleanup runs (a step's srun
    is killed by subprocess.run on the way out, which ends the step)."""

    def handler(signum: int, _frame: object) -> None:
        raise Interrupted(signal.Signals(signum).name)

    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Cleanup (drain, delete the reservation) runs to its end."""
    signums = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signums}
    try:
        yield
    finally:
        for signum, previous in old.items():
            signal.signal(signum, previous)


@dataclass
class Record:
    node: str
    peer: str | None
    partition: str
    reservation: str
    thresholds: dict
    started: float
    finished: float = 0.0
    passed: bool = False
    reason: str = ""
    tests: list[Test] = field(default_factory=list)
    cleanup: list[str] = field(default_factory=list)  # what went wrong cleaning up


def reason_for(text: str) -> str:
    return one_line(f"{FAILED_PREFIX}{text}")[:REASON_CHARACTERS]


def reservation_minutes(timeout: float) -> int:
    """Long enough for every step (5 at most, plus the facts) and a margin; deleted at
    the end anyway, it only bounds a reservation a crash left behind."""
    return math.ceil((6 * timeout + 120) / 60)


def run_gate(
    plan: Plan,
    limits: dict,
    config: AgentConfig,
    admin: Admin,
    clock: Callable[[], float],
    progress: Callable[[Test], None],
) -> Record:
    record = Record(
        plan.node.name,
        plan.peer.name if plan.peer else None,
        plan.partition,
        plan.reservation,
        limits,
        clock(),
    )
    failure: str | None = None  # None: stopped by an unexpected error (a bug): not a pass
    with interrupts_raise():  # until cleanup holds them off: no window for SIGTERM to kill
        try:
            if admin.reservation_exists(plan.reservation):  # left by a killed run
                admin.delete_reservation(plan.reservation)
            if not drained(plan.node):
                admin.drain(plan.node.name, PENDING_REASON)
            minutes = reservation_minutes(float(limits["test_timeout_seconds"]))
            admin.create_reservation(plan.reservation, plan.nodes, minutes)
            admin.resume(plan.node.name)
            Steps(plan, limits, config, progress).run_all(record.tests)
            first = next((t for t in record.tests if t.status == FAILED), None)
            failure = first.failure() if first else ""
        except Interrupted as exc:
            failure = f"interrupted ({exc})"
        except KeyboardInterrupt:
            failure = "interrupted (SIGINT)"
        except AgentError as exc:
            failure = str(exc)
        finally:
            with signals_held():
                if failure is None:
                    failure = "stopped by an internal error"
                record.passed = not failure
                record.reason = reason_for(failure) if failure else ""
                clean_up(plan, admin, record)
    record.finished = clock()
    return record


def clean_up(plan: Plan, admin: Admin, record: Record) -> None:
    """A failed node is drained before the reservation goes, so it is never in service
    untested; the reservation is deleted whatever happened, but for one case: a failed
    node Slurm would not drain keeps it (until its Duration ends), which keeps user jobs
    off the node meanwhile."""
    if not record.passed:
        try:
            admin.drain(plan.node.name, record.reason)
        except AgentError as exc:
            problem = f"could not drain {plan.node.name}: {exc}"
            with contextlib.suppress(AgentError):
                if admin.reservation_exists(plan.reservation):
                    problem += (
                        f"; reservation {plan.reservation} kept to keep jobs off it: "
                        "drain the node, then delete the reservation"
                    )
                    record.cleanup.append(problem)
                    return
            record.cleanup.append(problem)
            return
    try:
        if admin.reservation_exists(plan.reservation):
            admin.delete_reservation(plan.reservation)
    except AgentError as exc:
        record.cleanup.append(f"could not delete reservation {plan.reservation}: {exc}")


def record_path(config: AgentConfig, node: str) -> Path:
    return Path(config.state_dir, "acceptance", f"{node}.json")


def as_dict(record: Record) -> dict:
    data = asdict(record)
    data["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.finished))
    return data


def table(record: Record, path: Path) -> str:
    lines = [
        f"acceptance of {record.node} (peer {record.peer or 'none'}, partition "
        f"{record.partition}, reservation {record.reservation})",
        f"{'test':<28} {'result':<8} {'figure':>14} {'threshold':>14}  detail",
    ]
    for test in record.tests:
        figure = f"{test.figure:.1f} {test.unit}" if test.figure is not None else "-"
        threshold = f"{test.threshold:g} {test.unit}" if test.threshold else "-"
        lines.append(
            f"{test.name:<28} {test.status:<8} {figure:>14} {threshold:>14}  {test.detail}"
        )
    if record.passed:
        lines.append(f"{record.node}: accepted, resumed (in service)")
    else:
        lines.append(f"{record.node}: NOT accepted, left drained: {record.reason}")
    lines += [f"WARNING: {problem}" for problem in record.cleanup]
    lines.append(f"record: {path}")
    return "\n".join(lines)


def say_progress(test: Test) -> None:
    """Each test as it ends, on stderr (stdout gets the table, or the JSON record)."""
    figure = f" {test.figure:.1f} {test.unit}" if test.figure is not None else ""
    detail = test.detail.removeprefix(f"{test.status}: ")
    print(f"{test.name}: {test.status}{figure} ({detail})", file=sys.stderr, flush=True)


def accept(
    config: AgentConfig,
    node: str,
    peer: str | None = None,
    thresholds: str | None = None,
    as_json: bool = False,
    clock: Callable[[], float] = time.time,
) -> int:
    """The gate; 0 when NODE passed, 1 when it did not (it stays drained), 2 for a bad
    request (nothing done), 3 when Slurm could not be asked (nothing done)."""
    check_name(node, "NODE")
    if peer is not None:
        check_name(peer, "--peer")
    limits = settings(config.acceptance, thresholds)
    admin = Admin(float(config.slurm_timeout_seconds))
    chosen = plan(admin.nodes(), node, peer)
    progress = (lambda test: None) if as_json else say_progress
    record = run_gate(chosen, limits, config, admin, clock, progress)
    path = record_path(config, node)
    try:
        write_state(path, as_dict(record))
    except OSError as exc:
        record.cleanup.append(f"could not write {path}: {exc}")
    if as_json:
        print(json.dumps(as_dict(record), indent=1, sort_keys=True))
    else:
        print(table(record, path))
    return 0 if record.passed else 1
