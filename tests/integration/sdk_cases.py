"""Issue [11] point 3 on the slurm lab: the Python SDK (`from tcloud import Cluster`)
submits a dict task, streams its logs, waits, downloads; cancels; keeps one researcher
out of another's jobs; and examples/sdk/run.py runs as documented, as alice.

Collected as part of test_slurm_cluster.py (which imports these tests), on its lab.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tacc_lab.demo import researcher_env
from tcloud import Cluster, JobTimeout, TcloudError, UsageError
from tests.conftest import ROOT
from tests.integration.labs import SLURM_LAB


@pytest.fixture
def as_researcher(monkeypatch):
    """Point tcloud's config in this process at a lab researcher's, as
    `eval "$(tacc-lab user NAME)"` does in a shell."""

    def become(name: str) -> None:
        env = researcher_env(SLURM_LAB, name)
        for key in ("TCLOUD_CONFIG", "TCLOUD_CACHE_DIR"):
            monkeypatch.setenv(key, env[key])
        monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)

    return become


def test_sdk_submits_a_dict_task_streams_its_logs_waits_and_downloads(
    alice, as_researcher, tmp_path
):
    as_researcher("alice")
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text(
        "import os\n"
        "rank = os.environ['RANK']\n"
        "print(f'sdk rank {rank} of', os.environ['WORLD_SIZE'])\n"
        "open(os.path.join(os.environ['TACC_WORKDIR'], 'outputs', f'r{rank}'), 'w').write(rank)\n"
    )
    task = {
        "name": "sdk-dict",
        "resources": {"nodes": 2, "mem": "100M", "time": "5"},
        "run": ["python3 train.py"],
        "outputs": ["outputs/"],
    }
    with Cluster() as cluster:
        job = cluster.submit(task, base_dir=tmp_path / "code")
        session = cluster.client
        assert job.submission.name == "sdk-dict" and job.submission.partition
        lines = list(job.logs(follow=True))  # ends with the job
        assert "[n2:0] sdk rank 0 of 2" in lines and "[n3:1] sdk rank 1 of 2" in lines, lines
        info = job.wait(timeout=60, poll=0.5)
        assert info["state"] == "COMPLETED", info
        assert job.id in [row["job"] for row in cluster.jobs()]
        assert job.download(tmp_path / "got") >= 2
        assert cluster.client is session  # one SSH session for all of it
    assert sorted(p.name for p in (tmp_path / "got/outputs").iterdir()) == ["r0", "r1"]


def test_sdk_cancels_and_another_researcher_cannot_touch_the_job(alice, as_researcher, tmp_path):
    as_researcher("alice")
    task = {
        "name": "sdk-sleeper",
        "resources": {"nodes": 1, "mem": "50M", "time": "5"},
        "run": ["sleep 300"],
    }
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "notes.txt").write_text("a job with files\n")
    with Cluster() as cluster:
        job = cluster.submit(task, base_dir=tmp_path / "code")
        try:
            with pytest.raises(JobTimeout, match=f"job {job.id} is still"):
                job.wait(timeout=1, poll=0.5)
            as_researcher("bob")
            with Cluster() as bob, pytest.raises(TcloudError, match=f"no job {job.id} of yours"):
                bob.job(job.id).cancel()
            with pytest.raises(UsageError, match="not a job id"):
                cluster.job(f"{job.id};id")
        finally:
            job.cancel()
        assert job.wait(timeout=60, poll=0.5)["state"] == "CANCELLED"


def test_the_sdk_example_runs_against_the_lab(alice, tmp_path):
    """examples/sdk/run.py as its README says: alice's tcloud config, nothing else."""
    env = researcher_env(SLURM_LAB, "alice")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/sdk/run.py"), "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("[n2:0] hello from TACC: rank 0/2 on n2") for line in lines), lines
    assert any(line.endswith(": COMPLETED") for line in lines), lines
    trials = sorted(line for line in lines if line.startswith("trial "))
    assert len(trials) == 2 and all(" COMPLETED " in line for line in trials), trials
    out = tmp_path / "out"
    ranks = sorted(p.name for p in (out / "hello/outputs").iterdir())
    assert ranks == ["rank0.json", "rank1.json"], ranks
    assert json.loads((out / "hello/outputs/rank1.json").read_text())["host"] == "n3"
    results = {(out / f"sweep/trials/{i}/outputs/result.txt").read_text().strip() for i in (0, 1)}
    assert results == {"trial 0: lr=0.1", "trial 1: lr=0.01"}, results
