"""Processes per node through the layers, without Slurm: the sbatch layout per launcher,
how the batch step starts the wrappers, each wrapper's rank and variables, torchrun's
lines filed by global rank, the legacy tuxiv.conf mapping (ntasks-per-node,
TACC_WORKDIR) and validate refusing what submit refuses."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute.launch import (
    AGENT,
    PER_GPU_JOB_VARIABLES,
    RankLogs,
    job_cpus_per_node,
    slurm_node_rank,
    wrapper_argv,
)
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.schedule.submit import Node, Partition, check_feasible, sbatch_argv
from tacc_contract.plugins import Launch
from tacc_contract.schema import processes_per_node
from tacc_plugins.launcher import command_for, framework_env, wrapper_rank
from tacc_plugins.transport import choose
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tests.conftest import run_cli
from tests.unit.agent_jobs import agent, agent_env, make_job


def task_of(tmp_path: Path, resources: dict, launcher: str = "srun", name="t.yaml"):
    path = tmp_path / name
    body = {
        "name": "t",
        "run": ["train.py"],
        "resources": resources,
        "runtime": {"launcher": launcher},
    }
    path.write_text(yaml.safe_dump(body))
    return parse(json.dumps(compile_task(load_task(path)).document), "instruction")


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        ({}, 1),
        ({"gpus_per_node": 4}, 4),
        ({"gpus_per_node": 4, "processes_per_node": 2}, 2),
        ({"processes_per_node": 3}, 3),
    ],
)
def test_processes_per_node_defaults_to_the_gpus_or_one(tmp_path, resources, expected):
    assert processes_per_node(task_of(tmp_path, resources).resources) == expected


@pytest.mark.parametrize(
    ("launcher", "tasks", "srun_tasks"),
    [
        ("srun", 2, ["--nodes=2", "--ntasks=4", "--ntasks-per-node=2"]),
        ("torchrun", 1, ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]),
        ("mpirun", 2, None),
        ("none", 1, ["--nodes=1", "--ntasks=1", "--ntasks-per-node=1"]),
    ],
)
def test_each_launcher_lays_out_its_processes(tmp_path, launcher, tasks, srun_tasks):
    task = task_of(tmp_path, {"nodes": 2, "processes_per_node": 2}, launcher)
    assert f"--ntasks-per-node={tasks}" in sbatch_argv(task, Path("/j"), AgentConfig())
    argv = wrapper_argv(task, Path("/j"))
    if srun_tasks is None:  # mpirun: its one wrapper runs in the batch step itself
        assert argv == [*AGENT, "exec", "/j"]
    else:
        assert argv[0] == "srun" and argv[2:5] == srun_tasks


def test_wrapper_ranks_and_variables_per_launcher(tmp_path):
    srun = task_of(tmp_path, {"nodes": 2, "processes_per_node": 2}, "srun", "a.yaml")
    torch = task_of(tmp_path, {"nodes": 2, "processes_per_node": 2}, "torchrun", "b.yaml")
    assert [wrapper_rank(srun, node, local) for node in (0, 1) for local in (0, 1)] == [0, 1, 2, 3]
    assert [wrapper_rank(torch, node, 0) for node in (0, 1)] == [0, 2]
    launch = Launch(
        srun,
        3,
        ["n2", "n3"],
        ["10.0.0.2", "10.0.0.3"],
        "41",
        {},
        node_rank=1,
        local_rank=1,
        wrappers=4,
    )
    env = framework_env(srun, launch)
    assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["TACC_NODE_RANK"]) == (
        "3",
        "1",
        "4",
        "1",
    )
    assert env["LOCAL_WORLD_SIZE"] == env["TACC_PROCESSES_PER_NODE"] == "2"
    launch = Launch(
        torch,
        2,
        ["n2", "n3"],
        ["10.0.0.2", "10.0.0.3"],
        "41",
        {"TACC_JOB_DIR": "/j"},
        node_rank=1,
        wrappers=2,
    )
    env = {"TACC_JOB_DIR": "/j", **framework_env(torch, launch)}
    line = command_for(torch, "train.py --epochs 2", env)[-1]
    # torchrun ignores Slurm's checkpoint signal (it would die of it); its workers get it.
    assert line.startswith("trap '' USR1 && exec torchrun --nnodes=2 --nproc-per-node=2 ")
    assert "--master-addr=10.0.0.2" in line and "--tee=3" in line
    assert env["TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"] == "[tacc-rank ${rank}] "


def test_torchrun_lines_are_filed_under_their_global_rank(tmp_path):
    (tmp_path / "logs").mkdir()
    own = io.BytesIO()
    with RankLogs(tmp_path, "n3", own, range(2, 4)) as logs:
        for raw in (
            b"[tacc-rank 2] hello from 2\n",
            b"W torchrun says\n",
            b"[tacc-rank 3] hello from 3\n",
            b"[tacc-rank 0] not on this node\n",
            b"[tacc-rank 99999] nor this\n",
        ):
            logs.write(raw)
    assert (tmp_path / "logs/rank-2-n3.log").read_bytes() == b"hello from 2\n"
    assert (tmp_path / "logs/rank-3-n3.log").read_bytes() == b"hello from 3\n"
    assert own.getvalue() == (
        b"W torchrun says\n[tacc-rank 0] not on this node\n[tacc-rank 99999] nor this\n"
    )
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "rank-2-n3.log",
        "rank-3-n3.log",
    ]


def test_a_node_with_several_ranks_is_named_once_in_the_transport_reason():
    ranks = [{"host": h, "rdma": {"active_ports": 0}} for h in ("n2", "n2", "n3", "n3")]
    assert "no active RDMA port on n2, n3 (" in choose("auto", ranks).reason


def test_more_processes_than_cpus_are_refused_for_srun_but_not_torchrun(tmp_path):
    nodes = [Node("n2", 2, 4000, 0, ("batch",)), Node("n3", 2, 4000, 0, ("batch",))]
    partitions = [Partition("batch", True, ("n2", "n3"))]
    resources = {"nodes": 2, "processes_per_node": 3, "mem": "1G"}
    srun = task_of(tmp_path, resources, "srun", "a.yaml")
    with pytest.raises(Rejected, match=r"3 CPUs \(3 processes x 1\) per node requested"):
        check_feasible(srun, partitions, nodes)
    torch = task_of(tmp_path, resources, "torchrun", "b.yaml")
    assert check_feasible(torch, partitions, nodes) == "batch"


LEGACY = """\
entrypoint:
  - python3 ${TACC_WORKDIR}/train.py
job:
  name: legacy
  general: [nodes=1, ntasks-per-node=2, mem=100M]
"""


def test_a_legacy_file_maps_ntasks_and_runs_with_the_code_as_workdir(tmp_path):
    project = tmp_path / "legacy"
    project.mkdir()
    (project / "tuxiv.conf").write_text(LEGACY)
    task = load_task(project / "tuxiv.conf")
    assert task.resources["processes_per_node"] == 2 and task.runtime["workdir"] == "code"
    user = tmp_path / "u"
    user.mkdir()
    body = {
        "name": "legacy",
        "run": ["python3 ${TACC_WORKDIR}/train.py"],
        "runtime": {"workdir": "code"},
    }
    _, job_dir = make_job(user, body, {"train.py": "import os; print(os.getcwd())\n"})
    proc = agent("exec", str(job_dir), env=agent_env(user))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert log.strip().endswith(str(job_dir / "code")), log


@pytest.mark.bad_input
def test_validate_refuses_what_submit_refuses_before_connecting(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    (project / "tuxiv.conf").write_text(LEGACY.replace("mem=100M]", "mem=100M, output=x.log]"))
    env = {"TCLOUD_CONFIG": str(tmp_path / "none.yaml"), "HOME": str(tmp_path)}
    for verb in (("validate",), ("submit", "--dry-run")):
        proc = run_cli("tcloud", *verb, str(project), env=env)
        assert proc.returncode == 3, proc.stdout + proc.stderr
        assert "sbatch option 'output' cannot be set by a task" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_none_is_one_process_and_mpirun_ranks_read_their_own_variables(tmp_path):
    none = task_of(tmp_path, {"nodes": 2, "gpus_per_node": 2}, "none", "a.yaml")
    launch = Launch(none, 0, ["n2", "n3"], ["10.0.0.2", "10.0.0.3"], "7", {})
    env = framework_env(none, launch)
    assert (env["WORLD_SIZE"], env["RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "0", "1")
    mpi = task_of(tmp_path, {"nodes": 2, "processes_per_node": 2}, "mpirun", "b.yaml")
    env = framework_env(mpi, Launch(mpi, 0, ["n2", "n3"], ["10.0.0.2", "10.0.0.3"], "7", {}))
    assert not {"RANK", "LOCAL_RANK", "WORLD_SIZE"} & set(env)  # OMPI_COMM_WORLD_* instead
    assert command_for(mpi, "python3 a.py", env)[-1] == "mpirun --tag-output python3 a.py"
    assert "--signal=B:USR1@60" in sbatch_argv(mpi, Path("/j"), AgentConfig())


def test_wrappers_get_the_tasks_cpus_and_slurms_node_rank(tmp_path, monkeypatch):
    task = task_of(tmp_path, {"nodes": 2, "processes_per_node": 2, "cpus": 3}, "torchrun")
    assert "--cpus-per-task=3" in wrapper_argv(task, Path("/j"))
    assert "--mpi=none" in wrapper_argv(task, Path("/j"))  # no PMIx unless runtime.mpi asks
    assert not [w for w in wrapper_argv(task, Path("/j")) if w.startswith("--mem")]
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert slurm_node_rank(["n2", "n3"], "n2.cluster.example") == 1  # not the host's name
    monkeypatch.delenv("SLURM_NODEID")
    assert slurm_node_rank(["n2", "n3"], "n3") == 1
    with pytest.raises(AgentError, match="not one of the job's nodes"):
        slurm_node_rank(["n2", "n3"], "elsewhere")


@pytest.mark.parametrize(
    ("resources", "launcher", "cpus"),
    [
        ({"gpus_per_node": 8}, "torchrun", 64),  # one wrapper a node: all its CPUs
        ({"gpus_per_node": 8}, "srun", 8),  # one a GPU: an even part
        ({"gpus_per_node": 8, "cpus_per_gpu": 8, "mem_per_gpu": "60G"}, "srun", 8),
    ],
)
def test_wrappers_of_a_gpu_job_share_the_cpus_slurm_gave_per_gpu(
    tmp_path, monkeypatch, resources, launcher, cpus
):
    """Issue [22]: with CPUs and memory per GPU (the partition's or the task's), each
    wrapper gets its part of the node's CPUs (SLURM_CPUS_ON_NODE) and the step the job's
    memory (--mem=0), never one CPU or DefMemPerCPU."""
    monkeypatch.setenv("SLURM_CPUS_ON_NODE", "64")
    argv = wrapper_argv(task_of(tmp_path, resources, launcher), Path("/j"))
    assert f"--cpus-per-task={cpus}" in argv and "--mem=0" in argv, argv
    # Nodes of different sizes (sbatch --exclusive): one step size, the smallest node's.
    monkeypatch.setenv("SLURM_JOB_CPUS_PER_NODE", "128,64(x2)")
    argv = wrapper_argv(task_of(tmp_path, resources, launcher, name="u.yaml"), Path("/j"))
    assert f"--cpus-per-task={cpus}" in argv, argv


def test_the_job_cpus_per_node_are_read_in_slurms_forms():
    assert job_cpus_per_node({"SLURM_JOB_CPUS_PER_NODE": "64,32"}) == 32
    assert (
        job_cpus_per_node({"SLURM_JOB_CPUS_PER_NODE": "32(x2),16", "SLURM_CPUS_ON_NODE": "32"})
        == 16
    )
    assert job_cpus_per_node({"SLURM_CPUS_ON_NODE": "8"}) == 8
    assert job_cpus_per_node({}) == 0
    # The per-GPU requests sbatch exports are kept from the wrappers' step.
    assert PER_GPU_JOB_VARIABLES == ("SLURM_CPUS_PER_GPU", "SLURM_MEM_PER_GPU")
