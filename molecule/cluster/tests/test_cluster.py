"""Verify the converged Slurm cluster from its controller (testinfra over the lab's
host-key-checked SSH). Per-node checks live in test_nodes.py.
"""

from __future__ import annotations

import re
import shlex

import testinfra

CONTROLLER = "n1"
COMPUTE = ("n2", "n3")
# Cluster-wide checks run once, from the controller, not once per node.
testinfra_hosts = [f"ansible://{CONTROLLER}"]


def on(host, name: str):
    """Another lab node, reached with the same inventory as `host`."""
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=host.backend.ansible_inventory)


def test_munge_credentials_decode_across_nodes(host):
    for name in COMPUTE:
        credential = on(host, name).check_output("munge -n")
        decoded = host.run(f"printf '%s' {shlex.quote(credential)} | unmunge")
        assert decoded.rc == 0, decoded.stderr
        assert "STATUS:          Success (0)" in decoded.stdout


def test_every_compute_node_is_idle(host):
    states = dict(line.split() for line in host.check_output("sinfo -h -N -o '%N %t'").splitlines())
    assert states == {name: "idle" for name in COMPUTE}


def test_srun_spans_both_compute_nodes(host):
    names = host.check_output("srun -N2 hostname").split()
    assert sorted(names) == list(COMPUTE)


def test_sacct_records_a_finished_job(host):
    job = host.check_output("sbatch --parsable --wait -N1 --wrap true").strip()
    # slurmctld hands the record to slurmdbd asynchronously; sacct waits for nothing.
    for _ in range(30):
        row = host.check_output(f"sacct -n -X -P -j {job} -o JobID,State,ExitCode")
        if row:
            break
        host.run("sleep 1")
    assert row.strip() == f"{job}|COMPLETED|0:0"


def test_cluster_is_registered_with_slurmdbd(host):
    assert host.check_output("sacctmgr -n -P show cluster format=Cluster") == "tacc"
    assert host.service("slurmdbd").is_running
    conf = host.file("/etc/slurm/slurmdbd.conf")
    assert (conf.user, conf.mode) == ("slurm", 0o600)


def test_qos_and_partitions_come_from_inventory(host):
    qos = host.check_output("sacctmgr -n -P show qos urgent format=Name,Priority,Preempt,MaxWall")
    assert qos == "urgent|100|normal|12:00:00"
    partition = host.check_output("scontrol show partition urgent")
    assert "QoS=urgent" in partition
    assert "PriorityTier=10" in partition
    config = host.check_output("scontrol show config")
    assert re.search(r"^PreemptMode\s*=\s*REQUEUE$", config, re.M), config
    assert re.search(r"^PreemptType\s*=\s*preempt/partition_prio$", config, re.M), config


def test_qos_limits_modes_and_usage_factors_come_from_inventory(host):
    fields = "format=Name,Preempt,MaxTRESPU,MaxJobsPU,PreemptMode,UsageFactor"
    rows = host.check_output(f"sacctmgr -n -P show qos normal,scavenger {fields}").splitlines()
    assert sorted(rows) == [
        "normal|scavenger|gres/gpu=2|10|cluster|1.000000",
        "scavenger||||requeue|0.000000",
    ]


def test_accounts_and_users_come_from_inventory(host):
    fields = "format=Account,User,Fairshare,DefaultQOS,QOS"
    rows = host.check_output(f"sacctmgr -n -P show assoc where cluster=tacc {fields}")
    assocs = {tuple(row.split("|")[:2]): row.split("|")[2:] for row in rows.splitlines()}
    assert assocs[("physics", "")] == ["200", "normal", "normal,scavenger"]
    assert assocs[("physics", "alice")][1:] == ["normal", "normal,scavenger"]
    assert assocs[("chemistry", "")][0] == "100"
    assert {("chemistry", "bob"), ("chemistry", "carol"), ("root", "root")} <= set(assocs)


def test_associations_limits_and_fair_share_are_enforced(host):
    config = host.check_output("scontrol show config")
    assert re.search(
        r"^AccountingStorageEnforce\s*=\s*associations,limits,qos,safe$", config, re.M
    ), config
    assert re.search(r"^AccountingStorageTRES\s*=.*gres/gpu", config, re.M), config
    # scontrol spells it PriorityWeightFairShare.
    assert re.search(r"^PriorityWeightFairshare\s*=\s*10000$", config, re.M | re.I), config
    # A user with no association (nobody is in no account) cannot submit.
    refused = host.run("cd /tmp && runuser -u nobody -- sbatch --wrap true")
    assert refused.rc != 0
    assert "Invalid account" in refused.stderr, refused.stderr


def test_a_researcher_sees_their_limits_and_fair_share_with_tcloud_quota(host):
    """Issue [8] item 3, the researcher's side: `tcloud quota` as alice (over SSH, through
    the agent on the login node) shows her account, its fair share and her QoS limits."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tacc_lab.demo import researcher_env

    env = {**os.environ, **researcher_env("mcluster", "alice")}
    tcloud = str(Path(sys.executable).parent / "tcloud")
    proc = subprocess.run(
        [tcloud, "quota", "--json"], env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["user"] == "alice" and info["accounting"] is True, info
    # Her own association in the account (a user's share within it is 1 by default).
    assert [(a["Account"], a["DefaultQOS"]) for a in info["associations"]] == [
        ("physics", "normal")
    ]
    assert [s["Account"].strip() for s in info["fairshare"]] == ["physics"], info
    normal = next(q for q in info["qos"] if q["Name"] == "normal")
    assert normal["MaxTRESPU"] == "gres/gpu=2" and normal["MaxJobsPU"] == "10", normal
    text = subprocess.run(
        [tcloud, "quota"], env=env, capture_output=True, text=True, check=False
    ).stdout
    assert "account physics: fair share" in text and "QoS normal,scavenger" in text, text
    assert "qos normal: priority 0, MaxTRESPU gres/gpu=2, MaxJobsPU 10" in text, text
