"""tcloud layer 2: the task instruction and its digest are reproducible."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.schedule.submit import sbatch_argv
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tests.conftest import run_cli

TASK = """\
name: t
code: {exclude: ["*.log"]}
resources: {nodes: 2, gpus_per_node: 4, partition: batch, qos: urgent, priority: 5}
environment:
  requirements: [numpy==1.26]
  modules: [cuda/12.2]
  env: {B: "2 words", A: "it's"}
datasets:
  - {name: shared, cluster: /shared/datasets/x}
  - {name: local, local: ./data}
setup: ["pip list > outputs/pip.txt"]
run: ["python train.py --lr 0.1", "echo done; exit 0"]
runtime: {transport: tcp}
"""


def project(root: Path) -> Path:
    (root / "data").mkdir(parents=True)
    (root / "data/a.bin").write_bytes(b"\0" * 100)
    (root / "src").mkdir()
    (root / "src/model.py").write_text("x = 1\n")
    (root / "train.py").write_text("print('hi')\n")
    (root / "train.py").chmod(0o755)
    (root / "debug.log").write_text("ignored\n")
    (root / ".tcloudignore").write_text("# comment\nsecrets/\n")
    (root / "secrets").mkdir()
    (root / "secrets/key").write_text("nope\n")
    (root / "tcloud.yaml").write_text(TASK)
    return root / "tcloud.yaml"


def test_same_inputs_same_digest_anywhere(tmp_path):
    first = compile_task(load_task(project(tmp_path / "a")))
    second = compile_task(load_task(project(tmp_path / "elsewhere/b")))
    os.utime(tmp_path / "elsewhere/b/train.py", (1, 1))  # timestamps do not matter
    third = compile_task(load_task(tmp_path / "elsewhere/b/tcloud.yaml"))
    assert first.digest == second.digest == third.digest
    assert str(tmp_path) not in json.dumps(first.document)


def test_a_content_change_changes_the_digest(tmp_path):
    path = project(tmp_path)
    before = compile_task(load_task(path)).digest
    (tmp_path / "src/model.py").write_text("x = 2\n")
    assert compile_task(load_task(path)).digest != before


def test_manifest_honours_exclude_and_tcloudignore_and_modes(tmp_path):
    instruction = compile_task(load_task(project(tmp_path)))
    assert list(instruction.manifest) == [
        "code/data/a.bin",
        "code/src/model.py",
        "code/tcloud.yaml",
        "code/train.py",
        "datasets/local/a.bin",
    ]
    assert instruction.manifest["code/train.py"].mode == 0o755
    assert instruction.manifest["code/src/model.py"].mode == 0o644
    assert instruction.manifest["datasets/local/a.bin"].size == 100


def test_instruction_carries_the_task_without_local_paths(tmp_path):
    instruction = compile_task(load_task(project(tmp_path)))
    task = instruction.document["task"]
    assert instruction.document["format"] == "tacc-instruction/1"
    assert task["datasets"] == [{"name": "shared", "cluster": "/shared/datasets/x"}]
    assert task["run"] == ["python train.py --lr 0.1", "echo done; exit 0"]
    assert task["resources"]["partition"] == "batch" and "account" not in task["resources"]
    assert str(tmp_path) not in json.dumps(instruction.document)


def test_the_cluster_accepts_what_the_compiler_writes(tmp_path):
    instruction = compile_task(load_task(project(tmp_path)))
    task = parse(json.dumps(instruction.document), "instruction.json")
    assert task.resources["gpus_per_node"] == 4 and task.runtime["transport"] == "tcp"
    assert task.environment["env"] == {"A": "it's", "B": "2 words"}


def test_sbatch_line_is_argv_with_every_option(tmp_path):
    task = parse(json.dumps(compile_task(load_task(project(tmp_path))).document), "i")
    argv = sbatch_argv(task, Path("/w/job"), AgentConfig())
    for option in (
        "--nodes=2",
        "--gres=gpu:4",
        "--partition=batch",
        "--qos=urgent",
        "--nice=5",
        "--job-name=t",
        "--requeue",
        "--ntasks-per-node=4",
        "--output=/w/job/logs/job.log",
        "--signal=USR1@60",
    ):
        assert option in argv
    assert argv[0] == "sbatch" and argv[-1] == "/w/job/job.sh"


def test_dry_run_prints_digest_and_sbatch_without_a_cluster(tmp_path):
    path = project(tmp_path)
    proc = run_cli("tcloud", "submit", "--dry-run", str(path))
    assert proc.returncode == 0, proc.stderr
    digest = compile_task(load_task(path)).digest
    assert proc.stdout.startswith(f"digest: {digest}\n")
    assert "--nodes=2" in proc.stdout
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path, copy, ignore=shutil.ignore_patterns("copy"))
    again = run_cli("tcloud", "submit", "--dry-run", str(copy / "tcloud.yaml"))
    assert again.stdout == proc.stdout
