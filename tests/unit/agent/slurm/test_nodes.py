"""Nodes and partitions (tacc_agent/slurm/nodes.py): `scontrol show node|partition`
records, `sinfo --json` and `sinfo --format=%D|%T`, host lists, and the one drain and
resume of a node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.slurm import nodes
from tacc_agent.slurm.oneliner import parse_oneliner
from tests.unit.fake_slurm import FakeSlurm

FILES = Path(__file__).parents[1] / "health" / "slurm_cluster_files"
# As Slurm 22.05 prints them (the lab's n3, drained by the agent; a GPU node)
DRAINED = (
    "NodeName=n3 Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.01 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=(null) NodeAddr=n3 NodeHostName=n3 "
    "Version=22.05.8 OS=Linux 6.1.0-27-amd64 #1 SMP Debian RealMemory=23000 AllocMem=0 "
    "State=IDLE+DRAIN Partitions=batch "
    "Reason=tacc: mounts: /mnt/x not mounted [root@2026-11-22T20:26:01]"
)
GPU_NODE = (
    "NodeName=gpu01 Arch=x86_64 CPUAlloc=16 CPUTot=64 RealMemory=512000 "
    "AvailableFeatures=a100,nvme Gres=gpu:a100:8(S:0-1),shard:16 NodeAddr=10.0.0.11 "
    "State=MIXED Partitions=gpu,all"
)
# As Slurm 22.05 and 24.11 print it: a partition's QOS is `QoS=` (a job's is `QOS=`).
PARTITION = (
    "PartitionName=gpu AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=NO QoS=gpu-part DefaultTime=NONE MaxNodes=4 Nodes=gpu[01-02] "
    "State=UP TotalCPUs=128"
)


def test_a_node_record_as_scontrol_prints_it():
    found = nodes.node_of(parse_oneliner(DRAINED))
    assert found == nodes.NodeRecord(
        name="n3",
        state="IDLE+DRAIN",
        reason="tacc: mounts: /mnt/x not mounted",
        partitions=("batch",),
        features=(),
        gres="(null)",
        cpus=2,
        cpus_allocated=0,
        memory_mb=23000,
        address="n3",
    )
    assert found.gpus == 0
    gpu = nodes.node_of(parse_oneliner(GPU_NODE))
    assert (gpu.gpus, gpu.features, gpu.partitions) == (8, ("a100", "nvme"), ("gpu", "all"))
    assert (gpu.cpus, gpu.cpus_allocated, gpu.address) == (64, 16, "10.0.0.11")


def test_a_reason_loses_who_set_it_only():
    assert nodes.strip_set_by("disk swap [admin@2026-01-01T00:00:00]") == "disk swap"
    assert nodes.strip_set_by("not [a set-by] here") == "not [a set-by] here"


def test_a_partition_record_as_scontrol_prints_it():
    assert nodes.partition_of(parse_oneliner(PARTITION)) == nodes.PartitionRecord(
        "gpu", False, "4", "gpu-part"
    )
    # The per-GPU defaults the slurm role sets; Slurm prints "(null)" for none.
    with_defaults = PARTITION + " JobDefaults=DefCpuPerGPU=8,DefMemPerGPU=61156"
    assert nodes.partition_of(parse_oneliner(with_defaults)).job_defaults == {
        "DefCpuPerGPU": 8,
        "DefMemPerGPU": 61156,
    }
    none = nodes.partition_of(parse_oneliner(PARTITION + " JobDefaults=(null)"))
    assert none.job_defaults == {}


def test_the_queries_and_the_one_drain_and_resume(monkeypatch):
    fake = FakeSlurm().install(monkeypatch)
    fake.add_node("n2", "IDLE", partitions="batch,gpu", gres="gpu:4")
    fake.add_partition("batch", Default="YES", MaxNodes="UNLIMITED", QoS="N/A")
    assert nodes.node("n2").partitions == ("batch", "gpu") and nodes.node("n2").gpus == 4
    assert [n.name for n in nodes.all_nodes()] == ["n2"]
    assert nodes.all_partitions() == [nodes.PartitionRecord("batch", True, "UNLIMITED", "N/A")]
    assert nodes.hostnames("n[2-3]") == ["n2", "n3"]
    nodes.drain("n2", "tacc: gpu: 3 GPU(s), expected 4", 5)
    assert nodes.node("n2").reason == "tacc: gpu: 3 GPU(s), expected 4"
    nodes.resume("n2", 5)
    assert fake.updates() == [
        [
            "scontrol",
            "update",
            "NodeName=n2",
            "State=DRAIN",
            "Reason=tacc: gpu: 3 GPU(s), expected 4",
        ],
        ["scontrol", "update", "NodeName=n2", "State=RESUME"],
    ]
    assert nodes.node("n2").state == "IDLE"
    fake.refuse_drain = True
    with pytest.raises(AgentError, match="scontrol failed: slurm_update error"):
        nodes.drain("n2", "tacc: x", 5)


def test_idle_nodes_are_only_wholly_idle_ones():
    # sinfo --noheader --states=idle --format=%D|%T: drained and not responding idle ones too
    assert nodes.parse_idle("3|idle\n1|drained\n1|idle*\n") == 3
    assert nodes.parse_idle("") == 0


def test_sinfo_json_as_the_lab_printed_it():
    found = nodes.parse_sinfo_json((FILES / "sinfo-22.05-drained.json").read_text())
    assert [node["name"] for node in found] == ["n2", "n3"]
    assert all("DRAIN" in node["state_flags"] for node in found)


def test_sinfo_json_as_slurm_24_11_printed_it_on_the_trixie_lab():
    """24.11 groups nodes by state and partition (`sinfo`); each node comes out in
    22.05's shape, its base state then its flags."""
    found = nodes.parse_sinfo_json((FILES / "sinfo-24.11-drained.json").read_text())
    assert found == [
        {
            "name": "n3",
            "state": "idle",
            "state_flags": ["DRAIN"],
            "partitions": ["batch"],
            "reason": "tacc: gpu: 3 GPU(s), expected 4",
            "gres": "",
            "gres_used": "",
        },
        {
            "name": "n2",
            "state": "idle",
            "state_flags": [],
            "partitions": ["batch"],
            "reason": "",
            "gres": "",
            "gres_used": "",
        },
    ]


def test_a_node_in_two_partitions_is_one_node():
    group = json.loads((FILES / "sinfo-24.11-drained.json").read_text())["sinfo"][1]
    other = json.loads(json.dumps(group))
    other["partition"]["name"] = "gpu"
    found = nodes.parse_sinfo_json(json.dumps({"sinfo": [group, other], "errors": []}))
    assert [(node["name"], node["partitions"]) for node in found] == [("n2", ["batch", "gpu"])]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("not json", "not JSON"),
        ('{"nodes": 3}', "no node list"),
        ('{"sinfo": [{"node": {"state": "IDLE"}}]}', "no node list"),
        ('{"sinfo": [3]}', "no node list"),
        ("[]", "no node list"),
        (json.dumps({"errors": [{"error": "x"}], "nodes": []}), "sinfo --json: \\[{'error'"),
    ],
)
def test_nonsense_from_sinfo_is_an_error(text, why):
    with pytest.raises(AgentError, match=why):
        nodes.parse_sinfo_json(text)
