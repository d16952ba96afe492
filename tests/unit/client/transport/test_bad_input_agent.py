"""Bad input the cluster side decides (issue [7]): resources no node can give, and
instructions that did not come from tcloud's validation (the agent re-validates: never
trust the laptop). Each runs the real `tacc-agent store` with the check tcloud's submit
sends in its first round trip, against a fake `scontrol` that describes a 3-node
partition; the refusal names the field, exits 2 (tcloud shows it as exit 3) and leaves
nothing in the user's directory. Values full of shell metacharacters reach the program
as data."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest
import yaml

from tacc_agent.tasks.execute.launch import with_modules
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.transfer.upload import blob_name
from tests.unit.agent_jobs import agent, agent_env, make_job

pytestmark = pytest.mark.bad_input

SCONTROL = """#!/bin/sh
case "$2" in
  node)
    for n in n1 n2 n3; do
      echo "NodeName=$n CPUTot=64 RealMemory=512000 Gres=gpu:a100:8(S:0-1) Partitions=batch"
    done ;;
  partition) echo "PartitionName=batch Default=YES Nodes=n[1-3]" ;;
  *) echo "scontrol: unexpected $*" >&2; exit 1 ;;
esac
"""


@pytest.fixture
def cluster(tmp_path):
    """(env for `tacc-agent`, the user's directory) on a fake 3-node cluster."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "workspace").mkdir()
    env = agent_env(tmp_path) | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    user = os.environ.get("USER") or "root"
    return env, tmp_path / "workspace" / user


def first_round_trip(tmp: Path, task: dict, tamper=None) -> dict:
    """What `tcloud submit` sends first: the blobs it has and the instruction to check."""
    project = tmp / "project"
    project.mkdir(exist_ok=True)
    (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    document = json.loads(json.dumps(instruction.document))
    if tamper:
        tamper(document["task"])
    blobs = sorted({blob_name(e.sha256, e.mode) for e in instruction.manifest.values()})
    return {"op": "missing", "blobs": blobs, "check": document}


def refused(cluster, request: dict, field: str, *fragments: str) -> None:
    env, user_dir = cluster
    proc = agent("store", env=env, input=json.dumps(request))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    answer = json.loads(proc.stdout)
    assert field in f"{answer['field']} {answer['error']}", answer
    for fragment in fragments:
        assert fragment in answer["error"], (fragment, answer)
    # Refused in the check, before the store is touched: nothing was created.
    assert not user_dir.exists() or sorted(p.name for p in user_dir.iterdir()) == []


IMPOSSIBLE = [
    # (id, resources, field, fragments)
    (
        "more-gpus-than-any-node",
        {"gpus_per_node": 16},
        "resources.gpus_per_node",
        ["16 GPUs per node requested, but the most any node in partition 'batch' has is 8"],
    ),
    (
        "more-cpus-than-any-node",
        {"cpus": 512},
        "resources.cpus",
        ["512 CPUs per node requested", "has is 64"],
    ),
    (
        "more-memory-than-any-node",
        {"mem": "2T"},
        "resources.mem",
        ["MB of memory per node requested"],
    ),
    (
        "more-nodes-than-the-partition",
        {"nodes": 5},
        "resources.nodes",
        ["5 nodes requested, but partition 'batch' has 3 node(s)"],
    ),
    (
        "unknown-partition",
        {"partition": "gpu"},
        "resources.partition",
        ["unknown partition 'gpu'; this cluster has: batch"],
    ),
]


@pytest.mark.parametrize(
    ("resources", "field", "fragments"), [c[1:] for c in IMPOSSIBLE], ids=[c[0] for c in IMPOSSIBLE]
)
def test_impossible_resources_are_refused_by_the_cluster(
    cluster, tmp_path, resources, field, fragments
):
    request = first_round_trip(tmp_path, {"name": "t", "run": ["x"], "resources": resources})
    refused(cluster, request, field, *fragments)


def _set(path: list[str], value):
    def tamper(task: dict) -> None:
        target = task
        for key in path[:-1]:
            target = target.setdefault(key, {})
        target[path[-1]] = value

    return tamper


TAMPERED = [
    # (id, tamper, what the refusal names)
    (
        "nodes-zero",
        _set(["resources", "nodes"], 0),
        "resources.nodes: expected a node count >= 1, or a range like 2-4",
    ),
    ("name-injection", _set(["name"], "x; rm -rf ~"), "name: expected a name of letters"),
    (
        "env-name-injection",
        _set(["environment", "env"], {"A;B": "x"}),
        "environment.env.A;B: expected a shell variable name",
    ),
    ("unknown-key", _set(["evil"], True), "evil: unknown key"),
    ("time-zero", _set(["resources", "time"], "0"), "resources.time: expected a Slurm time > 0"),
    (
        "outputs-traversal",
        _set(["outputs"], ["../../.ssh"]),
        "outputs[0]: expected a path relative to the directory",
    ),
]


@pytest.mark.parametrize(
    ("tamper", "fragment"), [c[1:] for c in TAMPERED], ids=[c[0] for c in TAMPERED]
)
def test_an_instruction_that_skipped_tclouds_checks_is_refused(cluster, tmp_path, tamper, fragment):
    request = first_round_trip(tmp_path, {"name": "t", "run": ["x"]}, tamper)
    refused(cluster, request, "instruction", fragment)


def test_metacharacters_in_env_values_reach_the_program_as_data(tmp_path):
    canary = tmp_path / "PWNED"
    danger = f"$(touch {canary}); `touch {canary}` | & > < * ? ' \" \\ # \n second line"
    task = {
        "name": "t",
        "run": ['printf "%s|" "$DANGER"'],
        "environment": {"env": {"DANGER": danger}},
    }
    _, job_dir = make_job(tmp_path, task)
    proc = agent("exec", str(job_dir), env=agent_env(tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert f"{danger}|" in log
    assert not canary.exists()


def test_module_names_are_quoted_for_the_shell(tmp_path):
    project = tmp_path / "p"
    project.mkdir()
    task = {"name": "t", "run": ["true"], "environment": {"modules": ["cuda; touch /tmp/x"]}}
    (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
    line = with_modules(load_task(project / "tcloud.yaml"), "python train.py")
    assert shlex.split(line) == ["module", "load", "cuda; touch /tmp/x", "&&", "python", "train.py"]
