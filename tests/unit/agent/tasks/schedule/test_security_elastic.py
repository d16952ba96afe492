"""A resize never takes a job's node range on its owner's word (issue [18] point 2).

The range is in the owner's own status/submit.json, which she may rewrite at any time;
root's `scontrol update NumNodes=K-K` is an administrator's change, which Slurm holds to
no QOS or association limit. So the agent resizes within the range it recorded for the
job (tasks/schedule/node_ranges.py: capped at the maximum Slurm kept from her submit) and grows a
job only as far as Slurm's limits allow it (tasks/schedule/node_limits.py)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.schedule import node_limits, node_ranges, preempt
from tests.unit.agent.tasks.schedule.test_preempt import chown_tree, owner_uid

ENFORCING = "AccountingStorageType = accounting_storage/slurmdbd\n" + (
    "AccountingStorageEnforce = associations,limits,qos,safe\n"
)
NOT_ENFORCING = "AccountingStorageEnforce = none\n"


def submit_record(low: int, high: int) -> dict:
    return {"plugin_data": {"elastic": {"opt_in": ["resize"], "range": [low, high]}}}


ASSOC_TREE = "root||||\ndept|root|||\nlab|dept|||\nlab2|dept|||\nlab||alice||\n"


def running(
    job_id: str, tres: str, user: str = "alice", account: str = "lab", name: str = "train"
) -> dict[str, str]:
    """Another running job, as both scontrol and squeue show it."""
    uid = owner_uid() if user == "alice" else 5000
    return {
        "JobId": job_id,
        "JobName": name,
        "UserId": f"{user}({uid})",
        "JobState": "RUNNING",
        "WorkDir": f"/shared/{user}/jobs/x",
        "Partition": "batch",
        "QOS": "normal",
        "Account": account,
        "TRES": tres,
    }


def scontrol_line(info: dict[str, str]) -> str:
    """A job's one-line record as scontrol prints it: its name second."""
    first = f"JobId={info['JobId']} JobName={info['JobName']}"
    return " ".join(
        [first, *(f"{k}={v}" for k, v in info.items() if k not in ("JobId", "JobName"))]
    )


def squeue_line(info: dict[str, str]) -> str:
    """squeue's tres-alloc is one field in every Slurm, however scontrol names it."""
    info = {"TRES": info.get("AllocTRES", ""), **info}
    fields = ("JobId", "UserId", "Account", "QOS", "Partition", "TRES")
    return "".join(f"{info[k].partition('(')[0]}|" for k in fields)


class Cluster:
    """Slurm as the agent sees it (scontrol, squeue, sacctmgr) and the runner of the
    owner's verbs and of root's scontrol update: alice's job 41 runs on `nodes` nodes of
    a job submitted with --nodes=SIZE-`slurm_max`; the owner's halt leaves it held, its
    range showing (NumNodes=SIZE-MAX), as Slurm shows a pending job. `others` are the
    other running jobs, read through Slurm's own parsers."""

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
        self.started_during_halt: list[dict[str, str]] = []
        self.partition = {"PartitionName": "batch", "MaxNodes": "UNLIMITED", "QoS": "N/A"}
        self.partitions = [self.partition]
        self.config = NOT_ENFORCING
        self.qos = "normal||||\n"  # Name|MaxTRES|MaxTRESPU|MaxTRESPA|GrpTRES
        self.assoc = ASSOC_TREE  # Account|ParentName|User|MaxTRES|GrpTRES
        self.squeue_extra = ""
        self.commands: list[list[str]] = []  # everything the runner ran
        # Slurm's accounting (slurmdbd): sacct shows the submit line; a held job that
        # ran shows only the size it held (NumNodes=SIZE), as a real Slurm does.
        self.submit_line = ""

    def show_lines(self, kind: str, name: str = "", timeout: float = 0) -> list[str]:
        if kind == "partition":
            return [" ".join(f"{k}={v}" for k, v in p.items()) for p in self.partitions]
        mine = scontrol_line({"JobName": "grower", **self.job}).splitlines()
        others = [line for info in self.others for line in scontrol_line(info).splitlines()]
        return mine if name == "41" else [*mine, *others]

    def ask(self, argv: list[str], timeout: float = 0, check: bool = True, env=None) -> str:
        self.commands.append(argv)
        if argv[:3] == ["scontrol", "show", "config"]:
            return self.config
        if argv[:2] == ["scontrol", "show"] and "--oneliner" in argv:
            name = argv[4] if len(argv) > 4 else ""
            return "".join(line + "\n" for line in self.show_lines(argv[2], name))
        if argv[0] == "squeue" and "--states=RUNNING,SUSPENDED" in argv:
            running_now = [self.job] if self.job["JobState"] == "RUNNING" else []
            lines = [squeue_line(info) + "\n" for info in [*running_now, *self.others]]
            return "".join(lines) + self.squeue_extra
        if argv[0] == "sacct" and "--format=JobID,SubmitLine" in argv and self.submit_line:
            return f"41|{self.submit_line}\n"
        if argv[:5] == ["sacctmgr", "--noheader", "--parsable2", "show", "qos"]:
            return self.qos
        if argv[:5] == ["sacctmgr", "--noheader", "--parsable2", "show", "assoc"]:
            return self.assoc
        raise AgentError(f"{argv[0]}: not in this cluster")

    def run(self, argv: list[str], timeout: float) -> tuple[int, str]:
        self.commands.append(argv)
        if "halt" in argv:
            size = self.job["NumNodes"]
            shown = size if self.submit_line else f"{size}-{self.slurm_max}"
            self.job.update(JobState="PENDING", NumNodes=shown)
            self.others += self.started_during_halt
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
    monkeypatch.setattr(slurm.run, "output", cluster.ask)

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
    cluster.config, cluster.qos = ENFORCING, "normal|node=2|||\n"
    done, notes = resize(cluster, config, 4)
    assert done is False and cluster.sizes_set() == []
    assert notes == [
        "agent: job 41 not requeued: 4 node(s) is more than Slurm's limits allow "
        "it (2: QOS normal MaxTRESPerJob node=2)"
    ]
    assert resize(cluster, config, 2)[0] is True and cluster.sizes_set() == ["NumNodes=2-2"]


def gpu_quota(monkeypatch, job_dir: Path) -> Cluster:
    """Her job 41 holds 2 GPUs on each of its nodes (1 now, its task allows 1-4); her QOS
    allows 8 GPUs a user, and Slurm enforces it."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4, tres="cpu=2,node=1,gres/gpu=2")
    write_range(job_dir, 1, 4)
    cluster.config, cluster.qos = ENFORCING, "normal||gres/gpu=8||\n"
    return cluster


@pytest.mark.security
def test_a_grow_counts_the_gpus_her_other_jobs_hold_against_her_quota(monkeypatch, job_dir, config):
    """2 GPUs a node; her QOS allows 8 GPUs a user, and another job of hers holds 4:
    3 nodes (6 GPUs) would make 10."""
    cluster = gpu_quota(monkeypatch, job_dir)
    cluster.others = [running("40", "cpu=4,node=1,gres/gpu=4")]
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: QOS normal MaxTRESPerUser gres/gpu=8)" in notes[0]
    assert resize(cluster, config, 2)[0] is True


@pytest.mark.security
def test_a_grow_reads_the_gpus_her_job_holds_as_slurm_24_11_prints_them(
    monkeypatch, job_dir, config
):
    """Slurm 23.02 and later print a job's TRES as ReqTRES= and AllocTRES= (no TRES=):
    the per-node GPUs still count against her quota (the reader took TRES= alone)."""
    cluster = gpu_quota(monkeypatch, job_dir)
    held = cluster.job.pop("TRES")
    cluster.job |= {"ReqTRES": "cpu=1,node=1,billing=1", "AllocTRES": held}
    cluster.others = [running("40", "cpu=4,node=1,gres/gpu=4")]
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: QOS normal MaxTRESPerUser gres/gpu=8)" in notes[0]


@pytest.mark.security
@pytest.mark.parametrize(
    "forged",
    [
        {"JobName": "x AllocTRES=cpu=1,node=1"},  # before Slurm's own TRES= on the line
        {"Comment": "y AllocTRES=cpu=1,node=1"},  # after it
    ],
)
def test_a_name_or_comment_cannot_stand_in_for_the_tres_slurm_22_05_prints(
    monkeypatch, job_dir, config, forged
):
    """Slurm 22.05 prints TRES= alone: an AllocTRES= a user writes repeats no key, so the
    one-line reader keeps it; the grow must not read her job's share from it."""
    cluster = gpu_quota(monkeypatch, job_dir)
    cluster.job = {"JobName": "x", **cluster.job} | forged
    cluster.others = [running("40", "cpu=4,node=1,gres/gpu=4")]
    done, notes = resize(cluster, config, 3)
    assert done is False and "shows no TRES Slurm prints" in notes[0]


@pytest.mark.security
def test_a_tres_slurm_shows_as_null_refuses_the_grow(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4, tres="(null)")
    write_range(job_dir, 1, 4)
    cluster.config, cluster.qos = ENFORCING, "normal||gres/gpu=8||\n"
    done, notes = resize(cluster, config, 3)
    assert done is False and "shows no TRES Slurm prints" in notes[0]


@pytest.mark.security
def test_a_job_name_that_repeats_a_key_hides_none_of_her_running_jobs(monkeypatch, job_dir, config):
    """Issue [18] review, point 1: her other job, named `x UserId=alice(uid)`, is a record
    scontrol's parser refuses whole; her running use is read from squeue's fields Slurm
    writes itself, so its 4 GPUs still count: 3 nodes of 2 GPUs would make 10 of 8."""
    cluster = gpu_quota(monkeypatch, job_dir)
    hidden = running("40", "cpu=4,node=1,gres/gpu=4", name=f"x UserId=alice({owner_uid()})")
    cluster.others = [hidden]
    assert preempt.job_records(config).keys() == {"41"}  # scontrol's view loses it
    done, notes = resize(cluster, config, 3)
    assert done is False and cluster.sizes_set() == []
    assert "(2: QOS normal MaxTRESPerUser gres/gpu=8)" in notes[0]


@pytest.mark.security
def test_a_running_job_squeue_shows_in_a_line_not_understood_refuses_the_grow(
    monkeypatch, job_dir, config
):
    """Fail closed: a line of the running jobs that cannot be read is use not counted."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4)
    write_range(job_dir, 1, 4)
    cluster.config, cluster.qos = ENFORCING, "normal||node=8||\n"
    cluster.squeue_extra = "40|alice|lab|normal|batch|cpu=4,node=1\n"
    done, notes = resize(cluster, config, 2)
    assert done is False and cluster.sizes_set() == []
    assert "Slurm's limits on it could not be read: squeue: a running job's line" in notes[0]


@pytest.mark.security
def test_her_jobs_started_during_the_grace_period_count_once_the_job_is_held(
    monkeypatch, job_dir, config
):
    """Issue [18] review, point 2: 2 nodes fit her QOS's 8 GPUs when the tick asks, but
    Slurm starts her pending 4-GPU job while the resized one checkpoints: checked again
    once held, the grow is refused and the job resumes at its old size."""
    cluster = gpu_quota(monkeypatch, job_dir)
    cluster.started_during_halt = [running("40", "cpu=4,node=1,gres/gpu=4")]
    done, notes = resize(cluster, config, 3)
    assert done is False and cluster.sizes_set() == []
    assert any("halt" in argv for argv in cluster.commands)
    assert any("resume" in argv for argv in cluster.commands)  # never left held
    assert notes[0] == (
        "agent: job 41: its size not changed: 3 node(s) is more than Slurm's limits allow "
        "it (2: QOS normal MaxTRESPerUser gres/gpu=8)"
    )


@pytest.mark.security
def test_the_partitions_own_qos_caps_the_grow(monkeypatch, job_dir, config):
    """Issue [18] review, point 3: the partition's QOS (QoS=batch-q) allows 2 nodes a job;
    her job's QOS has no limit."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=8)
    write_range(job_dir, 1, 8)
    cluster.partition["QoS"] = "batch-q"  # scontrol's spelling for a partition
    cluster.config, cluster.qos = ENFORCING, "normal||||\nbatch-q|node=2|||\n"
    done, notes = resize(cluster, config, 4)
    assert done is False and "(2: QOS batch-q MaxTRESPerJob node=2)" in notes[0]


@pytest.mark.security
def test_memory_with_units_counts_against_her_limit(monkeypatch, job_dir, config):
    """16G a node; her QOS allows 64G a user, another job of hers holds 32G: 3 nodes
    would make 80G."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4, tres="cpu=1,mem=16G,node=1")
    write_range(job_dir, 1, 4)
    cluster.config, cluster.qos = ENFORCING, "normal||mem=64G||\n"
    cluster.others = [running("40", "cpu=1,mem=32768M,node=1")]
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: QOS normal MaxTRESPerUser mem=65536)" in notes[0]


@pytest.mark.security
def test_a_parent_accounts_grptres_counts_every_job_below_it(monkeypatch, job_dir, config):
    """Her account lab is under dept, which allows 8 GPUs in all; bob's job in lab2 (also
    under dept) holds 6: a second node of 2 GPUs would make 10."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4, tres="cpu=2,node=1,gres/gpu=2")
    write_range(job_dir, 1, 4)
    cluster.config = ENFORCING
    cluster.assoc = ASSOC_TREE.replace("dept|root|||", "dept|root|||gres/gpu=8")
    cluster.others = [running("39", "cpu=6,node=1,gres/gpu=6", user="bob", account="lab2")]
    done, notes = resize(cluster, config, 2)
    assert done is False and "(1: account dept GrpTRES gres/gpu=8)" in notes[0]


@pytest.mark.security
def test_a_qos_grptres_and_maxtrespa_count_others_jobs(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=8)
    write_range(job_dir, 1, 8)
    cluster.config, cluster.qos = ENFORCING, "normal|||node=5|node=6\n"
    cluster.others = [
        running("39", "cpu=2,node=2", user="bob"),
        running("38", "cpu=2,node=2", user="carol", account="lab2"),
    ]
    done, notes = resize(cluster, config, 3)
    assert done is False and "(2: QOS normal GrpTRES node=6)" in notes[0]
    cluster.others = cluster.others[:1]
    done, notes = resize(cluster, config, 4)
    assert done is False and "(3: QOS normal MaxTRESPerAccount node=5)" in notes[0]


@pytest.mark.security
def test_a_pending_job_in_several_partitions_keeps_to_the_strictest(monkeypatch, job_dir, config):
    """Partition=batch,small: Slurm may start it in either, so small's MaxNodes=2 holds."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4)
    write_range(job_dir, 1, 4)
    cluster.job.update(JobState="PENDING", NumNodes="1-4", Partition="batch,small")
    cluster.partitions.append({"PartitionName": "small", "MaxNodes": "2", "QoS": "N/A"})
    done, notes = resize(cluster, config, 3)
    assert done is False and cluster.sizes_set() == []
    assert "(2: partition small MaxNodes node=2)" in notes[0]


@pytest.mark.security
@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"qos": "normal|mem=lots|||\n"}, "QOS normal MaxTRESPerJob: 'mem=lots' is not a TRES"),
        ({"qos": "other||||\n"}, "QOS normal: not shown by sacctmgr show qos"),
        ({"assoc": "root||||\nlab|root|||\n"}, "association alice/lab: not shown"),
        ({"assoc": "lab||alice||\n"}, "account lab: not found in the association tree"),
    ],
)
def test_a_limit_not_understood_refuses_the_grow_naming_it(
    monkeypatch, job_dir, config, change, why
):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4)
    write_range(job_dir, 1, 4)
    cluster.config = ENFORCING
    for name, value in change.items():
        setattr(cluster, name, value)
    done, notes = resize(cluster, config, 2)
    assert done is False and cluster.sizes_set() == []
    assert f"Slurm's limits on it could not be read: {why}" in notes[0]


@pytest.mark.security
def test_a_partition_not_understood_refuses_the_grow(monkeypatch, job_dir, config):
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=4)
    write_range(job_dir, 1, 4)
    cluster.partition["MaxNodes"] = "lots"
    assert "MaxNodes='lots' not understood" in resize(cluster, config, 2)[1][0]
    cluster.partition["MaxNodes"] = "UNLIMITED"
    cluster.job["Partition"] = "(null)"
    assert "its partition was not read" in resize(cluster, config, 2)[1][0]


@pytest.mark.security
def test_a_job_name_with_a_line_break_forges_no_record_root_acts_on(monkeypatch, job_dir, config):
    """alice renames her job so that scontrol's first line is a whole record of her
    making (NumNodes=64: already past any grow, so no limit would be read) and the real
    fields fall on a line that looks like another job's: a job printed on more than one
    line is not acted on."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=8)
    write_range(job_dir, 1, 8)
    cluster.config, cluster.qos = ENFORCING, "normal|node=2|||\n"
    forged = (
        f"x UserId=alice({owner_uid()}) JobState=RUNNING WorkDir={job_dir} NumNodes=64 "
        "Partition=batch QOS=normal Account=lab TRES=cpu=64,node=64\nJobId=9 JobName=y"
    )
    cluster.job["JobName"] = forged
    done, notes = resize(cluster, config, 4)
    assert done is False and cluster.sizes_set() == []
    assert notes == ["agent: job 41 not requeued: Slurm has no single job by that id"]


SCRIPT = "/j/job.sh"
SUBMITTED = f"sbatch --parsable --job-name=grower --nodes=1-2 --ntasks-per-node=1 {SCRIPT}"


@pytest.mark.security
def test_a_job_that_started_at_once_keeps_the_range_it_was_submitted_with(
    monkeypatch, job_dir, config
):
    """alice's job (sbatch --nodes=1-2) started before any tick saw it wait, so nothing
    was recorded and Slurm's record shows only the one node it holds. The range comes
    from Slurm's accounting (its submit line): her rewritten 1-100000 is refused before
    any checkpoint, and 1-2 is what the agent records."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    cluster.submit_line = SUBMITTED.replace(SCRIPT, str(job_dir / "job.sh"))
    write_range(job_dir, 1, 100_000)
    done, notes = resize(cluster, config, 50)
    assert done is False and not any("halt" in argv for argv in cluster.commands)
    assert "is not the one recorded (1-2)" in notes[0], notes
    assert node_ranges.recorded(store(config), key(job_dir)) == (1, 2)


def test_an_honest_grow_of_a_job_that_started_at_once_is_done(monkeypatch, job_dir, config):
    """The same job with its own range (1-2) grows to 2: once held after the halt, Slurm
    shows only the size it held (NumNodes=1), which is not its range."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    cluster.submit_line = SUBMITTED.replace(SCRIPT, str(job_dir / "job.sh"))
    write_range(job_dir, 1, 2)
    done, notes = resize(cluster, config, 2)
    assert done is True and cluster.sizes_set() == ["NumNodes=2-2"], notes


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

    monkeypatch.setattr(slurm.run, "output", down)
    done, notes = resize(cluster, config, 2)
    assert done is False and cluster.sizes_set() == []
    assert "Slurm's limits on it could not be read: sacctmgr: error" in notes[0]


@pytest.mark.fault
def test_a_job_slurm_does_not_show_held_after_its_halt_keeps_its_size(monkeypatch, job_dir, config):
    """Its range is read from the held job: one still shown ending (COMPLETING) after
    the settle time has none to read, so its size is left alone and it is resumed,
    never left held."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1)
    monkeypatch.setattr(preempt, "REQUEUE_SETTLE_SECONDS", 0.3)
    monkeypatch.setattr(preempt, "REQUEUE_SETTLE_POLL_SECONDS", 0.05)

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
    assert (job.nodes, job.max_nodes, job.partitions, job.qos, job.account, job.tres) == (
        1,
        3,
        ("batch",),
        "normal",
        "",
        "cpu=1,node=1",
    )


# ------------------------------------------------------------------ node_limits
def test_tres_counts_read_sizes_in_megabytes():
    assert slurm.tres.counts("cpu=8,mem=4G,node=2,gres/gpu=4,billing=8,fs/disk=1T") == {
        "cpu": 8,
        "mem": 4096,
        "node": 2,
        "gres/gpu": 4,
        "billing": 8,
        "fs/disk": 1024**2,
    }
    assert slurm.tres.counts("mem=1000M,bb/x=1K,") == {"mem": 1000, "bb/x": 1}
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
    assert node_limits.enforced(slurm.controller.parse_config(text)) is enforced


def test_the_lowest_limit_sets_the_ceiling_and_says_which():
    per_user = node_limits.Scope(user="alice", qos="q")
    limits = node_limits.Limits(
        [
            node_limits.Limit("QOS q MaxTRESPerJob", {"node": 6, "cpu": 64}),
            node_limits.Limit("QOS q MaxTRESPerUser", {"gres/gpu": 8}, per_user),
        ],
        {},
    )
    share = {"node": 1, "cpu": 4, "gres/gpu": 2}
    assert node_limits.ceiling(limits, share, [], "41") == (4, "QOS q MaxTRESPerUser gres/gpu=8")
    hers = slurm.queue.RunningJob("40", "alice", "lab", "q", "batch", "gres/gpu=7")
    bobs = slurm.queue.RunningJob("39", "bob", "lab", "q", "batch", "gres/gpu=7")
    itself = slurm.queue.RunningJob("41", "alice", "lab", "q", "batch", "gres/gpu=7")
    assert node_limits.ceiling(limits, share, [hers], "41")[0] == 0
    assert node_limits.ceiling(limits, share, [bobs, itself], "41")[0] == 4
    empty = node_limits.Limits([], {})
    assert node_limits.ceiling(empty, share, [], "41") == (node_limits.MAX_NODES, "")


def test_a_job_counts_under_its_own_qos_and_its_partitions():
    scope = node_limits.Scope(qos="gpu-part")
    job = slurm.queue.RunningJob("40", "bob", "lab", "normal", "gpu", "gres/gpu=1")
    assert node_limits.counted(scope, job, {"gpu": "gpu-part"})
    assert not node_limits.counted(scope, job, {"batch": "gpu-part"})


def test_an_account_covers_every_account_below_it():
    parents = {"root": "", "dept": "root", "lab": "dept", "lab2": "dept", "other": "root"}
    assert node_limits.below("dept", parents) == {"dept", "lab", "lab2"}
    assert node_limits.below("lab", parents) == {"lab"}


@pytest.mark.bad_input
def test_a_user_name_that_is_no_name_reads_no_limits():
    place = node_limits.JobPlace("41", "-x", ("batch",), "normal", "lab")
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


@pytest.mark.fault
def test_a_job_shown_ending_for_a_moment_after_its_halt_is_still_resized(
    monkeypatch, job_dir, config
):
    """A loaded controller shows the halted job COMPLETING for a few reads, then held:
    the resize waits for it (held_record) instead of leaving its size alone."""
    cluster = cluster_of(monkeypatch, job_dir, nodes=1, slurm_max=3)
    node_ranges.record(store(config), key(job_dir), (1, 3), 0.0)
    naps: list[float] = []

    def halt_then_settle(argv: list[str], timeout: float) -> tuple[int, str]:
        cluster.commands.append(argv)
        if "halt" in argv:
            cluster.job["JobState"] = "COMPLETING"
        return 0, "{}"

    def nap(seconds: float) -> None:
        naps.append(seconds)
        if len(naps) == 2:
            cluster.job["JobState"] = "REQUEUE_HOLD"

    monkeypatch.setattr(preempt.time, "sleep", nap)
    notes: list[str] = []
    preempt.requeue("41", "resized by test", config, notes.append, halt_then_settle, nodes=2)
    assert len(naps) == 2
    assert cluster.sizes_set() != [], notes
