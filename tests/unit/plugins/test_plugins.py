"""Issue [8]: the plug-in seam and each built-in technique, on and off.

Layers 1-2 run for real (load_task, compile_task); layer 3 runs `schedule.plan` against
a fixed cluster shape (the parsed `scontrol show` records of test_agent_schedule);
layer 4's hooks run on a Launch as the execution wrapper builds it.
"""

from __future__ import annotations

import errno
import json
import os
import textwrap
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.slurm.nodes import node_of, partition_of
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.slurm.queue import parse_reasons
from tacc_agent.tasks.jobs import sweeps
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.schedule.cluster_shape import scheduling_nodes, scheduling_partitions
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.store import workspace
from tacc_contract.plugins import Launch, Outcome, PartitionLoad, Queue, QueuedJob
from tacc_contract.registry import PluginError, available, select
from tacc_plugins import duration, elastic, gpu_share, las, sweep
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError

NODES = [
    "NodeName=g1 CPUTot=64 RealMemory=512000 Gres=gpu:h100:4,shard:16 "
    "AvailableFeatures=h100 Partitions=gpu State=IDLE",
    "NodeName=g2 CPUTot=64 RealMemory=512000 Gres=gpu:a100:4 AvailableFeatures=a100 "
    "Partitions=gpu State=IDLE",
    "NodeName=c1 CPUTot=32 RealMemory=128000 Gres=(null) Partitions=cpu State=IDLE",
    "NodeName=c2 CPUTot=32 RealMemory=128000 Gres=(null) Partitions=cpu State=IDLE",
    "NodeName=m1 CPUTot=32 RealMemory=256000 Gres=gpu:l40s:2(S:0),mps:200(S:0) "
    "AvailableFeatures=l40s Partitions=mps State=IDLE",
]
PARTITIONS = [
    "PartitionName=gpu Default=NO Nodes=g[1-2] State=UP",
    "PartitionName=mps Default=NO Nodes=m1 State=UP",
    "PartitionName=cpu Default=YES Nodes=c[1-2] State=UP",
]


@pytest.fixture(autouse=True)
def cluster(monkeypatch):
    nodes = scheduling_nodes([node_of(parse_oneliner(line)) for line in NODES])
    partitions = [partition_of(parse_oneliner(p)) for p in PARTITIONS]
    shape = (scheduling_partitions(partitions, nodes), nodes)
    monkeypatch.setattr(schedule, "cluster_shape", lambda timeout: shape)
    monkeypatch.setattr(
        schedule, "partition_load", lambda name, timeout: PartitionLoad(*LOAD[name])
    )
    monkeypatch.delenv("TACC_PLUGINS", raising=False)


LOAD = {"cpu": (2, 0)}  # (idle nodes, pending jobs) the elastic plug-in sees


def write_task(tmp: Path, task: dict) -> Path:
    (tmp / "tcloud.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return tmp / "tcloud.yaml"


def compiled(tmp: Path, task: dict, selection: list[str] | None = None):
    """(instruction document, the task as the cluster reads it)."""
    spec = load_task(write_task(tmp, task), selection or [])
    document = compile_task(spec, plugins=select(selection or [], spec.plugins)).document
    return document, parse(json.dumps(document), "instruction.json")


def planned(task, config: AgentConfig | None = None, user_dir: Path | None = None, digest=""):
    return schedule.plan(task, Path("/w/job"), config or AgentConfig(), user_dir, digest)


def base(**extra) -> dict:
    return {"name": "t", "run": ["python train.py"], **extra}


# ------------------------------------------------------------------ the seam
def test_defaults_are_on_and_las_is_off():
    on = {p.name for p in select()}
    assert on == {
        "gpu_share",
        "elastic",
        "gpu_types",
        "sweep",
        "duration",
        "oort",
        "launcher",
        "transport",
    }
    assert {p.name for p in select(["las", "-duration"])} == on - {"duration"} | {"las"}


@pytest.mark.bad_input
def test_selection_errors_name_the_word_and_what_exists():
    with pytest.raises(PluginError, match=r"unknown plug-in 'nope'; available: allox, duration"):
        select(["nope"])
    with pytest.raises(PluginError, match=r"'las' is cluster policy; only ops"):
        select(["las"], ["-las"], policy_from=["las"])
    assert "las" not in {p.name for p in select(["-las"], policy_from=["-las"])}
    with pytest.raises(PluginError, match=r"cannot be loaded"):
        select(["no_such_package.plugin"])


@pytest.mark.bad_input
def test_a_task_file_names_its_plugins_and_bad_words_point_at_the_line(tmp_path):
    path = write_task(tmp_path, base(plugins=["-duration", "+bogus"]))
    with pytest.raises(TaskFileError) as caught:
        load_task(path, [])
    assert f"{path}:6:3: plugins[1]: unknown plug-in 'bogus'; available:" in str(caught.value)
    with pytest.raises(
        TaskFileError,
        match=r"tcloud.yaml:1:1: plugins \(\$TACC_PLUGINS\): "
        "unknown plug-in 'nope'",
    ):
        load_task(write_task(tmp_path, base()), ["nope"])


def test_the_instruction_records_which_plugins_were_on_and_what_they_changed(tmp_path):
    document, _ = compiled(tmp_path, base(resources={"gpus_per_node": 0.5}))
    assert document["plugins"]["on"] == ["gpu_share", "elastic", "gpu_types", "sweep", "oort"]
    assert document["plugins"]["shaped"] == {
        "gpu_share": "gpus_per_node 0.5 -> gpu_share 0.5 (scheduled as GPU shards)"
    }


PLUGIN_MODULE = '''
"""A technique from outside the project: tags jobs with a cost centre."""
from typing import ClassVar

from tacc_contract.plugins import Plugin
from tacc_contract.fields import Field, pattern


class CostCentre(Plugin):
    name = "cost_centre"
    layers = ("schema", "compile", "schedule")
    fields: ClassVar = {
        "resources.cost_centre": Field("str", check=pattern(r"cc-[0-9]+(-checked)?", "cc-N"))
    }

    def check(self, task, problem):
        if task["resources"]["cost_centre"] is None:
            problem("resources.cost_centre", "every task names its cost centre")

    def compile(self, document):
        document["task"]["resources"]["cost_centre"] += "-checked"
        return "checked"

    def schedule(self, submission):
        centre = submission.task.resources["cost_centre"]
        submission.options["comment"] = centre
        submission.note(self.name, f"comment {centre}")
'''


def test_a_new_plugin_is_one_module_and_no_layer_changes(tmp_path, monkeypatch):
    (tmp_path / "lab_plugins").mkdir()
    (tmp_path / "lab_plugins" / "__init__.py").write_text("")
    (tmp_path / "lab_plugins" / "cost.py").write_text(textwrap.dedent(PLUGIN_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TACC_PLUGINS", "lab_plugins.cost")
    project = tmp_path / "p"
    project.mkdir()
    # Its schema rule holds, with file, line and field...
    with pytest.raises(TaskFileError, match=r"resources.cost_centre: every task names"):
        load_task(write_task(project, base()))
    with pytest.raises(TaskFileError, match=r"resources.cost_centre: expected cc-N, got 'x'"):
        load_task(write_task(project, base(resources={"cost_centre": "x"})))
    # ...its compile pass is recorded in the instruction...
    spec = load_task(write_task(project, base(resources={"cost_centre": "cc-7"})))
    document = compile_task(spec).document
    assert "cost_centre" in document["plugins"]["on"]
    assert document["plugins"]["shaped"]["cost_centre"] == "checked"
    # ...and the cluster (which has the module too) runs its scheduling hook.
    cluster_task = parse(json.dumps(document), "instruction.json")
    submission = planned(cluster_task, AgentConfig(plugins=("lab_plugins.cost",)))
    assert submission.options["comment"] == "cc-7-checked"
    assert submission.notes["cost_centre"] == "comment cc-7-checked"
    assert "cost_centre" in available(["lab_plugins.cost"])


# ------------------------------------------------------------------ GPU sharing
def test_a_fraction_of_a_gpu_becomes_shards(tmp_path):
    _, task = compiled(tmp_path, base(resources={"gpus_per_node": 0.25, "partition": "gpu"}))
    submission = planned(task)
    assert submission.options["gres"] == "shard:1"
    assert submission.notes["gpu_share"] == (
        "0.25 GPU -> 1 of 4 shards of one GPU "
        "(as Slurm shards nothing limits its GPU memory or compute)"
    )
    _, half = compiled(tmp_path, base(resources={"gpus_per_node": 0.5, "partition": "gpu"}))
    assert planned(half).options["gres"] == "shard:2"
    launch = Launch(task, 0, ["g1"], ["10.0.0.1"], "7", {})
    gpu_share.GpuShare().execute(launch)
    assert launch.env == {"TACC_GPU_SHARE": "0.25"}
    argv = schedule.sbatch_argv(task, Path("/w/job"), AgentConfig(), submission.options)
    assert "--gres=shard:1" in argv and not any(a.startswith("--gres=gpu") for a in argv)


def mps_launch(task, **facts) -> Launch:
    launch = Launch(task, 0, ["m1"], ["10.0.0.1"], "7", dict(task.environment["env"]))
    launch.facts = {"gpu_sharing": "mps", "mps_daemon": True, **facts}
    gpu_share.GpuShare().execute(launch)
    return launch


def test_a_fraction_of_a_gpu_where_nodes_run_mps_gets_the_limits_of_its_share(tmp_path):
    """Issue [22] point 6: a partition whose nodes offer gres/mps serves 0.25 of a GPU as
    25 of its 100 MPS shares on a node of the owner's jobs only (the MPS daemon serves
    one user at a time), and the job's process gets 25% of the GPU's threads and a
    quarter of its memory (46068 MiB: an L40S) as its MPS client limits."""
    _, task = compiled(tmp_path, base(resources={"gpus_per_node": 0.25, "partition": "mps"}))
    submission = planned(task)
    assert submission.options["gres"] == "mps:25"
    assert submission.options["exclusive"] == "user"
    assert submission.notes["gpu_share"].startswith("0.25 GPU -> 25 of 100 MPS shares of one")
    launch = mps_launch(task, slurm_mps_percentage=25, gpu_memory_mib=46068)
    assert launch.env == {
        "TACC_GPU_SHARE": "0.25",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=11517M",
    }
    assert "WARNING" not in launch.notes["gpu_share"]
    # Where nvidia-smi did not say the GPU's memory, the compute limit still holds.
    launch = mps_launch(task, slurm_mps_percentage=25)
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in launch.env
    assert launch.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_an_mps_share_is_split_over_the_nodes_processes_and_never_above_slurms(tmp_path):
    """Limits are per CUDA process: 4 processes of a 0.5 share get an eighth each; where
    Slurm gave less than the share asked (a node with 200 MPS shares per GPU), Slurm's
    percentage wins; with no daemon answering, the notes say the limits bind nothing."""
    resources = {"gpus_per_node": 0.5, "partition": "mps", "processes_per_node": 4}
    _, task = compiled(tmp_path, base(resources=resources))
    launch = mps_launch(task, slurm_mps_percentage=50, gpu_memory_mib=80000)
    assert launch.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "12"
    assert launch.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=10000M"
    launch = mps_launch(task, slurm_mps_percentage=25, gpu_memory_mib=80000, mps_daemon=False)
    assert launch.env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "6"
    assert launch.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=5000M"
    assert gpu_share.NO_MPS_DAEMON in launch.notes["gpu_share"]


@pytest.mark.security
def test_a_shares_own_environment_cannot_raise_its_mps_limits(tmp_path):
    """The task's environment names a whole GPU's threads; the plug-in sets its share's
    over it (the MPS daemon obeys the lower of its own and these)."""
    own = {"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}}
    _, task = compiled(
        tmp_path,
        base(resources={"gpus_per_node": 0.25, "partition": "mps"}, environment=own),
    )
    assert mps_launch(task).env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_validate_says_what_a_share_of_a_gpu_gets_and_that_shards_limit_nothing():
    said = gpu_share.described({"gpus_per_node": 0.25})
    assert said.startswith("0.25 of one GPU: through CUDA MPS")
    assert "limited to about 25% of the GPU's threads and memory" in said
    assert "as Slurm shards nothing limits its GPU memory or compute" in said
    assert gpu_share.described({"gpus_per_node": 2}) is None


@pytest.mark.bad_input
def test_a_fraction_without_shards_is_refused_with_the_field(tmp_path):
    _, task = compiled(tmp_path, base(resources={"gpus_per_node": 0.25}))  # cpu partition
    with pytest.raises(Rejected, match=r"needs GPU sharing .gres/mps or gres/shard.") as caught:
        planned(task)
    assert caught.value.field == "resources.gpus_per_node"


@pytest.mark.bad_input
def test_gpu_share_off_makes_a_fraction_an_error(tmp_path):
    path = write_task(tmp_path, base(resources={"gpus_per_node": 0.25}))
    with pytest.raises(TaskFileError, match=r"gpus_per_node: expected an integer, got '0.25'"):
        load_task(path, ["-gpu_share"])
    with pytest.raises(TaskFileError, match=r"expected whole GPUs .* got 1.5"):
        load_task(write_task(tmp_path, base(resources={"gpus_per_node": 1.5})), [])
    assert (
        load_task(write_task(tmp_path, base(resources={"gpus_per_node": 2.0})), []).resources[
            "gpus_per_node"
        ]
        == 2
    )


# ------------------------------------------------------------------ elastic + GPU types
def test_a_node_range_grows_when_idle_shrinks_when_jobs_wait(tmp_path, monkeypatch):
    _, task = compiled(tmp_path, base(resources={"nodes": "1-2"}))
    submission = planned(task)
    assert submission.options["nodes"] == "2-2"
    assert submission.notes["elastic"] == "2 of 1-2 nodes (2 idle node(s))"
    monkeypatch.setitem(LOAD, "cpu", (2, 3))
    assert planned(task).notes["elastic"] == "1 of 1-2 nodes (3 job(s) waiting)"
    monkeypatch.setitem(LOAD, "cpu", (0, 0))
    assert planned(task).options["nodes"] == "1-2"  # nothing idle: the minimum, and wait
    launch = Launch(task, 0, ["c1"], ["10.0.0.1"], "7", {})
    elastic.Elastic().execute(launch)
    assert launch.env == {"TACC_NODES_MIN": "1", "TACC_NODES_MAX": "2"}
    assert launch.notes["elastic"] == "1 node(s) of 1-2"
    _, too_many = compiled(tmp_path, base(resources={"nodes": "3-4"}))
    with pytest.raises(Rejected, match=r"3-4 nodes requested, but partition 'cpu' has 2"):
        planned(too_many)


def test_only_jobs_that_wait_for_nodes_shrink_a_node_range():
    squeue = "\n".join(
        [
            "31|Resources",
            "32|Priority",
            "33|JobHeldUser",
            "34|JobHeldAdmin",
            "35|Dependency",
            "36|BeginTime",
            "37|QOSMaxGRESPerUser",
        ]
    )
    # a halted job (held), one after another's end, one for later: none waits for nodes
    assert schedule.waiting_jobs(parse_reasons(squeue)) == 3
    assert schedule.waiting_jobs(parse_reasons("")) == 0


@pytest.mark.bad_input
@pytest.mark.parametrize("nodes", ["0-2", "3-1", "2-", "x", 0])
def test_bad_node_ranges_are_refused(tmp_path, nodes):
    with pytest.raises(TaskFileError, match=r"resources.nodes: expected a node count >= 1, or"):
        load_task(write_task(tmp_path, base(resources={"nodes": nodes})), [])


def test_a_resizable_range_records_its_opt_in_and_range_for_the_tick(tmp_path):
    _, task = compiled(tmp_path, base(resources={"nodes": "1-2", "resize": True}))
    assert planned(task).data["elastic"] == {"opt_in": ["resize"], "range": [1, 2]}
    _, fixed_range = compiled(tmp_path, base(resources={"nodes": "1-2"}))
    assert "elastic" not in planned(fixed_range).data  # a range alone is not an opt-in


@pytest.mark.bad_input
def test_resizing_a_fixed_size_is_refused_with_the_field(tmp_path):
    with pytest.raises(
        TaskFileError,
        match=r"resources.resize: resizing needs a node range: "
        r"set nodes: MIN-MAX",
    ):
        load_task(write_task(tmp_path, base(resources={"nodes": 2, "resize": True})), [])


@pytest.mark.bad_input
def test_elastic_off_refuses_a_range(tmp_path):
    with pytest.raises(TaskFileError, match=r"resources.nodes: expected an integer"):
        load_task(write_task(tmp_path, base(resources={"nodes": "2-4"})), ["-elastic"])


def test_acceptable_gpu_types_become_a_constraint(tmp_path):
    res = {"partition": "gpu", "gpus_per_node": 1, "gpu_types": ["h100", "a100"]}
    _, task = compiled(tmp_path, base(resources=res))
    assert planned(task).options["constraint"] == "h100|a100"
    # Slurm refuses a constraint naming a feature no node has: only the types there.
    _, some = compiled(tmp_path, base(resources={**res, "gpu_types": ["l40s", "a100"]}))
    partly = planned(some)
    assert partly.options["constraint"] == "a100"
    assert partly.notes["gpu_types"] == "constraint a100 (no l40s node in partition 'gpu')"
    _, none = compiled(tmp_path, base(resources={**res, "gpu_types": ["l40s"]}))
    with pytest.raises(
        Rejected,
        match=r"no node in partition 'gpu' has a GPU of type l40s; "
        "the types there: a100, h100",
    ):
        planned(none)
    with pytest.raises(TaskFileError, match=r"GPU types need GPUs"):
        load_task(write_task(tmp_path, base(resources={"gpu_types": ["h100"]})), [])


# ------------------------------------------------------------------ sweeps
SWEEP = {"parameters": {"LR": [0.1, 0.01], "BATCH": [32, 64, 128]}, "parallel": 2}


def test_a_sweep_compiles_to_its_trials_and_one_job_array(tmp_path):
    document, task = compiled(tmp_path, base(sweep=SWEEP))
    trials = document["task"]["sweep"]["trials"]
    assert len(trials) == 6 and trials[0] == {"LR": "0.1", "BATCH": "32"}
    assert trials[-1] == {"LR": "0.01", "BATCH": "128"}
    submission = planned(task)
    assert submission.options["array"] == "0-5%2"
    assert submission.options["output"] == "/w/job/trials/%a/logs/job.log"
    launch = Launch(task, 0, ["c1"], ["10.0.0.1"], "7", {"SLURM_ARRAY_TASK_ID": "4"})
    sweep.Sweep().execute(launch)
    assert launch.env["LR"] == "0.01" and launch.env["BATCH"] == "64"
    assert launch.env["TACC_TRIAL"] == "4" and launch.env["TACC_TRIALS"] == "6"


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("grid", "message"),
    [
        ({"LR": []}, "LR has no list of values"),
        ({"1X": [1]}, "'1X' is not a shell variable name"),
        ({"SLURM_X": [1]}, "SLURM_X is reserved"),
        ({"A": list(range(40)), "B": list(range(30))}, "1200 trials; at most 1000"),
    ],
)
def test_bad_sweeps_are_refused_with_the_field(tmp_path, grid, message):
    with pytest.raises(TaskFileError, match=r"sweep.parameters") as caught:
        load_task(write_task(tmp_path, base(sweep={"parameters": grid})), [])
    assert message in str(caught.value)


def test_trials_get_directories_and_ids(tmp_path):
    job_dir = tmp_path / "user" / "jobs" / "abc-1"
    (job_dir / "code").mkdir(parents=True)
    (job_dir / "instruction.json").write_text("{}")
    sweeps.make_trials(job_dir, 3)
    workspace.register(tmp_path / "user", "12", job_dir)
    trial = workspace.job_dir(tmp_path / "user", "12_2")
    assert trial == job_dir / "trials" / "2"
    assert sweeps.is_trial(trial) and not sweeps.is_trial(job_dir)
    assert (trial / "instruction.json").read_text() == "{}"
    assert (trial / "outputs").is_dir() and not (trial / "code").exists()  # built at start
    with pytest.raises(Rejected, match=r"job 12 has no trial 3"):
        workspace.job_dir(tmp_path / "user", "12_3")
    assert sweeps.summary_state(["COMPLETED", "RUNNING", "QUEUED"]) == "RUNNING"
    assert sweeps.summary_state(["COMPLETED", "FAILED"]) == "FAILED"
    assert sweeps.counts(["QUEUED", "COMPLETED", "QUEUED"]) == "1 COMPLETED, 2 QUEUED"


def test_each_trial_runs_in_a_code_tree_of_its_own_with_the_same_read_only_files(tmp_path):
    job_dir = tmp_path / "jobs" / "abc-1"
    (job_dir / "code" / "pkg" / "data").mkdir(parents=True)
    (job_dir / "code" / "train.py").write_text("print('hi')")
    (job_dir / "code" / "pkg" / "data" / "x.csv").write_text("1,2")
    (job_dir / "code" / "train.py").chmod(0o444)
    (job_dir / "code" / "link.py").symlink_to("train.py")
    (job_dir / "datasets" / "mnist").mkdir(parents=True)
    sweeps.make_trials(job_dir, 2)
    first, second = (job_dir / "trials" / i for i in ("0", "1"))
    for trial in (first, second):
        sweeps.own_code_tree(trial)
    code = first / "code"
    assert not code.is_symlink() and code.is_dir()
    assert (code / "train.py").stat().st_ino == (job_dir / "code" / "train.py").stat().st_ino
    assert (code / "pkg" / "data" / "x.csv").read_text() == "1,2"
    assert os.readlink(code / "link.py") == "train.py"
    (code / "result.txt").write_text("trial 0")  # what one trial writes where it runs
    assert not (second / "code" / "result.txt").exists()
    assert not (job_dir / "code" / "result.txt").exists()
    assert (first / "datasets" / "mnist").is_dir()  # uploaded datasets are shared
    (code / "pkg" / "data" / "x.csv").unlink()
    sweeps.own_code_tree(first)  # a requeued trial keeps its tree
    assert not (code / "pkg" / "data" / "x.csv").exists()
    assert [p.name for p in first.iterdir() if p.name.startswith(".code-")] == []


def test_a_trial_whose_code_tree_cannot_be_built_fails_with_the_reason(tmp_path, monkeypatch):
    job_dir = tmp_path / "jobs" / "abc-1"
    (job_dir / "code").mkdir(parents=True)
    (job_dir / "code" / "train.py").write_text("x")
    sweeps.make_trials(job_dir, 1)
    trial = job_dir / "trials" / "0"

    def full_disk(source, target):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(sweeps.os, "link", full_disk)
    with pytest.raises(AgentError, match=r"trial's code tree in .*No space left on device"):
        sweeps.own_code_tree(trial)
    left = [p.name for p in trial.iterdir() if p.name.startswith((".code-", "code"))]
    assert left == [], left  # nothing half-built


# ------------------------------------------------------------------ duration prediction
def past_job(user_dir: Path, name: str, digest: str, entrypoint: str, seconds: float | None):
    job = user_dir / "jobs" / name
    (job / "status" / "events").mkdir(parents=True)
    (job / "status" / "submit.json").write_text(
        json.dumps({"digest": digest, "entrypoint": entrypoint})
    )
    events = [("QUEUED", 0.0), ("RUNNING", 100.0)]
    if seconds is not None:
        events.append(("COMPLETED", 100.0 + seconds))
    else:
        events.append(("FAILED", 150.0))
    for i, (state, when) in enumerate(events):
        (job / "status" / "events" / f"{i:020d}-{state}.json").write_text(
            json.dumps({"state": state, "time": when})
        )


def test_no_time_limit_and_earlier_runs_give_a_tighter_predicted_one(tmp_path):
    _, task = compiled(tmp_path, base())
    user = tmp_path / "user"
    entry = duration.entrypoint_of(task)
    past_job(user, "a", "d1", entry, 100)
    past_job(user, "b", "d1", entry, 140)
    past_job(user, "c", "d1", entry, None)  # a failure says nothing about duration
    submission = planned(task, user_dir=user, digest="d1")
    # longest 140 s x 1.5 + 60 s = 270 s -> 5 minutes
    assert submission.options["time"] == "00:05:00"
    assert submission.data["duration"] == {
        "limit_seconds": 300,
        "basis": "digest",
        "runs": 2,
        "longest": 140.0,
    }
    assert (
        "predicted 00:05:00 from 2 earlier run(s) of the same digest"
        in (submission.notes["duration"])
    )
    # Another digest of the same entry point still predicts; the cap holds.
    capped = planned(task, AgentConfig(default_time_limit="00:04:00"), user, "other")
    assert capped.options["time"] == "00:04:00"
    assert capped.data["duration"]["basis"] == "entrypoint"


def test_prediction_is_off_with_a_time_limit_without_history_or_when_turned_off(tmp_path):
    user = tmp_path / "user"
    _, task = compiled(tmp_path, base())
    assert planned(task, user_dir=user).options["time"] == "01:00:00"  # no history yet
    past_job(user, "a", "d1", duration.entrypoint_of(task), 100)
    _, limited = compiled(tmp_path, base(resources={"time": "30"}))
    assert planned(limited, user_dir=user, digest="d1").options["time"] == "30"
    off = planned(task, AgentConfig(plugins=("-duration",)), user, "d1")
    assert off.options["time"] == "01:00:00" and "duration" not in off.notes


def test_the_job_log_gets_prediction_versus_actual(tmp_path):
    submitted = {"plugin_data": {"duration": {"limit_seconds": 300}}}
    line = duration.DurationPrediction().finish(Outcome(None, tmp_path, 0, 150.0, submitted))
    assert line == "duration: ran 150 s; predicted limit 300 s (50% of it used)"


# ------------------------------------------------------------------ LAS
def test_squeue_lines_become_queued_jobs():
    from tacc_agent.slurm.queue import parse_queue

    jobs = parse_queue(
        "12|alice|RUNNING|0|2|2|N/A|N/A|gres/gpu:4|N/A|1:02:03|\n"
        "13_1|bob|PENDING|0|1|1|cpu=1,node=1|N/A|N/A|N/A|0:00|\n"
    )
    assert (jobs[0].gpus, jobs[0].elapsed_seconds, jobs[0].nodes) == (8, 3723, 2)
    assert (jobs[1].job_id, jobs[1].gpus, jobs[1].state) == ("13_1", 0, "PENDING")


def test_las_lowers_pending_jobs_of_users_with_more_attained_service(tmp_path):
    config = AgentConfig(las_thresholds=(100.0, 1000.0), las_nice_step=500)
    changed: dict[str, int] = {}

    def tick(jobs):
        queue = Queue(jobs, lambda job, nice: changed.__setitem__(job, nice), 0.0, tmp_path, config)
        las.LeastAttainedService().tick(queue)
        return queue.notes

    # alice ran 2 GPUs for 60 s, then 600 s: 1200 GPU-s attained, past both thresholds.
    tick([QueuedJob("1", "alice", "RUNNING", 0, 2, 60)])
    notes = tick(
        [
            QueuedJob("1", "alice", "RUNNING", 0, 2, 600),
            QueuedJob("2", "alice", "PENDING", 0, 1, 0),
            QueuedJob("3", "bob", "PENDING", 0, 1, 0),
        ]
    )
    # alice is in the most attained queue (nice 0); bob attained nothing: two queues up.
    assert changed == {"3": -1000}
    assert notes == ["las: job 3 of bob (0 GPU-s) nice 0 -> -1000"]
    state = json.loads((tmp_path / "las.json").read_text())
    assert state["attained"] == {"alice": 1200.0}
    # No change is made twice (the nice is already right), and node-time stands in for
    # GPU time on CPU-only jobs.
    changed.clear()
    tick(
        [
            QueuedJob("3", "bob", "PENDING", -1000, 1, 0),
            QueuedJob("4", "bob", "RUNNING", 0, 0, 200, nodes=1),
        ]
    )
    assert changed == {"3": -500}  # bob passed the first threshold: one queue down
    assert json.loads((tmp_path / "las.json").read_text())["attained"]["bob"] == 200.0


# ------------------------------------------------------------------ quota
def test_halt_says_whether_the_program_exited_in_its_grace_period():
    from tcloud.cli import halt_text

    done = {"job_id": "7", "checkpoint_signal": True, "exited_in_grace": True, "grace_seconds": 10}
    assert halt_text(done).startswith("job 7: the program exited within the 10 s grace")
    late = halt_text({**done, "exited_in_grace": False, "grace_seconds": 2.5})
    assert "still running 2.5 s after the checkpoint signal; Slurm stopped it" in late
    assert halt_text({"job_id": "7", "checkpoint_signal": False}).startswith(
        "job 7 was still queued: held; `tcloud resume 7`"
    )


def test_quota_text_shows_limits_fair_share_and_usage():
    from tcloud.cli import quota_text

    info = {
        "user": "alice",
        "running_jobs": 1,
        "pending_jobs": 2,
        "gpus_in_use": 4,
        "accounting": True,
        "associations": [
            {
                "Account": "vision",
                "Fairshare": "10",
                "QOS": "normal,scavenger",
                "DefaultQOS": "normal",
            }
        ],
        "fairshare": [
            {"Account": "vision", "User": "alice", "FairShare": "0.5", "EffectvUsage": "0.25"}
        ],
        "qos": [
            {
                "Name": "normal",
                "Priority": "10",
                "MaxTRESPU": "gres/gpu=8",
                "MaxJobsPU": "",
                "MaxWall": "2-00:00:00",
                "Preempt": "scavenger",
                "UsageFactor": "1.000000",
            }
        ],
    }
    text = quota_text(info)
    assert "alice: 1 running job(s) holding 4 GPU(s), 2 pending" in text
    assert "account vision: fair share 0.5 (shares 10, usage 0.25)" in text
    assert "qos normal: priority 10, MaxTRESPU gres/gpu=8, MaxWall 2-00:00:00" in text
    assert "no accounting" in quota_text({**info, "accounting": False})


def test_quota_counts_the_callers_queue(monkeypatch):
    from tacc_agent import slurm
    from tacc_agent.tasks.accounting import quota

    seen = []

    def squeue(argv, timeout):
        seen.append(argv)
        return (
            "7|alice|RUNNING|0|2|2|cpu=2,node=2,gres/gpu=8|N/A|gres/gpu:4|N/A|1:00|\n"
            "8|alice|PENDING|0|1|1|cpu=1,node=1|N/A|N/A|N/A|0:00|\n"
        )

    monkeypatch.setattr(slurm.run, "output", squeue)
    counts = quota.in_queue("alice", AgentConfig())
    assert counts == {"running_jobs": 1, "pending_jobs": 1, "gpus_in_use": 8}
    assert "--user=alice" in seen[0]
