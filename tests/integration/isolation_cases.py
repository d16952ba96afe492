"""Issue [10] on the slurm lab, in the production shape (n1 head, login1, n2/n3 compute):
researchers reach the separate login node, whose /shared is the NFS server's; a compute
node admits a researcher's SSH only while they have a job there (pam_slurm_adopt), root
always; one researcher does not see another's jobs (PrivateData); root on an NFS client
is nobody on /shared (root_squash, checked with a real NFS client, libnfs).

Collected as part of test_slurm_cluster.py (which imports these tests), on its lab.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tacc_lab.config import STATE_ROOT
from tacc_lab.demo import researcher_env
from tests.integration.lab_helpers import (
    lab_ssh_as,
    lab_status,
    node_address,
    node_sh,
    submit,
    wait_state,
)
from tests.integration.labs import SLURM_LAB

LAB_DIR = STATE_ROOT / SLURM_LAB


def address(node: str) -> str:
    return node_address(SLURM_LAB, node)


def ssh_as(user: str, node: str, command: str) -> subprocess.CompletedProcess:
    return lab_ssh_as(SLURM_LAB, user, node, command)


def sleeper(root: Path, node_count: int = 2) -> Path:
    root.mkdir()
    task = {
        "name": "sleeper",
        "resources": {"nodes": node_count, "mem": "50M", "time": "5"},
        "run": ["sleep 300"],
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


@pytest.mark.security
def test_p3_researchers_reach_the_separate_login_node_whose_shared_is_nfs(alice):
    """The lab has the production shape, and the login node mounts /shared (it is in
    nfs_clients, with nosuid,nodev): a workspace never lives on the login node's disk."""
    groups = {n["name"]: n["groups"] for n in lab_status(SLURM_LAB)["nodes"]}
    assert "login" in groups["login1"] and "slurm_compute" not in groups["login1"]
    assert "login" not in groups["n1"]
    assert "nfs_clients" in groups["login1"]
    config = Path(researcher_env(SLURM_LAB, "alice")["TCLOUD_CONFIG"]).read_text()
    assert address("login1") in config
    unit = node_sh(SLURM_LAB, "login1", "systemctl cat shared.mount").stdout
    assert "What=n1:/shared" in unit, unit
    options = next(line for line in unit.splitlines() if line.startswith("Options="))
    assert {"nosuid", "nodev"} <= set(options.removeprefix("Options=").split(",")), options
    # What tcloud wrote through login1 is on the server's /shared.
    assert node_sh(SLURM_LAB, "n1", "test -d /shared/tcloud/alice").returncode == 0


def no_job_left_on(user: str, node: str, seconds: float = 60) -> None:
    """Wait until Slurm shows none of user's jobs on node: a job an earlier case ended
    may still be completing there (CG), and pam_slurm_adopt admits its owner until then."""
    deadline = time.monotonic() + seconds
    script = f"squeue -h -u {user} -w {node} -o %i"
    while node_sh(SLURM_LAB, "login1", script).stdout.strip():
        assert time.monotonic() < deadline, f"{user} still has a job on {node}"
        time.sleep(1)


@pytest.mark.security
def test_p2_a_compute_node_admits_a_researcher_only_while_they_have_a_job_there(alice, tmp_path):
    no_job_left_on("alice", "n2")
    refused = ssh_as("alice", "n2", "hostname")
    assert refused.returncode != 0, refused.stdout
    assert ssh_as("alice", "login1", "hostname").stdout.strip() == "login1"
    assert node_sh(SLURM_LAB, "n2", "hostname").stdout.strip() == "n2"  # root: always
    job = submit(alice, sleeper(tmp_path / "sleeper"))
    try:
        wait_state(alice, job, ("RUNNING",), 120)
        admitted = ssh_as("alice", "n2", "hostname")
        assert admitted.returncode == 0, admitted.stderr
        assert admitted.stdout.strip() == "n2"
        assert ssh_as("bob", "n2", "hostname").returncode != 0  # alice's job, not bob's
    finally:
        alice("cancel", job)
    deadline = time.monotonic() + 60
    while ssh_as("alice", "n2", "true").returncode == 0:
        assert time.monotonic() < deadline, "still admitted after the job ended"
        time.sleep(2)


@pytest.mark.security
def test_p2_a_researcher_does_not_see_another_researchers_jobs(alice, tmp_path):
    job = submit(alice, sleeper(tmp_path / "sleeper", node_count=1))
    try:
        info = wait_state(alice, job, ("RUNNING",), 120)
        slurm_id = info["job_id"]
        mine = ssh_as("alice", "login1", "squeue -h -o %i")
        assert slurm_id in mine.stdout.split(), mine
        theirs = ssh_as("bob", "login1", "squeue -h -a -o %i")
        assert theirs.returncode == 0, theirs.stderr
        assert slurm_id not in theirs.stdout.split(), theirs.stdout
        shown = ssh_as("bob", "login1", f"scontrol show job {slurm_id}")
        assert "UserId=alice" not in shown.stdout, shown.stdout
    finally:
        alice("cancel", job)


@pytest.mark.security
def test_p1_root_on_an_nfs_client_is_nobody_on_shared():
    """A real NFS client (libnfs's nfs-cp, as root, AUTH_SYS uid 0) on a compute node
    cannot write into root's directories of the export: root is nobody there, so no
    setuid-root file can be planted in /shared nor root-owned files replaced."""
    get_client = "apt-get install -y -q libnfs-utils >/dev/null 2>&1; command -v nfs-cp"
    install = node_sh(SLURM_LAB, "n2", f"command -v nfs-cp || ({get_client})")
    assert install.returncode == 0, install.stdout + install.stderr
    # Names Ganesha has never seen (it caches directory entries; the lab writes /shared
    # behind its back, so the probe only goes through NFS).
    probe = f"/shared/tcloud/squash-probe-{uuid.uuid4().hex[:8]}"
    listing = node_sh(SLURM_LAB, "n2", "nfs-ls 'nfs://n1/shared/tcloud?version=4'")
    assert listing.returncode == 0, listing.stderr  # root may read: the export serves it
    copy = node_sh(
        SLURM_LAB,
        "n2",
        f"echo x > /root/probe && nfs-cp /root/probe 'nfs://n1{probe}?version=4&uid=0&gid=0'",
    )
    on_server = node_sh(SLURM_LAB, "n1", f"stat -c %U {probe}").stdout.strip()
    node_sh(SLURM_LAB, "n1", f"rm -f {probe}")
    # /shared/tcloud is root's, 0755: root squashed to nobody may not create in it.
    assert copy.returncode != 0 and "ACCESS" in copy.stderr, (copy.stderr, on_server)
    assert on_server == "", on_server


def libnfs_on(node: str) -> None:
    """libnfs-utils (nfs-ls, nfs-cp): a real NFS client that runs as any user."""
    get_client = "apt-get install -y -q libnfs-utils >/dev/null 2>&1; command -v nfs-cp"
    install = node_sh(SLURM_LAB, node, f"command -v nfs-cp || ({get_client})")
    assert install.returncode == 0, install.stdout + install.stderr


@pytest.mark.security
def test_p1_a_users_own_nfs_client_cannot_claim_another_uid(bob):
    """alice runs a userspace NFS client (libnfs) on the login node: its calls come from
    a port above 1023, so the export answers none of them, whatever uid they claim
    (NFSv4, and NFSv3 with its MOUNT call). bob's workspace is neither read nor written."""
    libnfs_on("login1")
    bob_dir = "/shared/tcloud/bob"
    plant = f"echo private > {bob_dir}/nfs-probe && chown 2002:2002 {bob_dir}/nfs-probe"
    node_sh(SLURM_LAB, "n1", f"install -d -o 2002 -g 2002 -m 0700 {bob_dir} && {plant}")
    before = node_sh(SLURM_LAB, "n1", f"ls -la --time-style=+%s {bob_dir}").stdout
    claim = "uid=2002&gid=2002"
    attempts = {
        "v4 list": f"nfs-ls 'nfs://n1{bob_dir}?{claim}&version=4'",
        "v3 list": f"nfs-ls 'nfs://n1{bob_dir}?{claim}&version=3'",
        "v4 write": f"echo forged > /tmp/forged-$$ && "
        f"nfs-cp /tmp/forged-$$ 'nfs://n1{bob_dir}/forged?{claim}&version=4'",
        "v4 read": f"nfs-cat 'nfs://n1{bob_dir}/nfs-probe?{claim}&version=4'",
    }
    for what, command in attempts.items():
        result = ssh_as("alice", "login1", command)
        assert result.returncode != 0, (what, result.stdout, result.stderr)
        assert "private" not in result.stdout and "nfs-probe" not in result.stdout, what
    after = node_sh(SLURM_LAB, "n1", f"ls -la --time-style=+%s {bob_dir}").stdout
    assert after == before, (before, after)
    # The same client run by root on a client host binds a port below 1024 and is served
    # (root is squashed to nobody, test_p1_root_on_an_nfs_client_is_nobody_on_shared).
    served = node_sh(SLURM_LAB, "login1", "nfs-ls 'nfs://n1/shared/tcloud?version=4'")
    assert served.returncode == 0, served.stderr


@pytest.mark.security
def test_p7_a_researchers_home_is_private_on_every_node(bob):
    """bob cannot list or read alice's home on the login node, nor on a compute node
    (the common role makes every cluster user's home 0700)."""
    notes = "/home/alice/notes.txt"
    node_sh(
        SLURM_LAB, "login1", f"echo mine > {notes} && chown alice: {notes} && chmod 0644 {notes}"
    )
    read = ssh_as("bob", "login1", "cat /home/alice/notes.txt; ls /home/alice")
    assert read.returncode != 0 and "mine" not in read.stdout, (read.stdout, read.stderr)
    assert "Permission denied" in read.stderr, read.stderr
    for node in ("login1", "n1", "n2", "n3"):
        modes = node_sh(SLURM_LAB, node, "stat -c '%n %a' /home/alice /home/bob").stdout.split()
        assert modes == ["/home/alice", "700", "/home/bob", "700"], (node, modes)
