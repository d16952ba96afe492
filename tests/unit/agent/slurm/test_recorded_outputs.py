"""The agent's Slurm readers on what Slurm 22.05 (Debian 12) and 24.11 (Debian 13) really
printed in the lab (tests/unit/slurm_outputs/, recorded by tools/record_slurm_outputs.py):
a first set; issue [20] point 3 grows it to every reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from tacc_agent.slurm import jobs, nodes, queue
from tacc_agent.slurm.oneliner import parse_oneliner

RECORDED = Path(__file__).resolve().parents[2] / "slurm_outputs"
VERSIONS = ["22.05", "24.11"]


def recorded(version: str, name: str) -> str:
    return (RECORDED / version / f"{name}.out").read_text()


@pytest.mark.parametrize("version", VERSIONS)
def test_a_running_jobs_tres_reads_on_both(version):
    record = parse_oneliner(recorded(version, "scontrol-show-job-running.root").strip())
    assert record["JobState"] == "RUNNING"
    assert jobs.tres_of(record) == "cpu=1,mem=256M,node=1,billing=1"


@pytest.mark.parametrize("version", VERSIONS)
def test_a_partitions_qos_reads_on_both(version):
    text = recorded(version, "scontrol-show-partition.root").strip()
    partition = nodes.partition_of(parse_oneliner(text))
    assert (partition.name, partition.default, partition.qos) == ("batch", True, "N/A")


@pytest.mark.parametrize("version", VERSIONS)
def test_sinfo_json_lists_the_compute_nodes_on_both(version):
    found = nodes.parse_sinfo_json(recorded(version, "sinfo-json.root"))
    assert sorted(node["name"] for node in found) == ["n2", "n3"]
    assert all(node["partitions"] == ["batch"] for node in found)


@pytest.mark.parametrize("version", VERSIONS)
def test_the_queue_reads_on_both(version):
    found = queue.parse_queue(recorded(version, "squeue-queue.root"))
    assert found and {job.user for job in found} <= {"alice", "bob", "root"}
