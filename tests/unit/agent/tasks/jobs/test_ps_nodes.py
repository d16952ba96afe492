"""`tcloud ps` (the agent's jobs.ps) shows where a job ran after it left the queue:
from Slurm's accounting, else from the hosts its ranks recorded."""

from __future__ import annotations

import json

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.jobs import verbs as jobs
from tests.unit.agent_jobs import agent, agent_env, make_job
from tests.unit.fake_slurm import FakeSlurmOnPath

TASK = {"name": "t", "resources": {"nodes": 1}, "run": ["python train.py"]}


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> FakeSlurmOnPath:
    fake = FakeSlurmOnPath(tmp_path)
    for name, value in fake.env().items():
        monkeypatch.setenv(name, value)
    return fake


@pytest.fixture
def ended_job(tmp_path, slurm):
    """(user_dir, job_dir) of job 100, submitted for real (fake sbatch), COMPLETED and
    gone from the queue (Slurm's MinJobAge passed): only accounting knows it now."""
    user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
    env = agent_env(tmp_path) | slurm.env()
    submitted = agent("--userdir", str(user_dir), "job", "submit", str(job_dir), env=env)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    slurm.set_job("100", state="COMPLETED", nodes="n[2-3]", forgotten=True)
    for rank, host in enumerate(("n3", "n2")):
        status = job_dir / "status" / f"rank-{rank}.json"
        rank_record = {"rank": rank, "host": host, "state": "EXITED", "exit_code": 0}
        status.write_text(json.dumps(rank_record))
    return user_dir, job_dir


def ps_nodes(user_dir, tmp_path) -> list[tuple[str, str, str]]:
    config = AgentConfig(workspace=str(tmp_path / "workspace"), slurm_timeout_seconds=10)
    return [(r["job"], r["state"], r["nodes"]) for r in jobs.ps(user_dir, config)]


def test_an_ended_job_shows_the_nodes_accounting_says_it_ran_on(tmp_path, slurm, ended_job):
    user_dir, job_dir = ended_job
    slurm.enable_accounting()
    assert ps_nodes(user_dir, tmp_path) == [("100", "COMPLETED", "n[2-3]")]
    assert records.last_state(job_dir) == "COMPLETED"
    (sacct,) = slurm.calls("sacct")  # one call for every ended job of the listing
    assert "--jobs=100" in sacct


def test_without_accounting_the_ranks_records_name_the_nodes(tmp_path, slurm, ended_job):
    user_dir, _ = ended_job
    assert ps_nodes(user_dir, tmp_path) == [("100", "COMPLETED", "n2,n3")]


def test_limit_lists_the_newest_that_many_and_zero_lists_none(tmp_path, slurm):
    """`tcloud ps --limit N`: the newest N jobs of the index; 0 is none, not all."""
    env = agent_env(tmp_path) | slurm.env()
    for _ in range(3):
        user_dir, job_dir = make_job(tmp_path, TASK, {"train.py": "print('hi')\n"})
        submitted = agent("--userdir", str(user_dir), "job", "submit", str(job_dir), env=env)
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    config = AgentConfig(workspace=str(tmp_path / "workspace"), slurm_timeout_seconds=10)
    everything = [row["job"] for row in jobs.ps(user_dir, config)]
    assert len(everything) == 3 and everything == sorted(everything, key=int, reverse=True)
    assert [row["job"] for row in jobs.ps(user_dir, config, limit=2)] == everything[:2]
    assert jobs.ps(user_dir, config, limit=0) == []
