"""A resize never takes a job's node range on its owner's word (issue [18] point 2).

The range is in the owner's own status/submit.json, which she may rewrite at any time;
root's `scontrol update NumNodes=K-K` is an administrator's change, which Slurm holds to
no QOS or association limit. So the agent resizes within the range it recorded for the
job (tasks/node_ranges.py: capped at the maximum Slurm kept from her submit) and grows a
job only as far as Slurm's limits allow it (tasks/node_limits.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks import node_limits, node_ranges, preempt
from tests.unit.test_preempt import chown_tree, owner_uid

ENFORCING = "AccountingStorageType = accounting_storage/slurmdbd\n" + (
    "AccountingStorageEnforce = associations,limits,qos,safe\n"
)
NOT_ENFORCING = "AccountingStorageEnforce = none\n"


def submit_record(low: int, high: int) -> dict:
    return {"plugin_data": {"elastic": {"opt_in": ["resize"], "range": [low, high]}}}


class Cluster:
    """Slurm as the agent sees it (scontrol, sacctmgr) and the runner of the owner's
    verbs and of root's scontrol update: alice's job 41 runs on `nodes` nodes of a
    job submitted with --nodes=SIZE-`slurm_max`; the owner's halt leaves it held, its
    range showing (NumNodes=SIZE-MAX), as Slurm shows a pending job."""

    def __init__(self, job_dir: Path, nodes: int = 1, slurm_max: int = 3, tres: str = "") -> None:
        self.slurm_max = slurm_max
        self.job = {
            "JobId": "41",
            "UserId": f"alice({owner_uid()})",
            "JobState": "RUNNING",
            "WorkDir": str(job_dir),
            "NumNodes": str(nodes),
            "Partition": "batch",
            "QOS": "normal",
            "Account": "lab",
            "TRES": tres or f"cpu={nodes},node={nodes}",
        }
        self.others: list[dict[str, str]] = []
        self.partition = {"PartitionName": "batch", "MaxNodes": "UNLIMITED"}
        self.config = NOT_ENFORCING
        self.qos = "||\n"  # MaxTRES|MaxTRESPU
        self.assoc = "||\n"  # MaxTRES|GrpTRES
        self.commands: list[list[str]] = []  # everything the runner ran

    def show(self, kind: str, name: str = "", timeout: float = 0) -> list[dict[str, str]]:
        if kind == "partition":
            return [self.partition]
        return [self.job] if name == "41" else [self.job, *self.others]

    def ask(self, argv: list[str], timeout: float = 0, check: bool = True, env=None) -> str:
        self.commands.append(argv)
        if argv[:3] == ["scontrol", "show", "config"]:
            return self.config
        if argv[:5] == ["sacctmgr", "--noheader", "--parsable2", "show", "qos"]:
            return self.qos
        if argv[:5] == ["sacctmgr", "--noheader", "--parsable2", "show", "assoc"]:
            return self.assoc
        raise AgentError(f"{argv[0]}: not in this cluster")

    def run(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.commands.append(argv)
        if "halt" in argv:
            size = self.job["NumNodes"]
            self.job.update(JobState="PENDING", NumNodes=f"{size}-{self.slurm_max}")
        return 0, "{}"

    def sizes_set(self) -> list[str]:
        return [
            word
            for argv in self.commands
            if argv[:2] == ["scontrol", "update"]
            for word in argv
            if word.startswith("NumNodes=")
        ]


@pytest.fixture
def job_dir(tmp_path) -> Path:
    directory = tmp_path / "alice" / "jobs" / "abc-1"
    (directory / "status").mkdir(parents=True)
    write_range(directory, 1, 3)
    return directory


def write_range(job_dir: Path, low: int, high: int) -> None:
    path = job_dir / "status" / "submit.json"
    path.unlink(missing_ok=True)
    path.write_text(json.dumps(submit_record(low, high)))
    chown_tree(job_dir.parent.parent, owner_uid())


@pytest.fixture
def config(tmp_path) -> AgentConfig:
    return AgentConfig(state_dir=str(tmp_path / "state"), slurm_timeout_seconds=15)


def cluster_of(monkeypatch, job_dir: Path, **shape) -> Cluster:
    cluster = Cluster(job_dir, **shape)
    monkeypatch.setattr(slurm, "show", cluster.show)
    monkeypatch.setattr(slurm, "slurm", cluster.ask)

    class Entry:
        pw_name = "alice"

    monkeypatch.setattr(preempt.pwd, "getpwuid", lambda uid: Entry)
    return cluster


def resize(cluster: Cluster, config: AgentConfig, nodes: int) -> tuple[bool, list[str]]:
    notes: list[str] = []
    done = preempt.requeue(
        "41", "resized by elastic: grow", config, notes.append, cluster.run, nodes=nodes
    )
    return done, notes


def store(config: AgentConfig) -> Path:
    return node_ranges.store_path(config.state_dir)


def key(job_dir: Path) -> node_ranges.Key:
    return ("41", owner_uid(), str(job_dir))


# ------------------------------------------------------------------ the security cases
@pytest.mark.security
def test_an_owner_who_rewrites_her_range_is_not_grown_past_the_recorded_one(
    monkeypatch, job_dir, config
):
    """alice's job was submitted as 1-3 (Slurm keeps the maximum, 3); the agent recorded
    1-3 at its first resize. She then rewrites her submit.json to 1-100000 and the tick,
    which reads that file, asks for 50 nodes (50 are idle): refused, logged, nothing run."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=2)
    node_ranges.record(store(config), key(job_dir), (1, 3), 0.0)
    write_range(job_dir, 1, 100_000)
    done, notes = resize(cluster, config, 50)
    assert done is False and cluster.sizes_set() == []
    assert not any("halt" in argv for argv in cluster.commands)  # not even checkpointed
    assert notes == [
        "agent: job 41 not requeued: its record's range (1-100000) is not the one recorded (1-3)"
    ]


@pytest.mark.security
def test_a_range_rewritten_before_the_first_resize_is_capped_at_slurms_maximum(
    monkeypatch, job_dir, config
):
    """No range recorded yet: the job's maximum is Slurm's (what her sbatch asked and
    Slurm accepted: 3), read once the job is held. Her 1-100000 is refused there, the
    job goes back at its old size, and 1-3 is what the agent records."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=2, slurm_max=3)
    write_range(job_dir, 1, 100_000)
    done, notes = resize(cluster, config, 50)
    assert done is False and cluster.sizes_set() == []
    assert notes[0] == (
        "agent: job 41: its size not changed: its record's range (1-100000) "
        "is not the one recorded (1-3)"
    )
    assert any("resume" in argv for argv in cluster.commands)  # requeued, never left held
    assert node_ranges.recorded(store(config), key(job_dir)) == (1, 3)


@pytest.mark.security
def test_a_grow_stops_at_the_qos_node_limit(monkeypatch, job_dir, config):
    """Within her range (1-8), but her QOS allows 2 nodes a job (MaxTRESPerJob
    node=2): root's update would pass Slurm's limits, so the agent refuses it."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=8)
    write_range(job_dir, 1, 8)
    cluster.config, cluster.qos = ENFORCING, "node=2|\n"
    done, notes = resize(cluster, config, 4)
    assert done is False and cluster.sizes_set() == []
    assert notes == [
        "agent: job 41 not requeued: 4 node(s) is more than Slurm's limits allow "
        "it (2: QOS normal MaxTRESPerJob node=2)"
    ]
    assert resize(cluster, config, 2)[0] is True and cluster.sizes_set() == ["NumNodes=2-2"]


@pytest.mark.security
def test_a_grow_counts_the_gpus_her_other_jobs_hold_against_her_quota(monkeypatch, job_dir, config):
    """2 GPUs a node; her QOS allows 8 GPUs a user, and another job of hers holds 4:
    3 nodes (6 GPUs) would make 10."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4, tres="cpu=2,node=1,gres/gpu=2")
    write_range(job_dir, 1, 4)
    cluster.config, cluster.qos = ENFORCING, "|gres/gpu=8\n"
    cluster.others = [
        {
            "JobId": "40",
            "UserId": f"alice({owner_uid()})",
            "JobState": "RUNNING",
            "WorkDir": "/shared/alice/jobs/x",
            "TRES": "cpu=4,node=1,gres/gpu=4",
        }
    ]
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: QOS normal MaxTRESPerUser gres/gpu=8)" in notes[0]
    assert resize(cluster, config, 2)[0] is True


# ------------------------------------------------------------------ the resize as before
def test_an_honest_first_grow_records_the_range_and_sets_the_size(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    done, notes = resize(cluster, config, 3)
    assert done is True and cluster.sizes_set() == ["NumNodes=3-3"]
    assert node_ranges.recorded(store(config), key(job_dir)) == (1, 3)
    assert notes == [
        "agent: job 41 of alice checkpointed and requeued at 3 node(s) (resized by elastic: grow)"
    ]


def test_a_later_shrink_and_grow_keep_to_the_recorded_range(monkeypatch, job_dir, config):
    """After root set NumNodes=3-3, Slurm's maximum is 3 whatever the task's: the
    recorded range stands (a shrink to 1, then a grow back to 3)."""
    node_ranges.record(store(config), key(job_dir), (1, 3), 0.0)
    cluster = cluster_of(monkeypatch, job_dir, nodes=3, slurm_max=3)
    assert resize(cluster, config, 1)[0] is True
    cluster.job.update(JobState="RUNNING", NumNodes="1")
    cluster.slurm_max = 1  # root's NumNodes=1-1
    assert resize(cluster, config, 3)[0] is True
    assert cluster.sizes_set() == ["NumNodes=1-1", "NumNodes=3-3"]


def test_a_shrink_reads_no_limits(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=3)
    assert resize(cluster, config, 1)[0] is True
    assert not any(
        argv[0] == "sacctmgr" or argv[1:3] == ["show", "config"] for argv in cluster.commands
    )


@pytest.mark.fault
def test_limits_slurm_does_not_answer_refuse_the_grow(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    cluster.config = ENFORCING

    def down(argv, timeout=0, check=True, env=None):
        if argv[0] == "sacctmgr":
            raise AgentError("sacctmgr: error: slurmdbd: Connection refused")
        return cluster.ask(argv, timeout)

    monkeypatch.setattr(slurm, "slurm", down)
    done, notes = resize(cluster, config, 2)
    assert done is False and cluster.sizes_set() == []
    assert "Slurm's limits on it could not be read: sacctmgr: error" in notes[0]


@pytest.mark.fault
def test_a_job_slurm_does_not_show_held_after_its_halt_keeps_its_size(monkeypatch, job_dir, config):
    """Its range is read from the held job: one still shown ending (COMPLETING) has
    none to read, so its size is left alone and it is resumed, never left held."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)

    def halt_still_ending(argv: list[str], timeout: float) -> tuple[int, str]:
        cluster.commands.append(argv)
        if "halt" in argv:
            cluster.job["JobState"] = "COMPLETING"
        return 0, "{}"

    notes: list[str] = []
    assert not preempt.requeue(
        "41", "resized by test", config, notes.append, halt_still_ending, nodes=2
    )
    assert cluster.sizes_set() == [] and any("resume" in argv for argv in cluster.commands)
    assert "its size not changed: Slurm shows it neither pending nor held" in notes[0]
    assert node_ranges.recorded(store(config), key(job_dir)) is None


@pytest.mark.fault
def test_a_range_that_cannot_be_recorded_once_held_still_resumes_the_job(
    monkeypatch, job_dir, tmp_path
):
    (tmp_path / "state").write_text("a file, not a directory")
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    config = AgentConfig(state_dir=str(tmp_path / "state"))
    done, notes = resize(cluster, config, 2)
    assert done is False and cluster.sizes_set() == []
    assert any("resume" in argv for argv in cluster.commands)
    assert "its size not changed: its range could not be recorded" in notes[0]


def test_without_accounting_only_the_partitions_maxnodes_applies(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    cluster.partition["MaxNodes"] = "2"
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: partition batch MaxNodes node=2)" in notes[0]
    assert not any(argv[0] == "sacctmgr" for argv in cluster.commands)


def test_a_pending_job_records_its_range_from_slurm_before_any_resize(monkeypatch, job_dir, config):
    """A resize back while it waits (its grow never got its nodes), with no range
    recorded (the agent's state lost): Slurm's maximum is root's own 3-3."""
    cluster = cluster_of(monkeypatch, job_dir)
    cluster.job.update(JobState="PENDING", NumNodes="3-3")
    done, _ = resize(cluster, config, 1)
    assert done is True and cluster.sizes_set() == ["NumNodes=1-1"]
    assert node_ranges.recorded(store(config), key(job_dir)) == (1, 3)


# ------------------------------------------------------------------ parsing Slurm's records
@pytest.mark.parametrize(
    ("num_nodes", "state", "counts"),
    [
        ("2-4", "PENDING", (2, 4)),
        ("2", "PENDING", (2, 2)),
        ("2", "REQUEUE_HOLD", (2, 2)),
        ("2", "RUNNING", (2, 0)),
        ("", "RUNNING", (0, 0)),
        ("x-4", "PENDING", (0, 0)),
    ],
)
def test_numnodes_gives_the_count_and_a_waiting_jobs_maximum(num_nodes, state, counts):
    assert preempt.node_counts(num_nodes, state) == counts


def test_a_job_record_keeps_where_it_counts_against_slurms_limits(tmp_path):
    job = preempt.record_of(
        {
            "JobId": "41",
            "UserId": "alice(1001)",
            "WorkDir": str(tmp_path),
            "JobState": "PENDING",
            "NumNodes": "1-3",
            "Partition": "batch",
            "QOS": "normal",
            "Account": "(null)",
            "TRES": "cpu=1,node=1",
        }
    )
    assert job is not None
    assert (job.nodes, job.max_nodes, job.partition, job.qos, job.account, job.tres) == (
        1,
        3,
        "batch",
        "normal",
        "",
        "cpu=1,node=1",
    )


# ------------------------------------------------------------------ node_limits
def test_tres_counts_keep_whole_numbers_only():
    assert node_limits.tres_counts("cpu=8,mem=4G,node=2,gres/gpu=4,billing=8, x") == {
        "cpu": 8,
        "node": 2,
        "gres/gpu": 4,
        "billing": 8,
    }
    assert node_limits.per_node({"cpu": 8, "node": 2, "gres/gpu": 3}, 2) == {
        "cpu": 4,
        "node": 1,
        "gres/gpu": 2,
    }
    assert node_limits.per_node({}, 0) == {"node": 1}


@pytest.mark.parametrize(
    ("text", "enforced"),
    [
        (ENFORCING, True),
        ("AccountingStorageEnforce = qos\n", True),
        ("AccountingStorageEnforce = associations\n", False),
        (NOT_ENFORCING, False),
        ("", False),
    ],
)
def test_limits_apply_where_slurm_enforces_them(text, enforced):
    assert node_limits.enforced(text) is enforced


def test_the_lowest_limit_sets_the_ceiling_and_says_which():
    limits = node_limits.Limits(
        per_job=[("QOS q MaxTRESPerJob", {"node": 6, "cpu": 64})],
        per_user=[("QOS q MaxTRESPerUser", {"gres/gpu": 8})],
    )
    share = {"node": 1, "cpu": 4, "gres/gpu": 2}
    assert node_limits.ceiling(limits, share, []) == (4, "QOS q MaxTRESPerUser gres/gpu=8")
    assert node_limits.ceiling(limits, share, [{"gres/gpu": 7}]) == (
        0,
        "QOS q MaxTRESPerUser gres/gpu=8",
    )
    assert node_limits.ceiling(node_limits.Limits(), share, []) == (node_limits.MAX_NODES, "")


@pytest.mark.bad_input
def test_a_user_name_that_is_no_name_reads_no_limits():
    place = node_limits.JobPlace("-x", "batch", "normal", "lab")
    with pytest.raises(AgentError, match="not a user name"):
        node_limits.read_limits(place, 1)


# ------------------------------------------------------------------ node_ranges
def test_the_recorded_range_is_roots_alone_and_names_one_submission(tmp_path):
    path = tmp_path / "state" / node_ranges.STORE_FILE
    node_ranges.record(path, ("41", 1001, "/u/alice/jobs/a-1"), (1, 3), 100.0)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert node_ranges.recorded(path, ("41", 1001, "/u/alice/jobs/a-1")) == (1, 3)
    assert node_ranges.recorded(path, ("41", 1002, "/u/alice/jobs/a-1")) is None
    assert node_ranges.recorded(path, ("41", 1001, "/u/alice/jobs/b-1")) is None


def test_a_damaged_or_forgotten_entry_is_dropped(tmp_path):
    path = tmp_path / node_ranges.STORE_FILE
    path.write_text(
        json.dumps(
            {
                "jobs": {
                    "7": {"uid": 1, "job_dir": "/j", "range": [3, 1], "used": 0},
                    "8": {"uid": 1, "job_dir": "/j", "range": [1, True], "used": 0},
                    "9": {"uid": 1, "job_dir": "/j", "range": [1, 2], "used": 0},
                }
            }
        )
    )
    assert set(node_ranges.load(path)) == {"9"}
    node_ranges.record(path, ("10", 1, "/k"), (1, 1), node_ranges.FORGET_SECONDS + 1)
    assert set(node_ranges.load(path)) == {"10"}
