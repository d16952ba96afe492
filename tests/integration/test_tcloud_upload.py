"""Issue [4], delta upload against a real sshd (a lab node, root over SSH with the lab's
verified host key): only missing blobs are sent, every job gets its own hard-linked
immutable workdir, a cut upload resumes, a tampered blob is refused, and a changed or
unknown host key is refused. Runs in CI as root on its own lab (`tc`, 10.77.13.0/24).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tacc_lab.lab import resolve_config
from tcloud import upload as upload_module
from tcloud.compiler import compile_task
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.schema import load_task
from tcloud.ssh import run, session
from tests.integration.lab_helpers import lab_cli, node_sh, playbook

pytestmark = pytest.mark.lab

NAME = "tc"
SUBNET = "10.77.13.0/24"
NODE = "10.77.13.11"
USERDIR = "/root/tcloud-test"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    lab_cli(NAME, "down")
    inventory = tmp_path_factory.mktemp("tc") / "hosts.yml"
    proc = lab_cli(NAME, "up", "--nodes", "1", "--subnet", SUBNET, "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stderr
    playbook(inventory, "playbooks/agent.yml")  # the cluster side of the upload
    cfg = resolve_config(NAME, SUBNET, SUBNET)
    yield Cluster(
        name=NAME,
        host=NODE,
        user="root",
        key=str(cfg.ssh_key),
        known_hosts=str(cfg.known_hosts),
        userdir=USERDIR,
    )
    lab_cli(NAME, "down")


@pytest.fixture
def project(tmp_path) -> Path:
    (tmp_path / "src").mkdir()
    for i in range(20):
        (tmp_path / f"src/file{i}.py").write_text(f"value = {i}\n" * 100)
    (tmp_path / "big.bin").write_bytes(os.urandom(3 << 20))
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "tcloud.yaml").write_text("name: up\nrun: [./run.sh]\n")
    return tmp_path


def push(cluster: Cluster, project: Path):
    task = load_task(project / "tcloud.yaml")
    instruction = compile_task(task)
    with session(cluster) as client:
        return upload_module.upload(client, instruction, USERDIR), instruction


def remote(cluster: Cluster, *argv: str) -> str:
    with session(cluster) as client:
        rc, out, err = run(client, list(argv))
    assert rc == 0, err
    return out


def test_first_upload_sends_everything_then_only_the_change(lab, project):
    node_sh(NAME, "n1", f"rm -rf {USERDIR}")
    first, instruction = push(lab, project)
    assert first.blobs_sent == 23  # 20 sources, big.bin, run.sh, tcloud.yaml
    assert first.bytes_sent == sum(e.size for e in instruction.manifest.values())
    again, _ = push(lab, project)
    assert (again.blobs_sent, again.bytes_sent) == (0, 0)
    assert again.workdir != first.workdir  # its own workdir
    (project / "src/file3.py").write_text("changed = True\n")
    changed, _ = push(lab, project)
    assert changed.blobs_sent == 1 and changed.bytes_sent == len("changed = True\n")
    # The first job's tree is untouched by the resubmits.
    assert remote(lab, "cat", f"{first.workdir}/code/src/file3.py") == "value = 3\n" * 100


def test_workdir_is_hard_links_to_private_read_only_blobs(lab, project):
    result, instruction = push(lab, project)
    entry = instruction.manifest["code/run.sh"]
    out = remote(lab, "stat", "-c", "%h %a %i", f"{result.workdir}/code/run.sh",
                 f"{USERDIR}/store/{entry.sha256}-755")  # fmt: skip
    job_file, blob = out.splitlines()
    assert job_file == blob  # same inode: a hard link, no copy
    links, mode, _ = job_file.split()
    assert int(links) >= 2 and mode == "555"
    modes = remote(lab, "stat", "-c", "%a", USERDIR, f"{USERDIR}/store", result.workdir).split()
    assert modes == ["700", "700", "700"]


def test_cut_upload_leaves_no_blob_and_resumes(lab, project, monkeypatch):
    node_sh(NAME, "n1", f"rm -rf {USERDIR}")
    big = project / "big.bin"
    real_send = upload_module.send

    def cut_after_first_chunk(sftp, local, remote_path, offset, progress):
        if local == big:
            with local.open("rb") as source, sftp.open(remote_path, "ab") as target:
                source.seek(offset)
                target.write(source.read(upload_module.CHUNK))
            raise OSError("connection reset (simulated)")
        return real_send(sftp, local, remote_path, offset, progress)

    monkeypatch.setattr(upload_module, "send", cut_after_first_chunk)
    with pytest.raises(OSError, match="simulated"):
        push(lab, project)
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    blob = f"{instruction.manifest['code/big.bin'].sha256}-644"
    listing = remote(lab, "ls", f"{USERDIR}/store", f"{USERDIR}/store/.partial")
    assert listing.count(blob) == 1  # only in .partial, never visible in the store
    partial = int(remote(lab, "stat", "-c", "%s", f"{USERDIR}/store/.partial/{blob}"))
    assert partial == upload_module.CHUNK
    monkeypatch.setattr(upload_module, "send", real_send)
    stored = set(remote(lab, "ls", f"{USERDIR}/store").split())
    lacking = sum(
        e.size for e in instruction.manifest.values() if f"{e.sha256}-{e.mode:o}" not in stored
    )
    partials = remote(lab, "find", f"{USERDIR}/store/.partial", "-type", "f", "-printf", "%s\n")
    already = sum(int(size) for size in partials.split())
    resumed, _ = push(lab, project)
    # Exactly what was still missing, less what the cut run had already delivered
    # (files sent before the cut wait, complete, in .partial: nothing is sent again).
    assert resumed.bytes_sent == lacking - already
    assert remote(lab, "sha256sum", f"{resumed.workdir}/code/big.bin").split()[0] == blob[:64]


def test_tampered_blob_is_refused_and_resent(lab, project):
    node_sh(NAME, "n1", f"rm -rf {USERDIR}")
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    entry = instruction.manifest["code/src/file1.py"]
    blob = f"{entry.sha256}-644"
    bogus = "x" * entry.size  # the right size, so the client thinks it is complete
    node_sh(NAME, "n1", f"mkdir -p {USERDIR}/store/.partial && "
                        f"printf %s {bogus} > {USERDIR}/store/.partial/{blob}")  # fmt: skip
    with pytest.raises(TcloudError, match="failed verification"):
        push(lab, project)
    result, _ = push(lab, project)
    assert result.blobs_sent >= 1
    body = remote(lab, "cat", f"{result.workdir}/code/src/file1.py")
    assert body == "value = 1\n" * 100


def test_changed_host_key_is_refused(lab, tmp_path):
    # Another ed25519 key for the node's address: what a reinstalled or impersonated
    # host looks like.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")],
                   check=True)  # fmt: skip
    public = (tmp_path / "k.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{NODE} {public[0]} {public[1]}\n")
    cluster = Cluster(name=NAME, host=NODE, user="root", key=lab.key, known_hosts=str(known))
    with pytest.raises(TcloudError, match="HOST KEY MISMATCH"), session(cluster):
        pass


def test_unknown_host_is_refused_without_a_terminal(lab, tmp_path, monkeypatch):
    monkeypatch.setattr("tcloud.ssh.USER_KNOWN_HOSTS", tmp_path / "none")
    cluster = Cluster(name=NAME, host=NODE, user="root", key=lab.key,
                      known_hosts=str(tmp_path / "empty"))  # fmt: skip
    with pytest.raises(TcloudError, match=r"unknown host: .* SHA256:"), session(cluster):
        pass
