"""The agent's Slurm readers, and the rolling and acceptance roles' regexes, on what Slurm
22.05 (Debian 12) and 24.11 (Debian 13) really printed in the lab (issue [20] point 3):
tests/unit/slurm_outputs/, recorded by tools/record_slurm_outputs.py. The slurm role's
sacctmgr modules are fed theirs in tests/unit/roles/test_recorded_sacctmgr.py.

Every recording is fed, for both versions, to the reader that parses it. Most are fed
through the agent's one runner (`Replay`): the reader builds its argv, and the recording
made with exactly that argv, environment and user (MANIFEST.json) answers it, so an argv
that drifts from the recorded one fails too. The YAML regexes are copied here with the
file and task they come from, and each copy is checked against the task file's text.

What the lab really showed (not what the recorder aimed at): the cluster was full, so
`completed`, `failed`, `timeout`, `multi` and every array task are still pending; the
"drained" node (n3) is in the acceptance reservation but was no longer drained when
recorded (no DRAIN, no Reason=), so its sinfo reason is "none"; sacct keeps no job
comment (AccountingStoreFlags=(null)).

Recordings no reader parses: none. `scontrol-show-reservation-multiline{,-unknown}.root`
and `sacctmgr-cluster-health.root` are read by their exit status only (the acceptance
role, health/slurm_cluster.SlurmdbdReader); `squeue-rolling-*.root` by the rolling role's
stdout_lines and `trim | length` (no regex); the Reason= regex of rolling's "Say why this
node does not roll" is only shown to a human, and is tested all the same.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.health import acceptance, cycle, job_usage, slurm_cluster
from tacc_agent.health.checks import tmpfiles
from tacc_agent.health.checks.base import Sample
from tacc_agent.slurm import (
    accounting,
    controller,
    jobs,
    nodes,
    oneliner,
    queue,
    reservations,
    run,
    times,
)
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.slurm.run import Finished
from tacc_agent.tasks.accounting import quota
from tacc_agent.tasks.execute import launch, lost_nodes
from tacc_agent.tasks.jobs import job_tags, verbs
from tacc_agent.tasks.schedule import (
    cluster_shape,
    early_start,
    found_again,
    node_limits,
    preempt,
    queue_ticks,
    submit,
)
from tacc_agent.tasks.store import workspace
from tacc_contract.plugins import Partition, PartitionLoad, QueuedJob

REPOSITORY = Path(__file__).resolve().parents[4]
RECORDED = REPOSITORY / "tests" / "unit" / "slurm_outputs"
VERSIONS = ["22.05", "24.11"]
CONFIG = AgentConfig()
TIMEOUT = 5.0
ALICE_UID = 2001  # the lab's alice; bob is 2002
TAG = "5eedf00d5eedf00d"  # the recorder's tags: tacc:<role>:TAG
SCRIPTS = "/tmp/tacc-record-slurm"
DETAILS_START = "0123456789abcdef"  # the start word the recorder gave squeue -o
SACCT_TIME = "%Y-%m-%dT%H:%M:%S"
NAME_WITH_SPACES = "tacc-rec-name lr=0.1 two words"
NAME_WITH_NEWLINE = "tacc-rec-newline\nsecond line"
COMMENT_WITH_BARS = f"tacc:name:{TAG}|a comment|with bars"
ONE_CPU = "cpu=1,mem=256M,node=1,billing=1"  # what every one-task recorder job asks
BOBS = ("bob", "suspended", "priority")  # the recorder's jobs submitted by bob


# --- the recordings ---------------------------------------------------------------------


@cache
def manifest(version: str) -> dict:
    return json.loads((RECORDED / version / "MANIFEST.json").read_text())


def job_id(version: str, role: str) -> str:
    """The recorder's job of that role (MANIFEST placeholders)."""
    return manifest(version)["placeholders"][role]


def placeholder(version: str, name: str) -> str:
    return manifest(version)["placeholders"][name]


def recorded(version: str, name: str) -> str:
    return (RECORDED / version / f"{name}.out").read_text(errors="replace")


def stderr_of(version: str, name: str) -> str:
    path = RECORDED / version / f"{name}.err"
    return path.read_text(errors="replace") if path.exists() else ""


def exit_status(version: str, name: str) -> int:
    path = RECORDED / version / f"{name}.rc"
    return int(path.read_text()) if path.exists() else 0


def recording_of(version: str, user: str, argv: list[str], env: dict[str, str]) -> str:
    """The name of the recording of exactly this command line, run as user."""
    for entry in manifest(version)["recordings"]:
        if (entry["user"], entry["argv"], entry["env"]) == (user, argv, env):
            return entry["name"]
    raise AssertionError(f"Slurm {version}: no recording of {argv} ({env}) as {user}")


class Replay:
    """The agent's one runner of Slurm commands (run.command), answered from the
    recordings of one version made as one user; `read` lists the recordings it gave."""

    def __init__(self, version: str, user: str) -> None:
        self.version, self.user = version, user
        self.read: list[str] = []

    def __call__(
        self, argv: list[str], timeout: float = run.TIMEOUT, env=None, **_how: object
    ) -> Finished:
        name = recording_of(self.version, self.user, list(argv), dict(env or {}))
        self.read.append(name)
        version = self.version
        return Finished(
            exit_status(version, name), recorded(version, name), stderr_of(version, name)
        )


@pytest.fixture
def replay(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Replay]:
    """replay(version, user="root"): Slurm answers from that version's recordings."""

    def install(version: str, user: str = "root") -> Replay:
        fake = Replay(version, user)
        monkeypatch.setattr(run, "command", fake)
        return fake

    return install


@pytest.fixture
def as_alice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent runs as alice (her uid and name), as `su - alice` did in the lab."""
    monkeypatch.setattr(job_tags, "os", SimpleNamespace(getuid=lambda: ALICE_UID))
    monkeypatch.setattr(workspace, "current_user", lambda: "alice")


def window(version: str) -> tuple[datetime, datetime]:
    """The sacct window the recorder asked for (its `since` and `until`)."""
    since, until = placeholder(version, "since"), placeholder(version, "until")
    return datetime.strptime(since, SACCT_TIME), datetime.strptime(until, SACCT_TIME)


def per_version(value: object, version: str) -> object:
    """A value the same on both versions, or {version: its value on each}."""
    return value[version] if isinstance(value, dict) else value


# --- scontrol show job --oneliner: every job, and one job -------------------------------

# What each recorder job showed in the lab: (JobState, Reason), the same in every one of
# its recordings; {version: ...} where the two versions differ.
SHOWN: dict[str, object] = {
    "cancelled": ("CANCELLED", "None"),
    "suspended": ("SUSPENDED", "None"),
    "requeued": {"22.05": ("PENDING", "Priority"), "24.11": ("PENDING", "None")},
    "requeuehold": ("PENDING", "job_requeued_in_held_state"),
    "running": ("RUNNING", "None"),
    "bob": ("RUNNING", "None"),
    "multi": {
        "22.05": ("PENDING", "ReqNodeNotAvail,_May_be_reserved_for_other_job"),
        "24.11": (
            "PENDING",
            "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_"
            "priority_partitions",
        ),
    },
    "array": {"22.05": ("PENDING", "Resources"), "24.11": ("PENDING", "Priority")},
    "het": ("PENDING", "Resources"),
    "name": ("PENDING", "Priority"),
    "completed": ("PENDING", "Priority"),  # never ran: the lab was full
    "failed": ("PENDING", "Priority"),
    "timeout": ("PENDING", "Priority"),
    "resources": ("PENDING", "Priority"),
    "priority": {"22.05": ("PENDING", "Priority"), "24.11": ("PENDING", "Resources")},
    "range": {"22.05": ("PENDING", "Priority"), "24.11": ("PENDING", "Resources")},
    "dependency": ("PENDING", "Dependency"),
    "held": ("PENDING", "JobHeldUser"),
    "begin": ("PENDING", "BeginTime"),
    "newline": ("PENDING", "JobHeldUser"),
    "cancelled_pending": ("CANCELLED", "JobHeldUser"),
}


def job_name(role: str) -> str:
    """A recorder job's name, as scontrol's one-liner reads it (a line break: a space)."""
    special = {"name": NAME_WITH_SPACES, "newline": " ".join(NAME_WITH_NEWLINE.split())}
    return special.get(role, f"tacc-rec-{role}")


def user_of(role: str) -> str:
    return "bob" if role in BOBS else "alice"


def owner(role: str) -> str:
    """scontrol's UserId of a recorder job."""
    return "bob(2002)" if role in BOBS else f"alice({ALICE_UID})"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_job_reads_whole_from_scontrols_list(version, replay):
    """jobs.job_records (the queue tick, as root): every job Slurm knows, in id order,
    the job whose name holds a line break too (read whole: both lines)."""
    fake = replay(version)
    found = jobs.job_records()
    assert fake.read == ["scontrol-show-job.root"]
    last = int(job_id(version, "cancelled_pending"))
    assert [record["JobId"] for record in found] == [str(n) for n in range(1, last + 1)]
    by_id = {record["JobId"]: record for record in found}
    for role, shown in SHOWN.items():
        record = by_id[job_id(version, role)]
        assert (record["JobName"], record["UserId"]) == (job_name(role), owner(role))
        assert (record["JobState"], record["Reason"]) == per_version(shown, version), role
    accept = [record for record in found if record["JobName"] == "tacc-accept"]
    assert [record["UserId"] for record in accept] == ["root(0)"] * 7  # site.yml's gate


@pytest.mark.parametrize("version", VERSIONS)
def test_the_queue_ticks_job_records_on_both(version, replay):
    """preempt.job_records: JobRecords by squeue's id, from the same one scontrol call."""
    fake = replay(version)
    known = preempt.job_records(CONFIG)
    assert fake.read == ["scontrol-show-job.root"]
    running, multi = job_id(version, "running"), job_id(version, "multi")
    assert known[running] == preempt.JobRecord(
        running,
        ALICE_UID,
        "alice",
        "RUNNING",
        Path("/tmp"),
        False,
        run_seconds={"22.05": 98, "24.11": 95}[version],
        tasks_per_node=1,
        cpus_per_task=1,
        nodes=1,
        partitions=("batch",),
        qos="normal",
        account="research",
        tres=ONE_CPU,
    )
    assert (known[multi].nodes, known[multi].max_nodes) == (2, 2)
    assert known[multi].tres == "cpu=3,mem=200M,node=2,billing=3"
    ranged = known[job_id(version, "range")]
    # --nodes=1-2 shows as 2-2 while pending: preempt reads the range from sacct (below)
    assert (ranged.nodes, ranged.max_nodes) == (2, 2)
    array = known[job_id(version, "array")]
    assert (array.array, array.state) == (True, "PENDING")  # all six tasks still pending
    het = int(job_id(version, "het"))
    assert {known[str(het)].state, known[str(het + 1)].state} == {"PENDING"}
    suspended = known[job_id(version, "suspended")]
    assert (suspended.uid, suspended.user, suspended.state) == (2002, "bob", "SUSPENDED")
    newline = known[job_id(version, "newline")]
    assert (newline.user, newline.state) == ("alice", "PENDING")
    assert "" not in known


# (role, the user the recorder read it as): `scontrol show job --oneliner ID`.
JOB_VIEWS = [
    ("running", "root"),
    ("running", "alice"),
    ("resources", "root"),
    ("resources", "alice"),
    ("range", "root"),
    ("held", "alice"),
    ("array", "root"),
    ("array", "alice"),
    ("het", "root"),
    ("name", "root"),
    ("newline", "root"),
    ("completed", "alice"),
    ("failed", "alice"),
    ("cancelled", "alice"),
    ("cancelled_pending", "alice"),
    ("timeout", "alice"),
    ("suspended", "root"),
    ("requeuehold", "root"),
]


def job_view_name(role: str, user: str) -> str:
    return f"scontrol-show-job-{role}.{user}"


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("role", "user"), JOB_VIEWS)
def test_one_jobs_record_reads_its_state(version, role, user, replay):
    """jobs.job_record (verbs.slurm_info, as the user; the first record scontrol prints)."""
    fake = replay(version, user)
    record = jobs.job_record(job_id(version, role))
    assert fake.read == [job_view_name(role, user)]
    assert record is not None
    assert (record["JobId"], record["JobName"]) == (job_id(version, role), job_name(role))
    assert (record["JobState"], record["Reason"]) == per_version(SHOWN[role], version)
    assert record["UserId"] == owner(role)
    assert record["Partition"] == "batch" and record["WorkDir"] == "/tmp"
    assert jobs.tres_of(record) == ONE_CPU


# How `tcloud status` reads each job the first time it asks (verbs.reconcile, a new job
# directory): (state, reason).
RECONCILED = {
    "running": ("PROVISIONING", ""),
    "held": ("HALTED", "JobHeldUser"),
    "newline": ("HALTED", "JobHeldUser"),
    "requeuehold": ("HALTED", "job_requeued_in_held_state"),
    "suspended": ("QUEUED", "SUSPENDED"),
    "cancelled": ("CANCELLED", "Slurm: CANCELLED"),
    "cancelled_pending": ("CANCELLED", "Slurm: CANCELLED"),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("role", "user"), JOB_VIEWS)
def test_tcloud_status_reads_each_job_as_slurm_shows_it(
    version, role, user, replay, as_alice, tmp_path
):
    """verbs.reconcile of jobs.job_record's record: a running job is PROVISIONING, a held
    one HALTED, a pending one QUEUED with Slurm's reason, a cancelled one CANCELLED. The
    job whose name holds a line break is read whole (it was read as ended: FAILED)."""
    replay(version, user)
    info = verbs.slurm_info(job_id(version, role), CONFIG)
    pending_reason = per_version(SHOWN[role], version)[1]
    assert verbs.reconcile(tmp_path, info) == RECONCILED.get(role, ("QUEUED", pending_reason))
    assert job_tags.owned_by_caller(info) is (role not in BOBS)


# (role, what the agent acting as root reads of it alone: preempt.job_record)
ALONE = {
    "running": ("RUNNING", 1, 0),
    "resources": ("PENDING", 1, 1),
    "range": ("PENDING", 2, 2),
    "array": ("PENDING", 1, 1),
    "name": ("PENDING", 1, 1),
    "suspended": ("SUSPENDED", 1, 0),
    "requeuehold": ("PENDING", 1, 1),
}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("role", ALONE)
def test_a_job_read_alone_as_root(version, role, replay):
    """jobs.job_alone via preempt.job_record: one line, one record."""
    fake = replay(version)
    found = preempt.job_record(job_id(version, role), CONFIG)
    assert fake.read == [job_view_name(role, "root")]
    assert found is not None and found.job_id == job_id(version, role)
    assert (found.state, found.nodes, found.max_nodes) == ALONE[role]
    assert (found.partitions, found.qos, found.account) == (("batch",), "normal", "research")


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("role", ["het", "newline"])
def test_a_job_printed_on_several_lines_is_never_read_alone(version, role, replay):
    """jobs.job_alone: a heterogeneous job (a line a part) and a name with a line break
    (two lines) are never acted on."""
    fake = replay(version)
    assert preempt.job_record(job_id(version, role), CONFIG) is None
    assert len(recorded(version, job_view_name(role, "root")).splitlines()) == 2
    assert fake.read == [job_view_name(role, "root")]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_jobs_name_with_spaces_and_a_comment_with_bars_read_whole(version, replay):
    replay(version)
    record = jobs.job_alone(job_id(version, "name"))
    assert record is not None
    assert (record["JobName"], record["Comment"]) == (NAME_WITH_SPACES, COMMENT_WITH_BARS)
    assert record["UserId"] == owner("name")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_parts_of_a_heterogeneous_job(version, replay):
    """oneliner.show: one record a part (jobs.job_record takes the first, the leader)."""
    replay(version)
    het = job_id(version, "het")
    records = oneliner.show("job", het)
    assert [(r["JobId"], r["HetJobId"], r["HetJobOffset"]) for r in records] == [
        (het, het, "0"),
        (str(int(het) + 1), het, "1"),
    ]
    assert jobs.job_record(het)["HetJobIdSet"] == f"{het}-{int(het) + 1}"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pending_arrays_record_names_its_tasks(version, replay):
    replay(version, "alice")
    record = jobs.job_record(job_id(version, "array"))
    assert record is not None
    assert (record["ArrayJobId"], record["ArrayTaskId"]) == (job_id(version, "array"), "0-5%2")


@pytest.mark.parametrize("version", VERSIONS)
def test_the_node_counts_of_pending_and_running_jobs(version, replay):
    """jobs.node_counts: 24.11 prints a held job's NumNodes as 1-1, 22.05 as 1."""
    replay(version, "alice")
    held = jobs.job_record(job_id(version, "held"))
    assert held["NumNodes"] == {"22.05": "1", "24.11": "1-1"}[version]
    assert jobs.node_counts(held["NumNodes"], held["JobState"]) == (1, 1)
    running = jobs.job_record(job_id(version, "running"))
    assert jobs.node_counts(running["NumNodes"], running["JobState"]) == (1, 0)


@pytest.mark.parametrize("version", VERSIONS)
def test_tres_is_spelled_per_version(version, replay):
    """jobs.tres_of: 22.05 prints TRES=, 24.11 ReqTRES= and AllocTRES= ((null) pending)."""
    replay(version)
    running = jobs.job_alone(job_id(version, "running"))
    pending = jobs.job_alone(job_id(version, "resources"))
    if version == "22.05":
        assert (running["TRES"], pending["TRES"]) == (ONE_CPU, ONE_CPU)
        assert "AllocTRES" not in running and "ReqTRES" not in pending
    else:
        assert (running["AllocTRES"], pending["AllocTRES"]) == (ONE_CPU, "(null)")
        assert pending["ReqTRES"] == ONE_CPU and "TRES" not in running
    assert (jobs.tres_of(running), jobs.tres_of(pending)) == (ONE_CPU, ONE_CPU)


@pytest.mark.parametrize("version", VERSIONS)
def test_exit_codes_and_run_times(version, replay):
    """A job cancelled while running ended by signal 15 (ExitCode=0:15), after its run
    time; one cancelled while pending never ran."""
    replay(version, "alice")
    cancelled = jobs.job_record(job_id(version, "cancelled"))
    assert (cancelled["ExitCode"], cancelled["NodeList"]) == ("0:15", "n2")
    assert times.elapsed_seconds(cancelled["RunTime"]) == {"22.05": 96, "24.11": 94}[version]
    never = jobs.job_record(job_id(version, "cancelled_pending"))
    assert (never["ExitCode"], never["RunTime"], never["NodeList"]) == ("0:0", "00:00:00", "")
    timeout = jobs.job_record(job_id(version, "timeout"))
    assert times.elapsed_seconds(timeout["TimeLimit"]) == 60  # --time=1


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "role"),
    [("scontrol-show-job-other-user.alice", "bob"), ("scontrol-show-job-unknown.alice", "")],
)
def test_a_job_the_user_may_not_see_or_slurm_does_not_know_is_none(version, name, role, replay):
    """oneliner.show_lines: "Invalid job id" (PrivateData=jobs hides bob's job so too)."""
    fake = replay(version, "alice")
    assert jobs.job_record(job_id(version, role) if role else "67000000") is None
    assert fake.read == [name]
    assert (exit_status(version, name), stderr_of(version, name)) == (
        1,
        "slurm_load_jobs error: Invalid job id specified\n",
    )


# --- times as epoch seconds (early_start) ----------------------------------------------


def queued(job: str, user: str = "alice") -> QueuedJob:
    return QueuedJob(job, user, "PENDING", 0, 0, 0, reason="BeginTime", details=True)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "role", "why"),
    [
        (
            "scontrol-show-job-begin.epoch.root",
            "begin",
            "its begin time is its owner's, not a placement delay",
        ),
        (
            "scontrol-show-job-requeued.epoch.root",
            "requeued",
            "it was requeued (it waits out Slurm's requeue delay)",
        ),
        (
            "scontrol-show-job-running.epoch.root",
            "running",
            "it no longer waits for a begin time",
        ),
    ],
)
def test_early_start_reads_the_epoch_times(version, name, role, why, replay):
    """early_start.fresh_delay (jobs.job_alone with SLURM_TIME_FORMAT=%s)."""
    fake = replay(version)
    assert early_start.fresh_delay(queued(job_id(version, role)), CONFIG) == why
    assert fake.read == [name]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_begin_time_an_hour_out_reads_as_3600_seconds(version, replay):
    replay(version)
    begin = jobs.job_alone(job_id(version, "begin"), env=run.EPOCH_TIMES)
    submitted = times.epoch_seconds(begin["SubmitTime"])
    assert submitted > 1.7e9
    assert times.epoch_seconds(begin["EligibleTime"]) - submitted == 3600  # --begin=now+1hour
    requeued = jobs.job_alone(job_id(version, "requeued"), env=run.EPOCH_TIMES)
    assert requeued["Restarts"] == "1"
    delay = times.epoch_seconds(requeued["EligibleTime"]) - times.epoch_seconds(
        requeued["SubmitTime"]
    )
    assert 0 < delay < 60  # Slurm's requeue delay before the requeued job may start


# --- scontrol show job -d -o (health/job_usage, root on the compute node) ---------------


@pytest.mark.parametrize("version", VERSIONS)
def test_a_running_jobs_node_group_reads_on_both(version, replay):
    fake = replay(version)
    line = jobs.detailed_line(job_id(version, "running"), TIMEOUT)
    assert fake.read == ["scontrol-show-job-detail-running.root"]
    cpu = {"22.05": "0", "24.11": "1"}[version]
    assert line is not None and jobs.node_groups(line) == [("n2", cpu, "")]
    sources = job_usage.Sources(node="n2")
    assert job_usage.lookup(sources, job_id(version, "running")) == job_usage.Allocation(1)
    assert job_usage.allocation_here(line, "n3") == job_usage.NOT_HERE


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pending_jobs_detailed_line_has_no_node_group(version, replay):
    """The multi-node job never started in the lab: no node group, not on this node."""
    fake = replay(version)
    line = jobs.detailed_line(job_id(version, "multi"), TIMEOUT)
    assert fake.read == ["scontrol-show-job-detail-multi.root"]
    assert line is not None and jobs.node_groups(line) == []
    sources = job_usage.Sources(node="n2")
    assert job_usage.lookup(sources, job_id(version, "multi")) == job_usage.NOT_HERE


# --- scontrol show node and partition, hostnames ------------------------------------------

NODE_ADDRESSES = {"22.05": "10.77.21.", "24.11": "10.77.20."}
RESERVED = "IDLE+MAINTENANCE+RESERVED+PLANNED"  # n3: in the maintenance reservation


def expected_node(version: str, name: str) -> nodes.NodeRecord:
    busy = name == "n2"
    return nodes.NodeRecord(
        name=name,
        state="ALLOCATED" if busy else RESERVED,
        reason="",
        partitions=("batch",),
        features=(),
        gres="(null)",
        cpus=2,
        cpus_allocated=2 if busy else 0,
        memory_mb=22899,
        address=NODE_ADDRESSES[version] + ("12" if busy else "13"),
    )


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "user"), [("scontrol-show-node.root", "root"), ("scontrol-show-node.alice", "alice")]
)
def test_every_node_reads_on_both(version, name, user, replay):
    fake = replay(version, user)
    assert nodes.all_nodes() == [expected_node(version, "n2"), expected_node(version, "n3")]
    assert fake.read == [name]


@pytest.mark.parametrize("version", VERSIONS)
def test_one_node_reads_and_an_unknown_one_is_none(version, replay):
    """nodes.node: scontrol exits 1 with "Node nosuch not found" on stdout (it raised)."""
    fake = replay(version)
    assert nodes.node("n2") == expected_node(version, "n2")
    assert nodes.node("n3") == expected_node(version, "n3")
    assert nodes.node("nosuch") is None
    assert fake.read == [
        "scontrol-show-node-busy.root",
        "scontrol-show-node-drained.root",
        "scontrol-show-node-unknown.root",
    ]
    assert exit_status(version, "scontrol-show-node-unknown.root") == 1


@pytest.mark.parametrize("version", VERSIONS)
def test_the_node_readers_callers_on_both(version, replay):
    """health/cycle, health/acceptance, execute/lost_nodes and launch read the nodes."""
    replay(version)
    assert cycle.apply_to_slurm([], "n3", TIMEOUT).said == (
        "slurm: n3 idle+maintenance+reserved+planned, nothing to do"
    )
    assert cycle.apply_to_slurm([], "nosuch", TIMEOUT).said == (
        "slurm: nosuch is not a Slurm node here"
    )
    assert lost_nodes.node_problem("n2", TIMEOUT) == ""  # it serves
    assert launch.node_features("n2", CONFIG) == []
    found = acceptance.Admin(TIMEOUT).nodes()
    plan = acceptance.plan(found, "n3", None)
    assert (plan.peer, plan.partition, plan.peer_note) == (
        None,
        "batch",
        "no other node in service",
    )
    assert plan.reservation == placeholder(version, "reservation")
    with pytest.raises(Rejected, match="n2 runs jobs"):
        acceptance.plan(found, "n2", None)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_partition_reads_on_both(version, replay):
    replay(version)
    partitions = nodes.all_partitions()
    assert partitions == [nodes.PartitionRecord("batch", True, "UNLIMITED", "N/A")]
    shape = submit.cluster_shape(TIMEOUT)
    assert shape[0] == [Partition("batch", True, ("n2", "n3"))]
    assert [(node.name, node.cpus, node.gpus, node.state) for node in shape[1]] == [
        ("n2", 2, 0, "ALLOCATED"),
        ("n3", 2, 0, RESERVED),
    ]
    assert cluster_shape.read_nodes(TIMEOUT) == shape[1]
    place = node_limits.JobPlace("1", "alice", ("batch",), "normal", "research")
    assert node_limits.partition_limits(place, TIMEOUT) == node_limits.Limits([], {})


@pytest.mark.parametrize("version", VERSIONS)
def test_hostnames_expand_on_both(version, replay):
    fake = replay(version, "alice")
    assert nodes.hostnames("n[2-4,7]") == ["n2", "n3", "n4", "n7"]
    assert fake.read == ["scontrol-show-hostnames.alice"]


# --- reservations -------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_acceptance_reservation_is_found_and_an_unknown_one_is_not(version, replay):
    fake = replay(version)
    assert reservations.exists(placeholder(version, "reservation")) is True
    assert reservations.exists("tacc-accept-nosuch") is False
    assert fake.read == ["scontrol-show-reservation.root", "scontrol-show-reservation-unknown.root"]


# --- scontrol show config and ping ---------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_slurms_settings_read_on_both(version, replay):
    replay(version)
    config = controller.show_config()
    assert config["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert config["AccountingStorageEnforce"] == "associations,limits,qos,safe"
    assert config["ClusterName"] == placeholder(version, "cluster") == "tacc"
    assert config["MinJobAge"] == "300 sec"
    assert config["SLURM_VERSION"] == {"22.05": "22.05.8", "24.11": "24.11.5"}[version]
    assert config["PreemptType"] == {"22.05": "preempt/none", "24.11": "(null)"}[version]
    assert config["AccountingStoreFlags"] == "(null)"  # sacct keeps no job comment
    assert not any(key.startswith("SlurmctldHost") for key in config)  # SlurmctldHost[0]
    assert node_limits.enforced(config) is True
    text = recorded(version, "scontrol-show-config.root")
    assert slurm_cluster.accounting_storage(text) == "accounting_storage/slurmdbd"


@pytest.mark.parametrize("version", VERSIONS)
def test_the_controller_answers_on_both(version, replay):
    fake = replay(version)
    assert controller.slurmctld_up(recorded(version, "scontrol-ping.root")) is True
    up = Sample("slurm_up", {"daemon": "slurmctld"}, 1)
    assert slurm_cluster.read_slurmctld(slurm_cluster.Sources()) == [up]
    assert fake.read == ["scontrol-ping.root"]


@pytest.mark.parametrize("version", VERSIONS)
def test_slurmdbd_answers_on_both(version, replay):
    """SlurmdbdReader: accounting_storage/slurmdbd, then sacctmgr's exit status."""
    fake = replay(version)
    found = slurm_cluster.SlurmdbdReader()(slurm_cluster.Sources())
    assert found == [Sample("slurm_up", {"daemon": "slurmdbd"}, 1)]
    assert fake.read == ["scontrol-show-config.root", "sacctmgr-cluster-health.root"]
    assert recorded(version, "sacctmgr-cluster-health.root") == "tacc\n"


# --- sinfo ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_json_reads_each_nodes_state_on_both(version, replay):
    """nodes.parse_sinfo_json: 22.05's `nodes`, 24.11's `sinfo` groups, as 22.05's dicts."""
    fake = replay(version)
    found = nodes.parse_sinfo_json(recorded(version, "sinfo-json.root"))
    by_name = {node["name"]: node for node in found}
    assert (by_name["n2"]["state"], by_name["n2"]["state_flags"]) == ("allocated", [])
    assert by_name["n3"]["state"] == "idle"
    assert set(by_name["n3"]["state_flags"]) == {"MAINTENANCE", "RESERVED", "PLANNED"}
    assert all(node["partitions"] == ["batch"] and node["reason"] == "" for node in found)
    assert all((node["gres"], node["gres_used"]) == ("", "") for node in found)
    assert slurm_cluster.read_nodes(slurm_cluster.Sources()) == [
        Sample("slurm_nodes", {"state": "allocated"}, 1),
        Sample("slurm_nodes", {"state": "idle"}, 1),
        Sample("slurm_gpus", {"partition": "batch", "state": "allocated"}, 0),
        Sample("slurm_gpus", {"partition": "batch", "state": "total"}, 0),
    ]
    assert fake.read == ["sinfo-json.root"]


@pytest.mark.parametrize("version", VERSIONS)
def test_no_node_is_idle_for_a_job(version, replay):
    """nodes.parse_idle: the only idle node is in maintenance ("1|maint")."""
    fake = replay(version, "alice")
    assert recorded(version, "sinfo-idle.alice") == "1|maint\n"
    assert nodes.idle_count("batch") == 0
    assert fake.read == ["sinfo-idle.alice"]


# --- squeue: the queue tick's jobs and details ---------------------------------------------


def queue_ids(version: str) -> dict[str, list[str]]:
    """The queue's ids by kind: array tasks, heterogeneous parts."""
    array, het = job_id(version, "array"), job_id(version, "het")
    return {
        "array": [f"{array}_{task}" for task in range(6)],
        "het": [f"{het}+1", f"{het}+0"],
    }


@pytest.mark.parametrize("version", VERSIONS)
def test_the_queue_reads_every_job_on_both(version, replay):
    """queue.parse_queue (queue_ticks.read_queue, as root): 22 pending, 2 running."""
    fake = replay(version)
    found = {job.job_id: job for job in queue_ticks.read_queue(CONFIG)}
    assert fake.read == ["squeue-queue.root"]
    assert Counter(job.state for job in found.values()) == {"PENDING": 22, "RUNNING": 2}
    assert all(job.partition == "batch" and job.gpus == 0 for job in found.values())
    ran = {"22.05": {"running": 111, "bob": 110}, "24.11": {"running": 106, "bob": 106}}
    for role, seconds in ran[version].items():
        job = found[job_id(version, role)]
        assert (job.user, job.state, job.reason, job.nodes) == (user_of(role), "RUNNING", "", 1)
        assert job.elapsed_seconds == seconds  # TimeUsed 1:51, 1:50, 1:46
    assert found[job_id(version, "held")].nice == -5  # set by root
    assert found[job_id(version, "range")].nodes == 2
    assert found[job_id(version, "multi")].nodes == 2
    assert (
        found[job_id(version, "multi")].reason
        == {
            "22.05": "ReqNodeNotAvail, May be reserved for other job",
            "24.11": "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher "
            "priority partitions",
        }[version]
    )
    assert found[job_id(version, "requeued")].reason == {"22.05": "Priority", "24.11": ""}[version]
    assert found[job_id(version, "requeuehold")].reason == "job requeued in held state"
    assert found[job_id(version, "priority")].user == "bob"
    ids = queue_ids(version)
    assert set(ids["array"] + ids["het"]) <= set(found)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_users_queue_and_quota_on_both(version, replay, as_alice):
    """quota.quota as alice: her queue (parse_queue, --user), her association, the QoS
    it names and her fair share (sacctmgr and sshare --parsable2)."""
    fake = replay(version, "alice")
    found = quota.quota(CONFIG)
    assert fake.read == [
        "squeue-queue-user.alice",
        "sacctmgr-assoc-user.alice",
        "sacctmgr-qos-quota.alice",
        "sshare-user.alice",
    ]
    usage = {"22.05": ("397", "0.559734"), "24.11": ("282", "0.750819")}[version]
    assert found == {
        "user": "alice",
        "running_jobs": 1,
        "pending_jobs": 21,
        "gpus_in_use": 0,
        "accounting": True,
        "associations": [
            {
                "Account": "research",
                "Fairshare": "1",
                "QOS": "normal",
                "DefaultQOS": "",
                "MaxTRES": "",
                "MaxJobs": "",
                "MaxWall": "",
            }
        ],
        "qos": [
            {
                "Name": "normal",
                "Priority": "0",
                "MaxWall": "",
                "MaxTRESPU": "",
                "MaxJobsPU": "",
                "Preempt": "",
                "PreemptMode": "cluster",
                "UsageFactor": "1.000000",
            }
        ],
        "fairshare": [
            {
                "Account": "research",
                "User": "alice",
                "RawShares": "1",
                "NormShares": "0.500000",
                "RawUsage": usage[0],
                "EffectvUsage": usage[1],
                "FairShare": "0.333333",
            }
        ],
    }


@pytest.fixture
def details_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """queue_details draws its start word afresh: the recorder's, here."""
    monkeypatch.setattr(queue.secrets, "token_hex", lambda size: DETAILS_START)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_queue_details_read_every_job_on_both(version, replay, details_start):
    """queue.parse_details: names with spaces and a line break, limits, nodes, epoch
    times; every job of the queue, the parts of a heterogeneous job ("12+0") too (they
    were left out: no name, limit or times for them)."""
    fake = replay(version)
    details = queue.queue_details()
    assert fake.read == ["squeue-details.root"]
    jobs_in_queue = queue_ticks.read_queue(CONFIG)
    assert set(details) == {job.job_id for job in jobs_in_queue}
    running = details[job_id(version, "running")]
    assert (running.user, running.limit, running.nodes, running.features) == (
        "alice",
        1800,
        ("n2",),
        "",
    )
    epoch = jobs.job_alone(job_id(version, "running"), env=run.EPOCH_TIMES)
    assert running.submit_time == times.epoch_seconds(epoch["SubmitTime"])
    assert running.start_time == times.epoch_seconds(epoch["StartTime"])
    assert details[job_id(version, "name")].name == NAME_WITH_SPACES
    assert details[job_id(version, "newline")].name == NAME_WITH_NEWLINE
    assert details[job_id(version, "timeout")].limit == 60
    begin = details[job_id(version, "begin")]
    assert begin.start_time - begin.submit_time == 3600
    assert details[job_id(version, "held")].start_time == 0  # N/A
    for part in queue_ids(version)["het"]:
        assert (details[part].name, details[part].nodes) == ("tacc-rec-het", ())
    queue_ticks.read_details(jobs_in_queue, CONFIG)
    assert all(job.details for job in jobs_in_queue)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_running_jobs_read_strictly_on_both(version, replay):
    """queue.parse_running (Slurm's limits): running and suspended jobs, every field."""
    fake = replay(version)
    assert queue.running_jobs() == [
        queue.RunningJob(job_id(version, role), user, "research", "normal", "batch", ONE_CPU)
        for role, user in (("bob", "bob"), ("running", "alice"), ("suspended", "bob"))
    ]
    assert fake.read == ["squeue-running.root"]


@pytest.mark.parametrize("version", VERSIONS)
def test_slurms_limits_on_a_grow_read_on_both(version, replay):
    """node_limits.read_limits: the partition, the settings, QOS normal's limits and the
    association tree (none set in the lab: every limit is empty), then the running jobs."""
    fake = replay(version)
    place = node_limits.JobPlace(
        job_id(version, "running"), "alice", ("batch",), "normal", "research"
    )
    limits = node_limits.read_limits(place, TIMEOUT)
    assert fake.read == [
        "scontrol-show-partition.root",
        "scontrol-show-config.root",
        "sacctmgr-qos-limits.root",
        "sacctmgr-assoc-tree.root",
    ]
    assert [(limit.where, limit.tres) for limit in limits.entries] == [
        ("QOS normal MaxTRESPerJob", {}),
        ("QOS normal MaxTRESPerUser", {}),
        ("QOS normal MaxTRESPerAccount", {}),
        ("QOS normal GrpTRES", {}),
        ("association alice/research MaxTRES", {}),
        ("association alice/research GrpTRES", {}),
        ("account research MaxTRES", {}),
        ("account research GrpTRES", {}),
        ("account root MaxTRES", {}),
        ("account root GrpTRES", {}),
    ]
    assert limits.entries[-1].scope == node_limits.Scope(accounts=frozenset({"root", "research"}))
    share = node_limits.per_node({"cpu": 1, "node": 1}, 1)
    running = queue.running_jobs()
    assert node_limits.ceiling(limits, share, running, place.job_id) == (node_limits.MAX_NODES, "")


# --- squeue: the caller's own jobs, tags, reasons, partitions, uids ---------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_the_callers_own_jobs_on_both(version, replay, as_alice, tmp_path):
    """queue.parse_own (verbs.ps): scontrol's keys; the comment last, its bars kept."""
    fake = replay(version, "alice")
    own = queue.own_jobs()
    assert fake.read == ["squeue-own.alice"]
    assert not {job_id(version, role) for role in BOBS} & set(own)
    assert own[job_id(version, "running")] == {
        "JobState": "RUNNING",
        "Reason": "None",
        "RunTime": {"22.05": "1:52", "24.11": "1:47"}[version],
        "NodeList": "n2",
        "WorkDir": "/tmp",
        "Comment": f"tacc:running:{TAG}",
    }
    assert own[job_id(version, "name")]["Comment"] == COMMENT_WITH_BARS
    assert own[job_id(version, "held")]["Reason"] == "JobHeldUser"
    assert own[job_id(version, "requeuehold")]["Reason"] == "job requeued in held state"
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "submit.json").write_text(json.dumps({"tag": f"tacc:running:{TAG}"}))
    assert verbs.queued(own, job_id(version, "running"), tmp_path) is not None


@pytest.mark.parametrize("version", VERSIONS)
def test_an_arrays_own_tasks_on_both(version, replay):
    """verbs.array_queue: each task by "ID_N", all six pending in the lab."""
    fake = replay(version, "alice")
    tasks = verbs.array_queue(job_id(version, "array"), CONFIG)
    assert fake.read == ["squeue-own-array.alice"]
    assert list(tasks) == queue_ids(version)["array"]
    reason = {"22.05": "Resources", "24.11": "Priority"}[version]
    assert {(task["JobState"], task["Reason"], task["NodeList"]) for task in tasks.values()} == {
        ("PENDING", reason, "")
    }
    assert {task["Comment"] for task in tasks.values()} == {f"tacc:array:{TAG}"}


# alice's recorder jobs still in the queue (not cancelled), but `name` (its comment has bars)
ALICES_QUEUED = (
    "requeued",
    "requeuehold",
    "running",
    "multi",
    "array",
    "het",
    "completed",
    "failed",
    "timeout",
    "resources",
    "range",
    "dependency",
    "held",
    "begin",
    "newline",
)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_callers_tags_on_both(version, replay):
    """queue.parse_tags (found_again.queued_tags): %F is the array's id for its tasks; a
    heterogeneous job's parts print their own ids, the leader's last."""
    fake = replay(version, "alice")
    tags = found_again.queued_tags(CONFIG)
    assert fake.read == ["squeue-tags.alice"]
    expected = {f"tacc:{role}:{TAG}": job_id(version, role) for role in ALICES_QUEUED}
    assert tags == {**expected, COMMENT_WITH_BARS: job_id(version, "name")}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "user", "count"),
    [("squeue-reasons.alice", "alice", 16), ("squeue-reasons.root", "root", 17)],
)
def test_the_pending_reasons_on_both(version, name, user, count, replay):
    """queue.parse_reasons (submit.partition_load): one line a job, an array's pending
    tasks on one line; alice sees her own jobs only (PrivateData=jobs), root bob's too."""
    fake = replay(version, user)
    reasons = queue.pending_reasons("batch")
    assert fake.read == [name]
    assert len(reasons) == count
    assert Counter(reasons)["JobHeldUser"] == 2
    assert {"BeginTime", "Dependency", "job requeued in held state"} <= set(reasons)
    lines = recorded(version, name).splitlines()
    assert (job_id(version, "priority") in {line.partition("|")[0] for line in lines}) is (
        user == "root"
    )
    assert f"{job_id(version, 'array')}_[0-5%2]" in {line.partition("|")[0] for line in lines}


@pytest.mark.parametrize("version", VERSIONS)
def test_the_partitions_load_as_a_user_sees_it(version, replay):
    """submit.partition_load: no idle node, and alice's jobs waiting for nodes (11: not
    the requeued-held one, see the next test)."""
    replay(version, "alice")
    assert submit.partition_load("batch", TIMEOUT) == PartitionLoad(0, 11)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_requeued_held_job_waits_for_no_node(version, replay):
    replay(version, "alice")
    reasons = queue.pending_reasons("batch")
    held = [reason for reason in reasons if "held" in reason.lower()]
    assert submit.waiting_jobs(reasons) == len(reasons) - len(held) - 2  # BeginTime, Dependency


@pytest.mark.parametrize("version", VERSIONS)
def test_jobs_per_partition_and_state_on_both(version, replay):
    """queue.parse_partition_states (health/slurm_cluster.read_jobs): array tasks each."""
    fake = replay(version)
    counts = slurm_cluster.read_jobs(slurm_cluster.Sources())
    assert fake.read == ["squeue-partition-states.root"]
    assert counts == Counter({("batch", "pending"): 22, ("batch", "running"): 2})


@pytest.mark.parametrize("version", VERSIONS)
def test_the_uids_holding_the_busy_node_on_both(version, replay):
    """queue.parse_uids (health/checks/tmpfiles.job_uids, on the compute node)."""
    fake = replay(version)
    assert tmpfiles.job_uids(TIMEOUT, node="n2") == {ALICE_UID, 2002}
    assert fake.read == ["squeue-uids.root"]


# --- sacct ------------------------------------------------------------------------------------

# (recorder role or job id, state, still running) of each run sacct reports in the
# window, as the user and as root; jobs that never started are left out. Before the
# recorder's: site.yml's acceptance jobs (1-7, root's) and, on 24.11, alice's own (8, 9).
ALICES_RUNS = [
    ("cancelled", "CANCELLED", False),  # "CANCELLED by 2001"
    ("requeued", "REQUEUED", False),  # its first run; its second has not started
    ("requeuehold", "REQUEUED", False),
    ("running", "RUNNING", True),
]
ALICES_OWN = [("8", "COMPLETED", False), ("9", "COMPLETED", False)]
ACCEPTANCE_RUNS = [(str(n), "COMPLETED", False) for n in range(1, 8)]
RUNS = {
    ("22.05", "alice"): ALICES_RUNS,
    ("24.11", "alice"): [*ALICES_OWN, *ALICES_RUNS],
    ("22.05", "root"): [
        *ACCEPTANCE_RUNS,
        ALICES_RUNS[0],
        ("suspended", "SUSPENDED", True),
        *ALICES_RUNS[1:],
        ("bob", "RUNNING", True),
    ],
    ("24.11", "root"): [
        *ACCEPTANCE_RUNS,
        *ALICES_OWN,
        ALICES_RUNS[0],
        ("suspended", "SUSPENDED", True),
        *ALICES_RUNS[1:],
        ("bob", "RUNNING", True),
    ],
}


def run_ids(version: str, runs: list[tuple[str, str, bool]]) -> list[tuple[str, str, bool]]:
    return [(job_id(version, job) if job in SHOWN else job, *rest) for job, *rest in runs]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "user"), [("sacct-allocations.alice", "alice"), ("sacct-allocations.root", "root")]
)
def test_the_allocations_of_a_usage_report_on_both(version, name, user, replay):
    """accounting.allocations (SLURM_TIME_FORMAT=standard): "CANCELLED by 2001" is
    CANCELLED; a running job has no end; a pending one (Start=Unknown) is left out."""
    fake = replay(version, user)
    scope = [f"--user={placeholder(version, 'uid')}"] if user == "alice" else ["--allusers"]
    found = accounting.allocations(scope, *window(version), TIMEOUT)
    assert fake.read == [name]
    assert [(a.job_id, a.state, a.end is None) for a in found] == run_ids(
        version, RUNS[version, user]
    )
    assert all(a.partition == "batch" and a.gpus == 0 for a in found)
    running = found[[a.job_id for a in found].index(job_id(version, "running"))]
    assert (running.user, running.account, running.cpus) == ("alice", "research", 1)
    epoch = recorded(version, "scontrol-show-job-running.epoch.root")
    started = times.epoch_seconds(parse_oneliner(epoch)["StartTime"])
    assert running.start == datetime.fromtimestamp(started, UTC).replace(tzinfo=None)  # lab: UTC


@pytest.mark.parametrize("version", VERSIONS)
def test_the_node_range_a_job_was_submitted_with(version, replay):
    """accounting.submitted_nodes (preempt.recorded_range): --nodes=1-2 from the submit
    line; a job submitted without --nodes has no range."""
    fake = replay(version)
    assert accounting.submitted_nodes(job_id(version, "range"), f"{SCRIPTS}/sleep.sh") == (1, 2)
    assert accounting.submitted_nodes(job_id(version, "completed"), f"{SCRIPTS}/true.sh") is None
    assert fake.read == ["sacct-submit-line-range.root", "sacct-submit-line-completed.root"]


@pytest.fixture
def alices_uid(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accounting, "os", SimpleNamespace(getuid=lambda: ALICE_UID))


@pytest.mark.parametrize("version", VERSIONS)
def test_where_ended_jobs_ran_on_both(version, replay, alices_uid):
    """accounting.own_job_nodes (verbs.ran_on): none of the four ran ("None assigned"):
    the lab's completed and failed jobs never started, sacct shows a requeued job's last
    (pending) run only, and a job cancelled while pending ran nowhere."""
    fake = replay(version, "alice")
    ended = [job_id(version, role) for role in ("completed", "failed", "cancelled_pending")]
    ended.append(job_id(version, "requeued"))
    assert verbs.ran_on(ended, CONFIG) == {}
    assert fake.read == ["sacct-job-nodes.alice"]
    lines = recorded(version, "sacct-job-nodes.alice").splitlines()
    assert sorted(lines) == sorted(f"{job}|None assigned" for job in ended)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_callers_jobs_since_a_moment_on_both(version, replay, alices_uid):
    """accounting.own_jobs_since (found_again.accounted_job): (id, directory, comment);
    the comment is empty (Slurm keeps none: AccountingStoreFlags=(null)), so a job is
    found by its directory."""
    fake = replay(version, "alice")
    places = accounting.own_jobs_since(placeholder(version, "since"))
    assert fake.read == ["sacct-job-places.alice"]
    assert {comment for _, _, comment in places} == {""}
    het, array = job_id(version, "het"), job_id(version, "array")
    ids = [job for job, _, _ in places]
    assert f"{array}_[0-5%2]" in ids
    if version == "22.05":
        assert [f"{het}+0", f"{het}+1"] == [job for job in ids if job.startswith(f"{het}+")]
    else:
        assert ids[:2] == ["8", "9"]  # alice's own jobs, run by hand and by tcloud
        assert places[1][1] == "/shared/tcloud/alice/jobs/76bc906d7919-1"
    since = time.mktime(time.strptime(placeholder(version, "since"), SACCT_TIME))
    since += found_again.SACCT_SLACK_SECONDS
    found = found_again.accounted_job(
        Path("/shared/tcloud/alice/jobs/76bc906d7919-1"), "tacc:lost:00", since, CONFIG
    )
    assert found == {"22.05": None, "24.11": "9"}[version]


# --- the rolling and acceptance roles (YAML) and bench ------------------------------------------

ROLLING = "roles/rolling/tasks/main.yml"
ACCEPTANCE = "roles/acceptance/tasks/main.yml"
BENCH = "bench/operations.py"
# Each as the file spells it (a Jinja string in YAML: `\\S` is the regex `\S`).
# ROLLING, "Leave alone a node someone else took out of service":
TAKEN_OUT = r"regex_search('State=\\S*(DRAIN|DOWN|FAIL)')"
TAKEN_OUT_BY_US = r"regex_search('Reason=tacc: (rolling|acceptance)')"
# ROLLING, "Say why this node does not roll" (shown to a human):
REASON_SHOWN = r"regex_search('Reason=.*$')"
# ROLLING, "Wait until the node's new slurmd answers the controller":
SLURMD_STARTED = r"regex_search('SlurmdStartTime=\\S+')"
NODE_STATE = r"regex_search('State=\\S+')"
NOT_ANSWERING = r"is not search('NOT_RESPONDING|DOWN')"
# ACCEPTANCE, "Run the acceptance tests (...)": the reason of "Read why the node is drained".
ACCEPTANCE_REASON = r"is match('tacc: (acceptance (pending|failed)|rolling )')"
# BENCH, slurmd_start and bare_reboot:
BENCH_SLURMD_STARTED = r'r"SlurmdStartTime=(\S+)"'
BENCH_STATE = r'r"State=(\S+)"'


def source(path: str) -> str:
    return (REPOSITORY / path).read_text()


def pattern(spelled: str) -> str:
    """The regex of a Jinja filter or test as the YAML spells it, or of a Python r"..."."""
    quoted = re.search(r"""(['"])(.*)\1""", spelled)
    assert quoted is not None, spelled
    return quoted.group(2).replace("\\\\", "\\")


def ansible_stdout(version: str, name: str) -> str:
    """stdout as Ansible's command module registers it (trailing newlines stripped)."""
    return recorded(version, name).rstrip("\r\n")


def regex_search(text: str, spelled: str) -> str | None:
    """Ansible's regex_search filter: the first match, or None."""
    found = re.search(pattern(spelled), text)
    return found.group(0) if found else None


def walk(tasks: list[dict]) -> Iterator[dict]:
    for task in tasks:
        yield task
        yield from walk(task.get("block", []))


def task_argv(path: str, name: str, host: str) -> list[str]:
    """The argv of the task named so, for inventory_hostname host."""
    [task] = [task for task in walk(yaml.safe_load(source(path))) if task.get("name") == name]
    argv = task["ansible.builtin.command"]["argv"]
    return [word.replace("{{ inventory_hostname }}", host) for word in argv]


def recorded_argv(version: str, name: str) -> list[str]:
    [entry] = [entry for entry in manifest(version)["recordings"] if entry["name"] == name]
    return entry["argv"]


@pytest.mark.parametrize(
    ("path", "spelled"),
    [
        (ROLLING, TAKEN_OUT),
        (ROLLING, TAKEN_OUT_BY_US),
        (ROLLING, REASON_SHOWN),
        (ROLLING, SLURMD_STARTED),
        (ROLLING, NODE_STATE),
        (ROLLING, NOT_ANSWERING),
        (ACCEPTANCE, ACCEPTANCE_REASON),
        (BENCH, BENCH_SLURMD_STARTED),
        (BENCH, BENCH_STATE),
    ],
)
def test_the_copied_regexes_are_the_files_own(path, spelled):
    assert spelled in source(path)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("recording", "host"),
    [
        ("scontrol-show-node-oneline-drained.root", "n3"),
        ("scontrol-show-node-oneline-busy.root", "n2"),
    ],
)
def test_rolling_reads_a_nodes_one_line_on_both(version, recording, host):
    """Neither node is out of service (n3 is only reserved), so both roll; the start time
    of slurmd and the state read as the wait compares them."""
    for task in ("Read the node's state in Slurm", "Read when the node's slurmd last started"):
        assert task_argv(ROLLING, task, host) == recorded_argv(version, recording)
    stdout = ansible_stdout(version, recording)
    assert regex_search(stdout, TAKEN_OUT) is None
    assert regex_search(stdout, TAKEN_OUT_BY_US) is None
    assert regex_search(stdout, REASON_SHOWN) is None  # shown as "no reason"
    started = regex_search(stdout, SLURMD_STARTED)
    assert (
        started
        == "SlurmdStartTime="
        + {"22.05": "2026-12-02T15:58:14", "24.11": "2026-12-02T15:47:51"}[version]
    )
    state = regex_search(stdout, NODE_STATE)
    assert state == "State=" + ("ALLOCATED" if host == "n2" else RESERVED)
    assert re.search(pattern(NOT_ANSWERING), state) is None
    assert re.search(pattern(BENCH_SLURMD_STARTED), stdout).group(1) == started.partition("=")[2]
    assert re.search(pattern(BENCH_STATE), stdout).group(0) == state


def test_rolling_would_leave_a_drained_node_alone():
    """The same regexes on the state a drained node shows (the lab's n3 was not drained:
    its scontrol line with the drain spelled in, as Slurm prints it)."""
    line = ansible_stdout("24.11", "scontrol-show-node-oneline-drained.root")
    drained = line.replace(f"State={RESERVED}", "State=IDLE+DRAIN+MAINTENANCE+RESERVED")
    drained += " Reason=disk swap [root@2026-12-02T15:00:00]"
    assert regex_search(drained, TAKEN_OUT) == "State=IDLE+DRAIN"
    assert regex_search(drained, TAKEN_OUT_BY_US) is None
    assert regex_search(drained, REASON_SHOWN) == "Reason=disk swap [root@2026-12-02T15:00:00]"


@pytest.mark.parametrize("version", VERSIONS)
def test_rolling_lists_and_waits_for_the_nodes_jobs_on_both(version):
    """stdout_lines: one job id a line (each is signalled and requeued); the wait ends on
    an empty stdout."""
    rolling = source(ROLLING)
    assert 'loop: "{{ rolling_jobs.stdout_lines }}"' in rolling
    assert "until: rolling_left.stdout | trim | length == 0" in rolling
    assert task_argv(ROLLING, "List the node's jobs", "n2") == recorded_argv(
        version, "squeue-rolling-running.root"
    )
    wait = "Wait until no job is left on the node"
    assert task_argv(ROLLING, wait, "n2") == recorded_argv(version, "squeue-rolling-left.root")
    assert task_argv(ROLLING, wait, "n3") == recorded_argv(
        version, "squeue-rolling-left-drained.root"
    )
    running = ansible_stdout(version, "squeue-rolling-running.root").splitlines()
    assert running == [job_id(version, "bob"), job_id(version, "running")]
    left = ansible_stdout(version, "squeue-rolling-left.root")
    assert left.splitlines() == [*running, job_id(version, "suspended")]  # suspended too
    assert len(left.strip()) > 0
    assert len(ansible_stdout(version, "squeue-rolling-left-drained.root").strip()) == 0


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("recording", "host"), [("sinfo-reason-drained.root", "n3"), ("sinfo-reason-busy.root", "n2")]
)
def test_acceptance_reads_a_nodes_reason_on_both(version, recording, host):
    """sinfo %100E: the reason padded to 100 characters, "none" for no reason."""
    assert task_argv(ACCEPTANCE, "Read why the node is drained, if it is", host) == recorded_argv(
        version, recording
    )
    stdout = ansible_stdout(version, recording)
    assert (len(stdout), stdout.strip()) == (100, "none")
    assert re.match(pattern(ACCEPTANCE_REASON), stdout.strip()) is None
    for reason in ("tacc: acceptance pending", "tacc: acceptance failed: mpi", "tacc: rolling x"):
        padded = reason.ljust(100)  # as sinfo would print one
        assert re.match(pattern(ACCEPTANCE_REASON), padded.strip()) is not None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("name", "left"),
    [
        ("scontrol-show-reservation-multiline.root", True),
        ("scontrol-show-reservation-multiline-unknown.root", False),
    ],
)
def test_acceptance_finds_a_leftover_reservation_by_exit_status(version, name, left):
    """acceptance_leftover.rc == 0: the reservation a killed run left; 1 when none."""
    assert "or acceptance_leftover.rc == 0" in source(ACCEPTANCE)
    reservation = "tacc-accept-n3" if left else "tacc-accept-nosuch"
    task = "Look for an acceptance reservation a killed run left"
    host = reservation.removeprefix("tacc-accept-")
    assert task_argv(ACCEPTANCE, task, host) == recorded_argv(version, name)
    assert (exit_status(version, name) == 0) is left
    text = recorded(version, name)
    assert text.startswith(f"ReservationName={reservation} ") if left else "not found" in text


# --- every recording has its reader --------------------------------------------------------

SACCTMGR_TESTS = REPOSITORY / "tests" / "unit" / "roles" / "test_recorded_sacctmgr.py"


@pytest.mark.parametrize("version", VERSIONS)
def test_every_recording_is_fed_to_a_reader(version):
    """Each recording of the manifest is named by a test (here, where job views are
    named by JOB_VIEWS, or in the role's test file): a new one needs its test."""
    texts = Path(__file__).read_text() + SACCTMGR_TESTS.read_text()
    named = {job_view_name(role, user) for role, user in JOB_VIEWS}
    missing = [
        entry["name"]
        for entry in manifest(version)["recordings"]
        if entry["name"] not in named and f'"{entry["name"]}"' not in texts
    ]
    assert missing == []
