"""Issue [3] on a real lab: nfs_server/nfs_client, rdma, nvidia_gpu and smartnic_firmware
converge (first run changes, second run and --check change nothing), do the real thing
where the lab allows it (NFS-Ganesha serving /shared over NFS, proven from another node
with libnfs), and meet FAKE hardware at the tool boundary (tacc-lab fake-hw): n2 has 8
H100s, 2 NVSwitches, a ConnectX-6 Dx and a RoCE device; n3 has none and is skipped with a
message. Runs in CI as root, on the factory's `hw` lab (tests/integration/labs.py: HW,
10.77.11.0/24, n2's host_vars), the one lab that converges from the bare image.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.slurm.gres import indices
from tacc_lab.demo import researcher_env
from tacc_lab.fakehw import DRIVER_VERSIONS, FAKE_HEADERS_PACKAGE
from tests.conftest import run_cli
from tests.integration.lab_helpers import (
    ansible_tool,
    changed_tasks,
    node_ok,
    node_sh,
    playbook,
    submit,
    wait_state,
)
from tests.integration.labs import MITOGEN

pytestmark = pytest.mark.lab

NAME = "hw"
SUBNET = "10.77.11.0/24"
SERVER = "10.77.11.11"
ROLES = (
    "nfs_server",
    "nfs_client",
    "rdma",
    "nvidia_gpu",
    "smartnic_firmware",
    "directory_server",
    "identity",
    "backup",
)


ENDED = ("COMPLETED", "FAILED", "CANCELLED")


def sh(node: str, script: str) -> str:
    return node_ok(NAME, node, script)


def researcher(cwd: Path):
    """alice's tcloud on this lab (a function of argv), run in `cwd`."""
    env = researcher_env(NAME, "alice")

    def tcloud_cli(*argv: str):
        return run_cli("tcloud", *argv, env=env, cwd=cwd)

    return tcloud_cli


@pytest.fixture(scope="module")
def runs(site_from_nothing) -> dict:
    """site.yml's install-from-nothing runs (site_from_nothing.py)."""
    return site_from_nothing


@pytest.mark.parametrize("role", ROLES)
def test_role_changes_first_then_nothing_and_check_mode_is_clean(runs, role):
    assert runs["first_roles"].get(role, 0) > 0, runs["first_roles"]
    assert runs["second_roles"].get(role, 0) == 0, runs["second_roles"]
    assert runs["check_roles"].get(role, 0) == 0, runs["check_roles"]


@pytest.mark.fault
def test_a_killed_run_is_finished_by_the_next_one_which_changes_only_what_was_left(runs):
    killed, rerun = changed_tasks(runs["killed"]), changed_tasks(runs["rerun"])
    assert killed and rerun, (len(killed), len(rerun))
    # Nothing the killed run did is done again...
    assert killed & rerun == set(), sorted(killed & rerun)
    # ...and the restarts its slurm.conf change notified, never run, are not lost: every
    # daemon runs a configuration at least as new as the file.
    assert "RUNNING HANDLER [slurm" not in runs["killed"]
    # (Configless: the controller's slurm.conf is the one every slurmd fetches.)
    written = sh("n1", "stat -c %Y /etc/slurm/slurm.conf")
    for node, daemon in (("n1", "slurmctld"), ("n2", "slurmd"), ("n3", "slurmd")):
        started = sh(node, f"systemctl show --timestamp=unix -P ActiveEnterTimestamp {daemon}")
        assert started.startswith("@"), (node, daemon, started)
        assert int(started.strip().lstrip("@")) >= int(written), (node, daemon)


def test_whole_site_second_run_and_check_mode_change_nothing(runs):
    assert set(runs["second"].values()) == {0}, runs["second"]
    assert set(runs["check"].values()) == {0}, runs["check"]


def test_nodes_without_hardware_say_what_was_skipped(runs):
    first = runs["first"]
    assert "rdma: no RDMA device under /opt/tacc-fake-hw/sys/class/infiniband on n3" in first
    assert "nvidia_gpu: no NVIDIA GPU (PCI vendor 10de) on n3" in first
    assert "smartnic_firmware: no NVIDIA/Mellanox networking device on n3" in first


def test_ganesha_serves_shared_over_nfs_to_another_node(runs):
    sh("n2", "DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnfs-utils >/dev/null")
    # World-writable: root on n2 is nobody on the export (root_squash, the default).
    sh("n1", "install -d -m 1777 /shared/nfs-proof && echo served-by-n1 > /shared/nfs-proof/hello")
    url = f"nfs://{SERVER}/shared/nfs-proof"
    listing = node_sh(NAME, "n2", f"nfs-ls {url}")
    if listing.returncode != 0:  # what the server had registered, for the CI log
        rpc = node_sh(NAME, "n1", "rpcinfo -p; tail -20 /var/log/ganesha/ganesha.log")
        pytest.fail(f"nfs-ls: {listing.stderr}\n--- n1 ---\n{rpc.stdout}{rpc.stderr}")
    assert "hello" in listing.stdout
    assert sh("n2", f"nfs-cat {url}/hello").strip() == "served-by-n1"
    sh("n2", f"nfs-cp /etc/hostname '{url}/from-n2?version=4'")
    # Read back on the server's local disk: the write went over NFSv4 to n1.
    assert sh("n1", "cat /shared/nfs-proof/from-n2").strip() == "n2"
    # Root squashed: Ganesha's anonymous uid (not root's 0) owns what root wrote.
    assert sh("n1", "stat -c %u /shared/nfs-proof/from-n2").strip() != "0"
    assert "active" in sh("n1", "systemctl is-active nfs-ganesha")


def test_clients_get_enabled_mount_units(runs):
    for node in ("n2", "n3"):
        unit = sh(node, "cat /etc/systemd/system/shared.mount")
        assert "What=n1:/shared" in unit
        assert "Options=vers=4.2,hard,proto=tcp,timeo=600,retrans=2,nconnect=8" in unit
        assert unit.rstrip().count(",nosuid,nodev") == 1, unit
        assert sh(node, "systemctl is-enabled shared.mount").strip() == "enabled"


def test_rdma_userspace_memlock_and_roce_defaults(runs):
    for node in ("n2", "n3"):
        sh(node, "command -v ibv_devinfo ibstat ib_write_bw")
        assert "rdma_ucm" in sh(node, "cat /etc/modules-load.d/rdma.conf")
        assert "LimitMEMLOCK=infinity" in sh(
            node,
            "systemctl show slurmd -p LimitMEMLOCK --value | sed s/^/LimitMEMLOCK=/;"
            " cat /etc/systemd/system/slurmd.service.d/50-rdma-memlock.conf",
        )
        assert "memlock    unlimited" in sh(node, "cat /etc/security/limits.d/91-rdma.conf")
    port = "/opt/tacc-fake-hw/config/rdma_cm/mlx5_0/ports/1"
    assert sh("n2", f"cat {port}/default_roce_mode").strip() == "RoCE v2"
    assert sh("n2", f"cat {port}/default_roce_tos").strip() == "106"
    assert node_sh(NAME, "n3", "test -e /etc/tacc/roce.conf").returncode != 0


def test_gpu_node_runs_driver_services_and_offers_its_gres(runs):
    fact = sh("n2", "cat /etc/ansible/facts.d/nvidia_gpu.fact")
    assert '"gres": "gpu:h100:8"' in fact
    assert '"nvswitch_count": 2' in fact
    assert sh("n2", "systemctl is-active nvidia-persistenced nvidia-fabricmanager").split() == [
        "active",
        "active",
    ]
    # NVIDIA's repository shape (n2 has NVSwitches): the branch's meta package and fabric
    # manager at the version the inventory holds, the FAKE kernel headers for DKMS,
    # nouveau blacklisted.
    installed = sh("n2", "dpkg-query -W -f '${Package} ${Version}\\n'").splitlines()
    for package in ("cuda-drivers-550", "nvidia-fabricmanager-550", "nvidia-kernel-dkms"):
        assert f"{package} {DRIVER_VERSIONS[0]}-1" in installed, installed
    assert f"{FAKE_HEADERS_PACKAGE} 1.0" in installed
    hold = sh("n2", "cat /etc/apt/preferences.d/tacc-nvidia-driver.pref")
    assert f"Pin: version {DRIVER_VERSIONS[0]}-*\nPin-Priority: 1001" in hold, hold
    assert "blacklist nouveau" in sh("n2", "cat /etc/modprobe.d/tacc-blacklist-nouveau.conf")
    # The driver's user-space files for containers (/usr/local/nvidia in a GPU job's image):
    # the fake driver ships nvidia-smi and no libcuda, so bin/ has it and lib64/ is empty.
    driver_dir = "/usr/local/lib/tacc-nvidia"
    assert sh("n2", f"ls {driver_dir}/bin {driver_dir}/lib64").split() == [
        f"{driver_dir}/bin:",
        "nvidia-smi",
        f"{driver_dir}/lib64:",
    ]
    inodes = sh("n2", f"stat -c %i /usr/bin/nvidia-smi {driver_dir}/bin/nvidia-smi").split()
    assert inodes[0] == inodes[1]  # a hard link, not a copy
    assert node_sh(NAME, "n3", f"test -e {driver_dir}").returncode != 0  # no GPU, no directory
    sinfo = sh("n1", "sinfo -h -N -o '%N %t %G'")
    # slurmd reports the shards typed like the GPUs they share (and, since gres.conf
    # binds them to cores, the sockets they sit near: "(S:0-1)").
    line = next(line for line in sinfo.splitlines() if line.startswith("n2 "))
    assert re.fullmatch(r"n2 idle gpu:h100:8(\(S:0-1\))?,shard:h100:32(\(S:0-1\))?", line), line
    assert "n3 idle (null)" in sinfo
    sh("n1", "timeout 60 srun -w n2 --gres=gpu:h100:2 true")
    too_many = node_sh(NAME, "n1", "timeout 60 srun --gres=gpu:h100:9 true")
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


def job_state(job: str) -> str:
    return sh("n1", f"squeue -h -j {job} -o %T").strip()


def test_gpu_shards_let_jobs_share_n2s_gpus(runs):
    """Issue [8] item 2: n2 (slurm_gpu_sharing: shard) offers 32 shards; a job can take
    one, and two jobs holding shards run on n2 at the same time. Slurm 22.05 takes one
    job's shards from a single GPU (there is no MULTIPLE_SHARING_GRES_PJ before 23.02), so
    each job asks for 2 of a GPU's 4 shards."""
    assert "shard:h100:32" in sh("n1", "scontrol show node n2")
    # Configless: n2 runs the controller's gres.conf, fetched into /run/slurm/conf.
    assert "Name=shard Type=h100 Count=32" in sh("n2", "cat /run/slurm/conf/gres.conf")
    sh("n1", "timeout 60 srun -w n2 --gres=shard:1 true")
    jobs = [
        sh(
            "n1",
            "cd /tmp && sbatch --parsable -w n2 --gres=shard:2 -t 5 -o /tmp/shard-%j.out "
            "--wrap 'echo GPU=$CUDA_VISIBLE_DEVICES; sleep 60'",
        ).strip()
        for _ in range(2)
    ]
    try:
        both = ""
        for _ in range(60):
            states = [job_state(job) for job in jobs]
            if states == ["RUNNING", "RUNNING"]:
                both = sh("n1", f"squeue -h -j {','.join(jobs)} -o '%i %T %N %b'")
                break
            sh("n1", "sleep 1")
        assert both, f"the two shard jobs never ran together: {states}"
        assert both.count(" RUNNING n2 ") == 2, both
        # Slurm 22.05 (Debian 12) leaves CUDA_VISIBLE_DEVICES unset for shard jobs;
        # later releases set it as for a GPU (gres.shtml, Sharding). Either is accepted.
        for job in jobs:
            out = sh(
                "n2",
                f"for i in $(seq 20); do test -s /tmp/shard-{job}.out && break;"
                f" sleep 1; done; cat /tmp/shard-{job}.out",
            )
            assert re.fullmatch(r"GPU=\d?", out.strip()), out
    finally:
        sh("n1", f"scancel {' '.join(jobs)}")


def test_gpu_type_features_pick_nodes_by_constraint(runs):
    """Issue [8] item 7: n2's GPU type (h100, from slurm_node_gres) is a node feature, so
    --constraint picks among acceptable GPU types; a type no node has is refused."""
    assert "AvailableFeatures=h100" in sh("n1", "scontrol show node n2")
    assert sh("n1", "timeout 60 srun --constraint=h100 hostname").strip() == "n2"
    # A constraint naming a feature no node has is refused as a whole, so the gpu_types
    # plug-in names only the types the partition has.
    refused = node_sh(NAME, "n1", "cd /tmp && timeout 60 sbatch --constraint=a100 --wrap true")
    assert refused.returncode != 0, refused.stdout
    assert "Invalid feature specification" in refused.stderr


def test_tcloud_task_asking_for_half_an_h100_gets_shards_on_n2(runs, tmp_path):
    """Issue [8] items 2 and 7 end to end: the compiler marks the fraction, the
    scheduling plug-ins map it to shards and the GPU type to a constraint, and the job
    record names the type the node had."""
    alice = researcher(tmp_path)
    line = 'echo "GPU=${CUDA_VISIBLE_DEVICES:-} type=$TACC_GPU_TYPE on $(hostname)"'
    (tmp_path / "tcloud.yaml").write_text(
        json.dumps(
            {
                "name": "half",
                "run": [line],
                "resources": {
                    "gpus_per_node": 0.5,
                    "gpu_types": ["a100", "h100"],
                    "mem": "50M",
                    "time": "5",
                },
            }
        )
    )
    proc = alice("submit", "--json", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["plugins"]["gpu_share"] == (
        "0.5 GPU -> 2 of 4 shards of one GPU "
        "(as Slurm shards nothing limits its GPU memory or compute)"
    ), answer
    assert (
        answer["plugins"]["gpu_types"] == "constraint h100 (no a100 node in partition 'batch')"
    ), answer
    job = answer["job_id"]
    info = wait_state(alice, job, ENDED)
    assert info["state"] == "COMPLETED", info
    assert info["plugins"]["gpu_types"] == "h100", info  # the type n2 had
    log = alice("logs", job).stdout
    assert re.search(r"\[n2:0\] GPU=\d? type=h100 on n2", log), log  # 22.05: see above


def slurm_job(job: str) -> str:
    """`scontrol show -d job` of a job: its CPUs, memory and, per node, the CPU_IDs and
    GPU indexes (IDX) it holds."""
    return sh("n1", f"scontrol show -d job {job}")


def field(text: str, name: str) -> str:
    match = re.search(rf"(?:^|[\s,=]){re.escape(name)}=([^\s,]+)", text)
    assert match, f"no {name}= in {text}"
    return match.group(1)


def gpu_tasks(alice, tmp_path: Path, gpus: int, count: int) -> list[str]:
    """`count` tcloud tasks asking for `gpus` GPUs and nothing else (no cpus, no mem),
    once all are RUNNING."""
    task = {"name": f"gpus{gpus}", "run": ["sleep 300"], "resources": {"gpus_per_node": gpus}}
    (tmp_path / "tcloud.yaml").write_text(json.dumps(task))
    jobs = [submit(alice, tmp_path) for _ in range(count)]
    for job in jobs:
        wait_state(alice, job, ("RUNNING",))
    return jobs


def test_a_gpu_task_gets_cpus_and_memory_per_gpu_on_its_gpus_sockets(runs, tmp_path):
    """Issue [22] points 1 and 2: n2 is a FAKE two-socket node, GPUs 0-3 near cores 0-7
    and 4-7 near cores 8-15 (its inventory, checked by the nvidia_gpu role against
    `nvidia-smi topo -m`), written as gres.conf Cores=. A task naming only
    `gpus_per_node: 8` gets the partition's DefCpuPerGPU and DefMemPerGPU for each GPU
    (16 CPUs, not 1; 8 x the memory, not 4G); two naming 4 GPUs run side by side, each
    on the cores of the socket its GPUs sit near."""
    conf = sh("n2", "cat /run/slurm/conf/gres.conf")
    assert "NodeName=n2 Name=gpu Type=h100 File=/dev/nvidia[0-3] Cores=0-7\n" in conf, conf
    assert "NodeName=n2 Name=gpu Type=h100 File=/dev/nvidia[4-7] Cores=8-15\n" in conf, conf
    node = sh("n1", "scontrol show node n2 -o")
    assert [field(node, name) for name in ("Sockets", "CoresPerSocket", "CPUTot")] == [
        "2",
        "8",
        "16",
    ]
    alice = researcher(tmp_path)
    jobs = gpu_tasks(alice, tmp_path, 8, 1)
    try:
        shown = slurm_job(jobs[0])
        print(f"scontrol show -d job {jobs[0]} (8 GPUs):\n{shown}")
        partition = sh("n1", f"scontrol show partition {field(shown, 'Partition')} -o")
        per_gpu = field(partition, "DefCpuPerGPU"), field(partition, "DefMemPerGPU")
        assert (per_gpu[0], field(shown, "NumCPUs")) == ("2", "16"), shown
        assert field(shown, "CPU_IDs") == "0-15" and "gpu:h100:8(IDX:0-7)" in shown, shown
        assert field(shown, "Mem") == str(8 * int(per_gpu[1])), (per_gpu, shown)
    finally:
        alice("cancel", *jobs)
    wait_state(alice, jobs[0], ENDED)
    jobs = gpu_tasks(alice, tmp_path, 4, 2)
    try:
        sockets = []
        for job in jobs:
            shown = slurm_job(job)
            print(f"scontrol show -d job {job} (4 GPUs):\n{shown}")
            gpus = indices(re.search(r"gpu:h100:4\(IDX:([\d,-]+)\)", shown).group(1))
            cpus = indices(field(shown, "CPU_IDs"))
            socket = 0 if gpus == {0, 1, 2, 3} else 1 if gpus == {4, 5, 6, 7} else None
            assert socket is not None and cpus == {*range(8 * socket, 8 * socket + 8)}, shown
            sockets.append(socket)
        assert sorted(sockets) == [0, 1]
    finally:
        alice("cancel", *jobs)
    for job in jobs:
        wait_state(alice, job, ENDED)


UCX_PROGRAM = (
    'python3 -c "from mpi4py import MPI; import os; c = MPI.COMM_WORLD; '
    "print('pml', os.environ['OMPI_MCA_pml'], 'sum', c.allreduce(c.rank + 1), flush=True)\""
)


def test_an_mpi_job_where_every_node_has_rdma_runs_over_ucx(runs, tmp_path):
    """Issue [22] point 4: n2's RoCE port is active, so an MPI task there (2 ranks, srun
    and PMIx) runs over UCX: both ranks select OpenMPI's ucx PML (which fails MPI_Init
    when it cannot start), though the node's own OpenMPI defaults leave UCX off."""
    assert "pml = ^ucx" in sh("n2", "cat /etc/openmpi/openmpi-mca-params.conf")
    task = {
        "name": "ucx",
        "resources": {"processes_per_node": 2, "gpus_per_node": 1, "mem": "300M", "time": "5"},
        "environment": {"requirements": [], "env": {"OMPI_MCA_pml_base_verbose": "10"}},
        "runtime": {"launcher": "srun", "mpi": "pmix"},
        "run": [UCX_PROGRAM],
    }
    (tmp_path / "tcloud.yaml").write_text(json.dumps(task))
    alice = researcher(tmp_path)
    job = submit(alice, tmp_path)
    info = wait_state(alice, job, ENDED, 180)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED", (info, log[-3000:])
    assert "[n2:0] tacc: transport rdma: active RDMA ports on every node (n2: 1)" in log, log
    for rank in (0, 1):
        assert re.search(rf"\[n2:{rank}\] \[n2:\d+\] select: component ucx selected", log), log
        assert f"[n2:{rank}] pml ucx sum 3" in log, log


def gpu_role_on_n2(runs: dict, **variables: object):
    """The nvidia_gpu role alone on n2 with extra variables (a bad inventory value)."""
    extra = {"tacc_test_hosts": "n2", "tacc_test_role": "nvidia_gpu", **variables}
    return ansible_tool(
        "ansible-playbook",
        runs["inventory"],
        "tests/integration/playbooks/one_role.yml",
        "-e",
        json.dumps(extra),
        timeout=300,
        strategy=MITOGEN,
    )


@pytest.mark.bad_input
def test_gpu_cores_unlike_the_topology_are_refused_with_the_line_to_use(runs):
    """Issue [22] point 2: an inventory whose slurm_node_gpu_cores differ from what
    `nvidia-smi topo -m` says (here: every GPU near every core) fails the nvidia_gpu
    role on n2, naming what was found and the line to put in host_vars."""
    proc = gpu_role_on_n2(runs, slurm_node_gpu_cores=["0-15"] * 8)
    assert proc.returncode == 2, proc.stdout[-3000:]
    wanted = json.dumps(["0-7"] * 4 + ["8-15"] * 4)
    said = " ".join(proc.stdout.split())  # the YAML callback folds long messages
    assert f"put slurm_node_gpu_cores: {wanted} in host_vars/n2.yml" in said, proc.stdout


@pytest.mark.fault
def test_a_task_that_asks_for_rdma_fails_with_the_reason_where_a_node_has_none(runs, tmp_path):
    """Issue [22] point 4: n2 has an active RoCE port, n3 none; `transport: rdma` across
    both does not quietly run over TCP: the job FAILS, tcloud status names n3, and its
    program never ran."""
    alice = researcher(tmp_path)
    task = {
        "name": "needs-rdma",
        "run": ["echo the program ran"],
        "resources": {"nodes": 2, "mem": "50M", "time": "5"},
        "runtime": {"transport": "rdma"},
    }
    (tmp_path / "tcloud.yaml").write_text(json.dumps(task))
    job = submit(alice, tmp_path)
    info = wait_state(alice, job, ENDED)
    assert info["state"] == "FAILED", info
    assert info["reason"].startswith("transport: rdma: no active RDMA port on n3"), info
    text = alice("status", job).stdout
    assert "reason: transport: rdma: no active RDMA port on n3" in text, text
    log = alice("logs", job).stdout
    assert "the program ran" not in log and "transport: rdma: no active RDMA port" in log, log


def test_mlxconfig_settings_are_set_for_next_boot(runs):
    config = sh("n2", "mlxconfig -d 0000:3b:00.0 q SRIOV_EN NUM_OF_VFS")
    assert "True(1)" in config and "8" in config
    log = sh("n2", "cat /var/log/tacc-fake-hw/burns.log")
    assert log.count(" set ") == 1, log  # once, in the first run
    assert '"reset_pending": true' in sh("n2", "cat /etc/ansible/facts.d/smartnic.fact")


# As root on the node: every series. The port is the role's default (AgentConfig's).
METRICS_URL = f"http://127.0.0.1:{AgentConfig().metrics_port}/metrics"
SCRAPE = (
    f"python3 -c \"import urllib.request as u; print(u.urlopen('{METRICS_URL}').read().decode())\""
)


def test_agent_sees_the_fake_gpus_and_rdma_port_and_exports_their_figures(runs):
    """Issue [6] at the FAKE hardware boundary: n2's GPUs (expected 8, from its Gres) and
    its RoCE port pass the checks and show up in the facts file and /metrics; n3 has
    neither, and says so."""
    report = json.loads(sh("n2", "tacc-agent check --json --no-slurm"))
    checks = {check["check"]: check for check in report["checks"]}
    assert (checks["gpu"]["status"], checks["gpu"]["detail"]) == ("ok", "8 GPU(s)")
    assert (checks["rdma"]["status"], checks["rdma"]["detail"]) == ("ok", "1 port(s) active")
    facts = json.loads(sh("n2", "cat /run/tacc-agent/facts.json"))
    assert facts["gpu"] == {"count": 8} and facts["rdma"] == {"active_ports": 1}
    metrics = sh("n2", SCRAPE).splitlines()
    assert len([m for m in metrics if m.startswith("tacc_agent_gpu_power_watts{")]) == 8
    assert "tacc_agent_healthy 1.0" in metrics and "tacc_agent_rdma_ports_active 1.0" in metrics
    bare = {
        c["check"]: c["status"]
        for c in json.loads(sh("n3", "tacc-agent check --json --no-slurm"))["checks"]
    }
    assert bare["gpu"] == "absent" and bare["rdma"] == "absent"


@pytest.mark.bad_input
def test_a_driver_version_that_is_no_version_is_refused_by_name(runs):
    """Issue [22] point 3: nvidia_gpu_driver_version must be what nvidia-smi prints."""
    proc = gpu_role_on_n2(runs, nvidia_gpu_driver_version="latest")
    assert proc.returncode == 2, proc.stdout[-3000:]
    said = " ".join(proc.stdout.split())
    assert 'n2: nvidia_gpu_driver_version "latest" is not a driver version' in said, said
    assert "n2: the NVIDIA driver needs a reboot" not in said  # stopped before any change


BOOTED = "cut -d' ' -f22 /proc/1/stat"  # a lab node's init start time: new at each boot


def test_a_driver_upgrade_reboots_its_node_alone_and_the_job_elsewhere_runs_on(runs):
    """Issue [22] point 3: the inventory holds n2's driver at a newer version whose module
    needs a reboot (FAKE: the new nvidia-smi reports NVML's version mismatch until then).
    The rolling play's driver action leaves n3 alone (no GPU: not even drained)
    while alice's job runs on n3, drains n2, brings its packages to the version (held by
    apt preferences), reboots it because the driver says so, accepts it and resumes it.
    A second roll finds nothing to do."""
    inventory = runs["inventory"]
    host_vars = inventory.parent / "host_vars/n2.yml"
    new = DRIVER_VERSIONS[1]
    boot = sh("n2", BOOTED)
    job = sh(
        "n1",
        "cd /tmp && runuser -u alice -- sbatch --parsable -w n3 -t 10 -o /dev/null "
        "--wrap 'sleep 600'",
    ).strip()
    try:
        wait_for_state = sh(
            "n1",
            f"for i in $(seq 60); do s=$(squeue -h -j {job} -o %T); "
            f'[ "$s" = RUNNING ] && break; sleep 1; done; echo $s',
        )
        assert wait_for_state.strip() == "RUNNING"
        started = sh("n1", f"squeue -h -j {job} -o %S")
        host_vars.write_text(host_vars.read_text() + f'nvidia_gpu_driver_version: "{new}"\n')
        run, changed = playbook(inventory, "playbooks/rolling.yml", "-e", "rolling_action=driver")
        said = " ".join(run.stdout.split())
        assert "n3: no NVIDIA GPU; not rolled" in said, said
        assert f"n2: replace cuda-drivers-550 {DRIVER_VERSIONS[0]}-1 with {new}" in said, said
        assert "Driver/library version mismatch" in said, said  # why it rebooted
        assert changed["n3"] == 0 and changed["n2"] > 0
        assert sh("n2", BOOTED) != boot  # rebooted for real
        versions = sh("n2", "nvidia-smi --query-gpu=driver_version --format=csv,noheader")
        assert set(versions.split()) == {new}
        assert f"cuda-drivers-550 {new}-1" in sh(
            "n2", "dpkg-query -W -f '${Package} ${Version}\\n'"
        )
        assert sh("n1", "sinfo -h -N -n n2 -o %t").strip() == "idle"  # accepted, resumed
        # n3 was never drained, and the job there runs on from where it started.
        assert sh("n1", f"squeue -h -j {job} -o '%T %S'").split() == ["RUNNING", started.strip()]
        assert "rolling" not in sh("n1", "sacctmgr -n show event nodes=n3 format=reason%40 || true")
        again, changed = playbook(
            inventory, "playbooks/rolling.yml", "--limit", "n2", "-e", "rolling_action=driver"
        )
        assert f"n2: nothing: driver {new}; not rolled" in " ".join(again.stdout.split())
        assert changed["n2"] == 0
    finally:
        sh("n1", f"scancel {job}")


# Last: it gives n3 a FAKE L40S (the tests above prove n3 has no GPU).
from tests.integration.hw_research_cases import (  # noqa: E402, F401  (issue [16]: allox)
    test_r4_allox_waits_for_the_faster_type_and_sends_the_other_job_to_the_free_one,
)


def test_a_quarter_gpu_on_an_mps_node_gets_the_limits_of_its_share(runs, tmp_path):
    """Issue [22] point 6, after the allox case gave n3 a FAKE L40S shared by CUDA MPS
    (slurm_gpu_sharing: mps): 0.25 of a GPU is served as 25 of n3's 100 MPS shares, and
    the job's process gets a quarter of the GPU's threads and memory (46068 MiB) as its
    MPS client limits, over the whole GPU its own environment asked for."""
    alice = researcher(tmp_path)
    task = {
        "name": "quarter",
        "resources": {"gpus_per_node": 0.25, "mem": "50M", "time": "5"},
        "environment": {"env": {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}},
        "run": ["env | grep -E '^(CUDA_MPS|TACC_GPU_SHARE)' | sort"],
    }
    (tmp_path / "tcloud.yaml").write_text(json.dumps(task))
    proc = alice("submit", "--json", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["plugins"]["gpu_share"].startswith("0.25 GPU -> 25 of 100 MPS shares"), answer
    info = wait_state(alice, answer["job_id"], ENDED)
    log = alice("logs", answer["job_id"]).stdout
    assert info["state"] == "COMPLETED", (info, log)
    assert "[n3:0] CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\n" in log, log
    assert "[n3:0] CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=11517M\n" in log, log
    assert "[n3:0] TACC_GPU_SHARE=0.25" in log, log
    # n3's driver came from Debian's shape of the FAKE repository (nvidia_gpu_driver_source).
    installed = sh("n3", "dpkg-query -W -f '${Package} ${Version}\\n'")
    assert f"nvidia-driver {DRIVER_VERSIONS[0]}-1" in installed and "cuda-drivers" not in installed
    # The FAKE driver ships no MPS daemon: the job's notes say the limits bind nothing.
    status = alice("status", answer["job_id"]).stdout
    assert "no CUDA MPS daemon answers on this node: these limits bind nothing" in status, status
