"""What a committed job directory always holds (tacc_agent.tasks.store.delta.commit)."""

from __future__ import annotations

from tests.unit.agent_jobs import make_job


def test_a_task_without_files_still_gets_its_code_directory(tmp_path):
    """A task with nothing to upload (an SDK dict task over an empty directory, or a
    task file alone) runs in code/: the commit makes it even with no files in it."""
    task = {"name": "empty", "run": ["true"], "code": {"exclude": ["*"]}}
    _, job_dir = make_job(tmp_path, task)
    for sub in ("code", "logs", "outputs", "status"):
        assert (job_dir / sub).is_dir(), sub
    assert list((job_dir / "code").iterdir()) == []
