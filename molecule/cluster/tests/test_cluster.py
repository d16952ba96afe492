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
