"""examples/: every task file validates, every script compiles, numpy-ddp really trains.

The torch example is syntax-checked here (it runs for real in the lab: test_frameworks.py);
numpy-ddp is
run as the execution wrapper would start it: one process per node, RANK/WORLD_SIZE/
MASTER_ADDR/MASTER_PORT and the TACC_* variables set, cwd = the code directory.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_contract.schema import processes_per_node
from tcloud.compile.task_file import load_task

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"
TASK_FILES = sorted(EXAMPLES.glob("*/*.yaml"))
SCRIPTS = sorted(EXAMPLES.rglob("*.py"))
NUMPY_DDP = EXAMPLES / "numpy-ddp"

# Runs numpy-ddp's main() and sends the process a real SIGUSR1 during its third step.
SIGNAL_AT_STEP_3 = """
import os, signal, train
real, calls = train.loss_and_grad, []
def loss_and_grad(*args):
    calls.append(1)
    if len(calls) == 3:
        os.kill(os.getpid(), signal.SIGUSR1)
    return real(*args)
train.loss_and_grad = loss_and_grad
train.main()
"""


def relative(path: Path) -> str:
    return str(path.relative_to(EXAMPLES))


@pytest.mark.parametrize("path", TASK_FILES, ids=relative)
def test_task_file_validates(path):
    task = load_task(path)
    assert task.name.startswith(path.parent.name)
    assert "outputs/" in task.outputs


def test_the_examples_are_there():
    names = {path.parent.name for path in TASK_FILES}
    assert {"hello", "numpy-ddp", "pytorch-ddp"} <= names
    lab = load_task(EXAMPLES / "pytorch-ddp" / "tcloud.yaml")
    gpus = load_task(EXAMPLES / "pytorch-ddp" / "gpu-cluster.yaml")
    assert lab.runtime["launcher"] == gpus.runtime["launcher"] == "torchrun"
    assert lab.run == [
        line.replace("--epochs 20 --batch-size 256", "--epochs 8 --samples 16384 --batch-size 128")
        for line in gpus.run
    ]  # the same train.py
    assert (lab.resources["nodes"], processes_per_node(lab.resources)) == (2, 2)
    assert lab.resources["gpus_per_node"] == 0
    assert gpus.resources["gpus_per_node"] == 8 and processes_per_node(gpus.resources) == 8
    assert load_task(NUMPY_DDP / "tcloud.yaml").runtime["launcher"] == "srun"


@pytest.mark.parametrize("path", SCRIPTS, ids=relative)
def test_script_compiles(path):
    compile(path.read_text(), str(path), "exec")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_numpy_ddp(workdir: Path, world: int, code: dict[int, str] | None = None) -> list[str]:
    """Start `world` ranks on this machine; every one must exit 0. Returns their output."""
    (workdir / "outputs").mkdir(parents=True, exist_ok=True)
    port = str(free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TACC_WORKDIR": str(workdir),
            "TACC_USERDIR": str(workdir.parent),
            "TACC_JOB_ID": "1",
            "TACC_NODE_RANK": str(rank),
            "TACC_NUM_NODES": str(world),
            "TACC_NODE_IPS": ",".join(["127.0.0.1"] * world),
            "TACC_TRANSPORT": "tcp",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": "0",
        }
        source = (code or {}).get(rank)
        argv = [sys.executable, "-c", source] if source else [sys.executable, "train.py"]
        procs.append(
            subprocess.Popen(
                argv,
                cwd=NUMPY_DDP,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            outputs.append(proc.communicate(timeout=90)[0])
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for rank, (proc, output) in enumerate(zip(procs, outputs, strict=True)):
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{output}"
        assert f"rank {rank}/{world} on " in output and "shard of" in output
    return outputs


def model(workdir: Path) -> dict:
    return json.loads((workdir / "outputs" / "model.json").read_text())


@pytest.mark.parametrize("world", [1, 2])
def test_numpy_ddp_trains(tmp_path, world):
    pytest.importorskip("numpy")
    outputs = run_numpy_ddp(tmp_path, world)
    result = model(tmp_path)
    assert result["world_size"] == world
    assert result["losses"][-1] < result["losses"][0] / 2
    assert result["final_loss"] == result["losses"][-1]
    assert "epoch 20/20 loss" in outputs[0]
    shards = [
        json.loads((tmp_path / "outputs" / f"rank{r}.json").read_text()) for r in range(world)
    ]
    assert sum(shard["samples"] for shard in shards) == 4096
    assert not (tmp_path / "outputs" / "checkpoint.npz").exists()


def test_numpy_ddp_two_ranks_match_one(tmp_path):
    """Synchronous data parallelism: the strided shards make the same global batches."""
    pytest.importorskip("numpy")
    run_numpy_ddp(tmp_path / "one", 1)
    run_numpy_ddp(tmp_path / "two", 2)
    one, two = model(tmp_path / "one"), model(tmp_path / "two")
    assert two["final_loss"] == pytest.approx(one["final_loss"], rel=1e-9)
    assert two["weights"] == pytest.approx(one["weights"], rel=1e-9)


def test_numpy_ddp_checkpoints_on_sigusr1_and_resumes(tmp_path):
    pytest.importorskip("numpy")
    import numpy as np

    # Rank 1 gets the signal; rank 0 saves (they agree on it in the step's allreduce).
    outputs = run_numpy_ddp(tmp_path, 2, code={1: SIGNAL_AT_STEP_3})
    assert "checkpoint: epoch 0 step 3" in outputs[0]
    uninterrupted = model(tmp_path)
    with np.load(tmp_path / "outputs" / "checkpoint.npz") as saved:
        assert (int(saved["epoch"]), int(saved["step"])) == (0, 3)

    outputs = run_numpy_ddp(tmp_path, 2)  # a requeued job: same workdir, resumes
    assert all("resumed at epoch 0 step 3" in output for output in outputs)
    resumed = model(tmp_path)
    assert resumed["final_loss"] == pytest.approx(uninterrupted["final_loss"], rel=1e-9)
