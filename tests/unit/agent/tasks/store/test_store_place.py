"""Where a finished job tree goes (tacc_agent.tasks.store.delta.place): the first free
jobs/<digest12>-<n>, whatever holds the numbers before it."""

from __future__ import annotations

import pytest

from tacc_agent.tasks.store import delta as store

DIGEST = "0123456789abcdef" * 4


@pytest.mark.fault
def test_a_file_where_a_job_would_go_means_the_next_number(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / f"{DIGEST[:12]}-1").write_text("not a job")  # ENOTDIR for a directory's rename
    taken = jobs / f"{DIGEST[:12]}-2"
    taken.mkdir()
    (taken / "run.sh").write_text("")  # a job: ENOTEMPTY
    building = tmp_path / "building"
    building.mkdir()
    (building / "run.sh").write_text("echo")
    assert store.place(building, jobs, DIGEST) == jobs / f"{DIGEST[:12]}-3"
