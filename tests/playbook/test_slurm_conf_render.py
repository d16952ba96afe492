"""slurm.conf comes from inventory variables only: rendered from the example inventory
(1 controller + login + 8 GPU nodes) it is the same on every host and in a --limit run.
Nodes with the same hardware share one NodeName line, names and addresses written as
hostlist expressions that pair up node by node."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.playbook.slurm_render import SLURM_ONLY, render
from tests.unit.hostlist_reading import expand

# The example inventory's GPU nodes: two sockets of 32 cores.
TOPOLOGY = "Sockets=2 CoresPerSocket=32 ThreadsPerCore=1"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[Path, Path]:
    full = tmp_path_factory.mktemp("full")
    limited = tmp_path_factory.mktemp("limited")
    render(full)
    render(limited, "--limit", "gpu03")
    return full, limited


def test_every_host_renders_the_same_slurm_conf(rendered):
    full, _ = rendered
    confs = {p.parent.name: p.read_bytes() for p in full.glob("*/slurm.conf")}
    assert sorted(confs) == sorted(["ctl1", "login1"] + [f"gpu0{i}" for i in range(1, 9)])
    assert len(set(confs.values())) == 1


def test_limit_run_renders_the_same_bytes(rendered):
    full, limited = rendered
    assert [p.name for p in limited.iterdir()] == ["gpu03"]
    assert (limited / "gpu03/slurm.conf").read_bytes() == (full / "ctl1/slurm.conf").read_bytes()
    assert (limited / "gpu03/gres.conf").read_bytes() == (full / "gpu03/gres.conf").read_bytes()


def test_nodes_partitions_and_policy_come_from_group_vars(rendered):
    conf = (rendered[0] / "ctl1/slurm.conf").read_text()
    # 515000 MB declared, 0.95 safety factor; the 8 identical nodes share one line.
    nodes = [line for line in conf.splitlines() if line.startswith("NodeName=")]
    # Features: the GPU type from the Gres, then the group's slurm_node_features.
    assert nodes == [
        f"NodeName=gpu[01-08] NodeAddr=10.10.1.[1-8] CPUs=64 {TOPOLOGY} RealMemory=489250 "
        "Gres=gpu:a100:8 Features=a100,ib State=UNKNOWN"
    ]
    assert "SlurmctldHost=ctl1(10.10.0.10)" in conf
    assert "PartitionName=urgent Nodes=ALL Default=NO MaxTime=12:00:00" in conf
    # A GPU job naming no CPUs or memory gets a node's share per GPU: 64 CPUs and
    # 489250 MB over 8 GPUs.
    assert (
        "PartitionName=batch Nodes=ALL Default=YES MaxTime=3-00:00:00 State=UP PriorityTier=1 "
        "DefCpuPerGPU=8 DefMemPerGPU=61156\n"
    ) in conf
    assert "PriorityTier=10 QOS=urgent" in conf
    for line in (
        "PreemptType=preempt/partition_prio",
        "PreemptMode=REQUEUE",
        "AccountingStorageType=accounting_storage/slurmdbd",
        # With slurm_accounts: jobs need an association; QoS and their limits hold.
        "AccountingStorageEnforce=associations,limits,qos,safe",
        # A QoS limits gres/gpu per user: the TRES must be tracked.
        "AccountingStorageTRES=gres/gpu",
        "GresTypes=gpu",
        "PriorityDecayHalfLife=7-0",
        "PriorityWeightFairshare=10000",
        "PriorityWeightAge=1000",
        "PriorityWeightQOS=5000",
        "PriorityWeightJobSize=0",
        "HealthCheckProgram=/usr/local/sbin/tacc-agent-healthcheck",
        "HealthCheckInterval=300",
        "HealthCheckNodeState=ANY",
    ):
        assert line in conf.splitlines()
    assert "NodeName=login1" not in conf and "NodeName=ctl1" not in conf


def test_gres_conf_names_each_gpu_device_once_for_identical_nodes(rendered):
    gres = (rendered[0] / "gpu01/gres.conf").read_text().splitlines()
    assert [line for line in gres if line.startswith("NodeName=")] == [
        "NodeName=gpu[01-08] Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-31",
        "NodeName=gpu[01-08] Name=gpu Type=a100 File=/dev/nvidia[4-7] Cores=32-63",
    ]
    assert len({p.read_bytes() for p in rendered[0].glob("*/gres.conf")}) == 1


def test_agent_settings_come_from_inventory(rendered):
    """Per node: its Slurm daemons, its GPUs (Gres), its RealMemory, its NFS mounts."""
    gpu = yaml.safe_load((rendered[0] / "gpu05/tacc-agent.yaml").read_text())
    assert gpu["services"] == ["munge", "slurmd"] and gpu["drain"] is True
    assert gpu["expected_gpus"] == 8 and gpu["real_memory_mb"] == 489250
    assert gpu["mounts"] == [{"path": "/shared", "fstype": "nfs4"}]
    controller = yaml.safe_load((rendered[0] / "ctl1/tacc-agent.yaml").read_text())
    assert controller["services"] == ["munge", "slurmctld", "slurmdbd"]
    assert controller["drain"] is False and controller["expected_gpus"] == 0
    assert controller["real_memory_mb"] == 0
    limited = yaml.safe_load((rendered[1] / "gpu03/tacc-agent.yaml").read_text())
    assert limited == yaml.safe_load((rendered[0] / "gpu03/tacc-agent.yaml").read_text())


@pytest.mark.security
def test_every_agent_serves_its_job_series_to_the_prometheus_that_scrapes_it(rendered):
    """Issue [18] point 3: the agents give the per-job series only to the allowed
    scrapers; by default the monitoring host's inventory address (ctl1, 10.10.0.10), which
    its Prometheus scrapes from, at the port the cluster DNS's SRV records name, with the
    scrapers' token (review point 5), read from files on both sides: never in the rendered
    files themselves."""
    full, _ = rendered
    dns = (full / "ctl1/root/etc/dnsmasq.d/tacc-cluster.conf").read_text()
    prometheus = yaml.safe_load((full / "ctl1/root/etc/prometheus/prometheus.yml").read_text())
    (agent_job,) = [job for job in prometheus["scrape_configs"] if job["job_name"] == "tacc_agent"]
    assert agent_job["dns_sd_configs"][0]["names"] == ["_tacc-agent._tcp.cluster.internal"]
    assert agent_job["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/etc/prometheus/tacc-agent-token",
    }
    configs = sorted(full.glob("*/root/etc/tacc-agent/config.yaml"))
    assert len(configs) == 10  # every host of the example inventory
    for path in configs:
        host = path.parents[3].name
        agent = yaml.safe_load(path.read_text())
        assert agent["metrics_job_scrapers"] == ["10.10.0.10"], host
        assert agent["metrics_jobs_public"] is False, host
        token_file = agent["metrics_job_token_file"]
        assert token_file == "/etc/tacc-agent/metrics-job-token", host  # noqa: S105 (a path)
        port = agent["metrics_port"]
        assert port < 1024, host
        assert f"srv-host=_tacc-agent._tcp.cluster.internal,{host}.cluster.internal,{port}" in dns


def test_the_agent_knows_whether_the_inventory_gives_its_node_rdma(rendered):
    """Issue [22] point 4: a job that falls back to TCP on a node of rdma_nodes (the
    example's GPU nodes) warns its owner; elsewhere TCP is the normal case."""
    full, _ = rendered
    declared = {
        path.parents[3].name: yaml.safe_load(path.read_text())["rdma_declared"]
        for path in full.glob("*/root/etc/tacc-agent/config.yaml")
    }
    assert {host for host, value in declared.items() if value} == {
        f"gpu0{n}" for n in range(1, 9)
    }, declared


def test_etc_hosts_is_rendered_next_to_them(rendered):
    """With a cluster DNS (the example's cluster_dns group) a node's hosts file names
    itself only: a node that joins rewrites no other node's copy."""
    full, limited = rendered
    hosts = (full / "ctl1/hosts").read_text().splitlines()
    assert "10.10.0.10\tctl1.cluster.internal\tctl1" in hosts
    assert not any("gpu08" in line for line in hosts)
    gpu = (full / "gpu08/hosts").read_text().splitlines()
    assert "10.10.1.8\tgpu08.cluster.internal\tgpu08" in gpu
    assert (limited / "gpu03/hosts").read_bytes() == (full / "gpu03/hosts").read_bytes()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    """The example inventory with mixed hardware: gpu03 and gpu07 have 4 GPUs, gpu06
    more memory, gpu02's address is out of step with its name; a partition lists nodes.
    Rendered for two hosts (--limit), which must agree."""
    inventory = tmp_path_factory.mktemp("inventory")
    shutil.copytree(ROOT / "inventory/example", inventory, dirs_exist_ok=True)
    hosts = yaml.safe_load((inventory / "hosts.yml").read_text())
    hosts["all"]["hosts"]["gpu02"]["ansible_host"] = "10.10.9.200"
    (inventory / "hosts.yml").write_text(yaml.safe_dump(hosts))
    for host in ("gpu03", "gpu07"):
        (inventory / f"host_vars/{host}.yml").write_text(
            'slurm_node_gres: ["gpu:a100:4"]\n'
            'slurm_node_gpu_cores: ["0-31", "0-31", "32-63", "32-63"]\n'
        )
    (inventory / "host_vars/gpu06.yml").write_text("slurm_node_memory_mb: 1030000\n")
    cluster = yaml.safe_load((inventory / "group_vars/all/cluster.yml").read_text())
    cluster["slurm_partitions"].append({"name": "small", "nodes": "gpu07,gpu03,gpu04"})
    (inventory / "group_vars/all/cluster.yml").write_text(yaml.safe_dump(cluster))
    out = tmp_path_factory.mktemp("mixed")
    render(out, "--limit", "ctl1,gpu07", *SLURM_ONLY, inventory=inventory)
    assert (out / "ctl1/slurm.conf").read_bytes() == (out / "gpu07/slurm.conf").read_bytes()
    return out / "ctl1/slurm.conf"


def test_nodes_with_the_same_hardware_share_a_line(mixed):
    lines = mixed.read_text().splitlines()
    assert [line for line in lines if line.startswith("NodeName=")] == [
        "NodeName=gpu[01-02,04-05,08] NodeAddr=10.10.1.1,10.10.9.200,10.10.1.[4-5,8] CPUs=64 "
        f"{TOPOLOGY} RealMemory=489250 Gres=gpu:a100:8 Features=a100,ib State=UNKNOWN",
        f"NodeName=gpu[03,07] NodeAddr=10.10.1.[3,7] CPUs=64 {TOPOLOGY} "
        "RealMemory=489250 Gres=gpu:a100:4 Features=a100,ib State=UNKNOWN",
        "NodeName=gpu06 NodeAddr=10.10.1.6 CPUs=64 Sockets=2 CoresPerSocket=32 ThreadsPerCore=1 "
        "RealMemory=978500 Gres=gpu:a100:8 Features=a100,ib State=UNKNOWN",
    ]
    # gpu03 and gpu07 could give 16 CPUs per GPU, gpu04 only 8: the partition's default
    # is what every node of it can give.
    small = next(line for line in lines if line.startswith("PartitionName=small "))
    assert small.startswith("PartitionName=small Nodes=gpu[03-04,07] Default=NO"), small
    assert small.endswith(" DefCpuPerGPU=8 DefMemPerGPU=61156"), small


def test_nodename_and_nodeaddr_expand_to_each_hosts_address(mixed):
    """Slurm pairs the i-th NodeName with the i-th NodeAddr of a line."""
    pairs: dict[str, str] = {}
    for line in mixed.read_text().splitlines():
        if line.startswith("NodeName="):
            fields = dict(field.split("=", 1) for field in line.split())
            names, addrs = expand(fields["NodeName"]), expand(fields["NodeAddr"])
            assert len(names) == len(addrs), line
            pairs.update(zip(names, addrs, strict=True))
    inventory = yaml.safe_load((ROOT / "inventory/example/hosts.yml").read_text())
    expected = {
        host: vars_["ansible_host"]
        for host, vars_ in inventory["all"]["hosts"].items()
        if host.startswith("gpu")
    }
    assert pairs == {**expected, "gpu02": "10.10.9.200"}


FOUR_GPU_CORES = ["0-31", "0-31", "32-63", "32-63"]


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """GPU sharing per node group: gpu01-04 shard their 8 A100s (default 4 shards each),
    gpu05-06 have 4 H100s under MPS, gpu07 shards with 2 per GPU and has an extra
    feature, gpu08 has two GPU types and no sharing; no accounts and no QoS GPU limit."""
    inventory = tmp_path_factory.mktemp("shared-inventory")
    shutil.copytree(ROOT / "inventory/example", inventory, dirs_exist_ok=True)
    host_vars = {
        **{f"gpu0{i}": {"slurm_gpu_sharing": "shard"} for i in range(1, 5)},
        **{
            f"gpu0{i}": {
                "slurm_gpu_sharing": "mps",
                "slurm_node_gres": ["gpu:h100:4"],
                "slurm_node_gpu_cores": FOUR_GPU_CORES,
            }
            for i in (5, 6)
        },
        "gpu07": {
            "slurm_gpu_sharing": "shard",
            "slurm_gpu_shards_per_gpu": 2,
            "slurm_node_features": ["ib", "nvme"],
        },
        "gpu08": {
            "slurm_node_gres": ["gpu:a100:2", "gpu:l40s:2"],
            "slurm_node_gpu_cores": FOUR_GPU_CORES,
        },
    }
    for host, values in host_vars.items():
        (inventory / f"host_vars/{host}.yml").write_text(yaml.safe_dump(values))
    cluster = yaml.safe_load((inventory / "group_vars/all/cluster.yml").read_text())
    cluster["slurm_accounts"] = []
    cluster["slurm_qos"] = [{"name": "urgent", "priority": 100}]
    (inventory / "group_vars/all/cluster.yml").write_text(yaml.safe_dump(cluster))
    out = tmp_path_factory.mktemp("shared")
    render(out, "--limit", "ctl1,gpu05", *SLURM_ONLY, inventory=inventory)
    assert (out / "ctl1/slurm.conf").read_bytes() == (out / "gpu05/slurm.conf").read_bytes()
    assert (out / "ctl1/gres.conf").read_bytes() == (out / "gpu05/gres.conf").read_bytes()
    return out / "ctl1"


def test_shared_gpus_add_shard_and_mps_gres_per_node(shared):
    lines = (shared / "slurm.conf").read_text().splitlines()
    assert [
        line.split(" CPUs=")[0].split(" NodeAddr=")[0] + " " + line.split(" RealMemory=")[1]
        for line in lines
        if line.startswith("NodeName=")
    ] == [
        "NodeName=gpu[01-04] 489250 Gres=gpu:a100:8,shard:a100:32 Features=a100,ib State=UNKNOWN",
        "NodeName=gpu[05-06] 489250 Gres=gpu:h100:4,mps:h100:400 Features=h100,ib State=UNKNOWN",
        "NodeName=gpu07 489250 Gres=gpu:a100:8,shard:a100:16 Features=a100,ib,nvme State=UNKNOWN",
        "NodeName=gpu08 489250 Gres=gpu:a100:2,gpu:l40s:2 Features=a100,l40s,ib State=UNKNOWN",
    ]
    assert "GresTypes=gpu,shard,mps" in lines
    # Every Gres type is tracked; no accounts: nothing enforced, so no association needed.
    assert "AccountingStorageTRES=gres/gpu,gres/shard,gres/mps" in lines
    assert not [line for line in lines if line.startswith("AccountingStorageEnforce")]


def test_gres_conf_counts_shares_and_numbers_devices_across_gpu_types(shared):
    lines = (shared / "gres.conf").read_text().splitlines()
    assert [line for line in lines if line.startswith("NodeName=")] == [
        "NodeName=gpu[01-04] Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-31",
        "NodeName=gpu[01-04] Name=gpu Type=a100 File=/dev/nvidia[4-7] Cores=32-63",
        "NodeName=gpu[01-04] Name=shard Type=a100 Count=32",
        "NodeName=gpu[05-06] Name=gpu Type=h100 File=/dev/nvidia[0-1] Cores=0-31",
        "NodeName=gpu[05-06] Name=gpu Type=h100 File=/dev/nvidia[2-3] Cores=32-63",
        "NodeName=gpu[05-06] Name=mps Type=h100 Count=400",
        "NodeName=gpu07 Name=gpu Type=a100 File=/dev/nvidia[0-3] Cores=0-31",
        "NodeName=gpu07 Name=gpu Type=a100 File=/dev/nvidia[4-7] Cores=32-63",
        "NodeName=gpu07 Name=shard Type=a100 Count=16",
        "NodeName=gpu08 Name=gpu Type=a100 File=/dev/nvidia[0-1] Cores=0-31",
        "NodeName=gpu08 Name=gpu Type=l40s File=/dev/nvidia[2-3] Cores=32-63",
    ]
