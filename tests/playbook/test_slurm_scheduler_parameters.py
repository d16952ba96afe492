"""slurm.conf's SchedulerParameters come from slurm_scheduler_parameters: by default
batch_sched_delay=0, so a batch job is scheduled on slurmctld's next 1 s tick instead of
up to 3 s after its last pass (issue [12], the bimodal start; bench/slurm_start.py);
[] leaves the line out (Slurm's own defaults)."""

from __future__ import annotations

import json

from tests.playbook.slurm_render import SLURM_ONLY, render


def scheduler_lines(conf: str) -> list[str]:
    return [line for line in conf.splitlines() if line.startswith("SchedulerParameters=")]


def test_batch_jobs_are_scheduled_on_the_next_tick_by_default(tmp_path):
    render(tmp_path, "--limit", "ctl1", *SLURM_ONLY)
    conf = (tmp_path / "ctl1/slurm.conf").read_text()
    assert scheduler_lines(conf) == ["SchedulerParameters=batch_sched_delay=0"]


def test_the_parameters_are_joined_and_none_leaves_the_line_out(tmp_path):
    several = {"slurm_scheduler_parameters": ["batch_sched_delay=20", "bf_continue"]}
    render(tmp_path / "several", "--limit", "ctl1", "-e", json.dumps(several), *SLURM_ONLY)
    conf = (tmp_path / "several/ctl1/slurm.conf").read_text()
    assert scheduler_lines(conf) == ["SchedulerParameters=batch_sched_delay=20,bf_continue"]
    render(
        tmp_path / "none",
        "--limit",
        "ctl1",
        "-e",
        '{"slurm_scheduler_parameters": []}',
        *SLURM_ONLY,
    )
    assert scheduler_lines((tmp_path / "none/ctl1/slurm.conf").read_text()) == []
