"""Slurm's times (tacc_agent/slurm/times.py): run times and limits as squeue and scontrol
print them, and moments printed with SLURM_TIME_FORMAT=%s."""

from __future__ import annotations

import pytest

from tacc_agent.slurm.times import elapsed_seconds, epoch_seconds


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("0:00", 0),  # squeue %M of a job that just started
        ("1:02:03", 3723),
        ("00:01:00", 60),  # scontrol's RunTime=
        ("2-00:00:00", 172800),  # scontrol's TimeLimit=2-00:00:00
        ("10:00", 600),  # squeue %l
        ("UNLIMITED", 0),
        ("N/A", 0),
    ],
)
def test_run_times_and_limits(text, seconds):
    assert elapsed_seconds(text) == seconds


def test_epoch_times_and_none_as_zero():
    assert epoch_seconds("1795587794") == 1795587794.0
    texts = ("N/A", "Unknown", "", "x", "2026-11-25T06:00:00", "-5")
    assert [epoch_seconds(t) for t in texts] == [0.0] * len(texts)


@pytest.mark.security
def test_a_time_of_digits_that_are_not_ascii_reads_as_none():
    texts = ("\u00b2", "\u0661\u0662", "12\u00b3")
    assert [epoch_seconds(t) for t in texts] == [0.0] * len(texts)
