"""Issue [4], delta upload against a real sshd (a lab node, root over SSH with the lab's
verified host key): only missing blobs are sent, every job gets its own hard-linked
immutable workdir, a cut upload resumes, a tampered blob is refused, and a changed or
unknown host key is refused. Runs in CI as root on the factory's one-node lab with the
agent (tests/integration/labs.py: AGENT_NODE, shared with test_tcloud_mux.py).
Issue [7]'s bad-input cases that need the cluster side are at the end.
"""

from __future__ import annotations

import os
import subprocess
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from tacc_lab.lab import resolve_config
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transfer import files, upload_stream
from tcloud.transfer import upload as upload_module
from tcloud.transfer.upload_stream import blob_frames
from tcloud.transport.ssh import run, session
from tests.conftest import run_cli
from tests.integration.lab_helpers import node_sh
from tests.integration.labs import AGENT_NODE

pytestmark = pytest.mark.lab

NAME = AGENT_NODE.name
NODE = AGENT_NODE.address("n1")
USERDIR = "/root/tcloud-test"


@pytest.fixture(scope="module")
def lab(shaped_lab):
    cfg = resolve_config(NAME, AGENT_NODE.subnet, AGENT_NODE.subnet)
    return Cluster(
        name=NAME,
        host=NODE,
        user="root",
        key=str(cfg.ssh_key),
        known_hosts=str(cfg.known_hosts),
        userdir=USERDIR,
    )


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
    out = remote(
        lab,
        "stat",
        "-c",
        "%h %a %i",
        f"{result.workdir}/code/run.sh",
        f"{USERDIR}/store/{entry.sha256}-755",
    )
    job_file, blob = out.splitlines()
    assert job_file == blob  # same inode: a hard link, no copy
    links, mode, _ = job_file.split()
    assert int(links) >= 2 and mode == "555"
    modes = remote(lab, "stat", "-c", "%a", USERDIR, f"{USERDIR}/store", result.workdir).split()
    assert modes == ["700", "700", "700"]


def test_cut_upload_leaves_no_blob_and_resumes(lab, project, monkeypatch):
    node_sh(NAME, "n1", f"rm -rf {USERDIR}")
    big = project / "big.bin"
    real_frames = upload_module.frames

    def cut_after_first_chunk(blobs, write, progress):
        """The stream as tcloud writes it, cut one chunk into big.bin."""
        for blob in blobs:
            if blob.source == big:
                write(blob.header())
                with big.open("rb") as source:
                    source.seek(blob.offset)
                    write(source.read(upload_stream.CHUNK))
                raise OSError("connection reset (simulated)")
            blob_frames(blob, write, progress)
        raise AssertionError("big.bin was not among the missing blobs")

    monkeypatch.setattr(upload_module, "frames", cut_after_first_chunk)
    with pytest.raises(TcloudError, match=r"the upload stopped \(connection reset \(simulated\)\)"):
        push(lab, project)
    instruction = compile_task(load_task(project / "tcloud.yaml"))
    blob = f"{instruction.manifest['code/big.bin'].sha256}-644"
    listing = remote(lab, "ls", f"{USERDIR}/store", f"{USERDIR}/store/.partial")
    assert listing.count(blob) == 1  # only in .partial, never visible in the store
    # The upload's own partial file: <blob>.<random> (two uploads never share one).
    partial = int(
        remote(lab, "find", f"{USERDIR}/store/.partial", "-name", f"{blob}.*", "-printf", "%s")
    )
    # What reached the agent of the one chunk sent before the cut (sshd drops what it
    # still buffered when the channel closes): kept, and the rest is all the next run sends.
    assert 0 < partial <= upload_stream.CHUNK
    monkeypatch.setattr(upload_module, "frames", real_frames)
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
    node_sh(
        NAME,
        "n1",
        f"mkdir -p {USERDIR}/store/.partial && printf %s {bogus} > {USERDIR}/store/.partial/{blob}",
    )
    with pytest.raises(TcloudError, match="failed verification"):
        push(lab, project)
    result, _ = push(lab, project)
    assert result.blobs_sent >= 1
    body = remote(lab, "cat", f"{result.workdir}/code/src/file1.py")
    assert body == "value = 1\n" * 100


def test_changed_host_key_is_refused(lab, tmp_path):
    # Another ed25519 key for the node's address: what a reinstalled or impersonated
    # host looks like.
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True
    )
    public = (tmp_path / "k.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"{NODE} {public[0]} {public[1]}\n")
    cluster = Cluster(name=NAME, host=NODE, user="root", key=lab.key, known_hosts=str(known))
    with pytest.raises(TcloudError, match="HOST KEY MISMATCH"), session(cluster):
        pass


def test_unknown_host_is_refused_without_a_terminal(lab, tmp_path, monkeypatch):
    monkeypatch.setattr("tcloud.transport.ssh.USER_KNOWN_HOSTS", tmp_path / "none")
    cluster = Cluster(
        name=NAME, host=NODE, user="root", key=lab.key, known_hosts=str(tmp_path / "empty")
    )
    with pytest.raises(TcloudError, match=r"unknown host: .* SHA256:"), session(cluster):
        pass


# --- issue [7]: bad input against the real cluster side ------------------------------


@pytest.fixture
def cli(lab, tmp_path):
    """The tcloud console script configured for the lab node (its verified host key)."""
    config = tmp_path / "tcloud-config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "current": NAME,
                "clusters": {
                    NAME: {
                        "host": lab.host,
                        "user": lab.user,
                        "key": lab.key,
                        "known_hosts": lab.known_hosts,
                        "userdir": USERDIR,
                    }
                },
            }
        )
    )
    (tmp_path / "home").mkdir()
    env = {
        "TCLOUD_CONFIG": str(config),
        "TCLOUD_CLUSTER": NAME,
        "HOME": str(tmp_path / "home"),
        "TCLOUD_CACHE_DIR": str(tmp_path / "cache"),
    }

    def tcloud(*argv: str) -> subprocess.CompletedProcess:
        return run_cli("tcloud", *argv, env=env, cwd=tmp_path, timeout=300)

    return tcloud


def userdir_tree() -> list[str]:
    """Everything under the user's cluster directory (and that it exists or not)."""
    return node_sh(NAME, "n1", f"find {USERDIR} 2>&1 | sort").stdout.splitlines()


def bad_project(root: Path, kind: str) -> Path:
    root.mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "tcloud.yaml").write_text("name: bad\nrun: [python3 train.py]\n")
    if kind == "escaping-symlink":
        (root / "key").symlink_to("/etc/passwd")
    elif kind == "huge-file":
        with (root / "model.ckpt").open("wb") as handle:
            handle.truncate(3 << 30)  # sparse: no disk used
    elif kind == "bad-name":
        (root / "tcloud.yaml").write_text("name: 'bad; touch /tmp/pwned'\nrun: [x]\n")
    elif kind == "non-utf8-name":
        (root / os.fsdecode(b"caf\xe9.txt")).write_text("x\n")
    elif kind == "agent-owned-sbatch-option":
        (root / "tcloud.yaml").write_text(
            "name: bad\nrun: [x]\nresources: {sbatch: {output: /tmp/x}}\n"
        )
    return root


REFUSED = {
    "escaping-symlink": "key: code: symlink to /etc/passwd, outside",
    "huge-file": "model.ckpt: code: 3.0 GiB is over the limit of 2G",
    "bad-name": "name: expected a name of letters, digits, _.-",
    "non-utf8-name": "caf\\xe9.txt: code: file name is not UTF-8",
    "agent-owned-sbatch-option": "resources.sbatch.output: expected an option the agent leaves "
    "to the task: sbatch option 'output' cannot be set by a task (the agent sets --output)",
}


@pytest.mark.bad_input
def test_refused_submits_leave_nothing_on_the_cluster(lab, cli, tmp_path):
    assert cli("ls").returncode == 0  # the CLI reaches the node: refusals are not that
    before = userdir_tree()
    for kind, message in REFUSED.items():
        proc = cli("submit", str(bad_project(tmp_path / kind, kind)))
        assert proc.returncode == 3, (kind, proc.stderr)
        assert message in proc.stderr and "Traceback" not in proc.stderr, (kind, proc.stderr)
    assert userdir_tree() == before  # no job directory, no blob, no partial blob
    assert node_sh(NAME, "n1", "ls /tmp/pwned").returncode != 0


@pytest.mark.bad_input
def test_traversal_is_refused_and_download_stays_in_its_directory(lab, cli, tmp_path):
    (tmp_path / "notes.txt").write_text("notes\n")
    for argv, message in (
        (["cat", "../../../etc/shadow"], "outside your cluster directory"),
        (["ls", "/etc"], "outside your cluster directory"),
        (["upload", "notes.txt", "../escaped.txt"], "outside your cluster directory"),
        (["download", "../../etc", "dest"], "not a job id"),
    ):
        proc = cli(*argv)
        assert proc.returncode == 2 and message in proc.stderr, (argv, proc.stderr)  # usage
        assert "Traceback" not in proc.stderr
    assert node_sh(NAME, "n1", f"ls {USERDIR}/escaped.txt /root/escaped.txt").returncode != 0
    # A job's outputs holding links out of it: only the plain file comes down.
    workdir = f"{USERDIR}/jobs/bad-input-1"
    node_sh(
        NAME,
        "n1",
        f"mkdir -p {workdir}/outputs/sub {workdir}/logs && "
        f"echo ok > {workdir}/outputs/ok.txt && "
        f"ln -sfn /etc/shadow {workdir}/outputs/shadow && "
        f"ln -sfn /etc {workdir}/outputs/sub/etc && "
        f"echo log > {workdir}/logs/job.log",
    )
    dest = tmp_path / "download" / "dest"
    with session(lab) as client, closing(client.open_sftp()) as sftp:
        assert files.download(sftp, workdir, dest) == 2
    found = sorted(str(p.relative_to(tmp_path / "download")) for p in dest.parent.rglob("*"))
    assert found == [
        "dest",
        "dest/logs",
        "dest/logs/job.log",
        "dest/outputs",
        "dest/outputs/ok.txt",
        "dest/outputs/sub",
    ]
    # A name the cluster cannot give as UTF-8 is named, not a crash.
    node_sh(NAME, "n1", f"touch {workdir}/outputs/$(printf 'caf\\351')")
    with (
        session(lab) as client,
        closing(client.open_sftp()) as sftp,
        pytest.raises(TcloudError, match="not UTF-8"),
    ):
        files.download(sftp, workdir, tmp_path / "again")
    node_sh(NAME, "n1", f"rm -rf {workdir}")


@pytest.mark.bad_input
def test_upload_names_with_metacharacters_land_verbatim_and_escaping_trees_are_refused(
    lab, cli, tmp_path
):
    tree = tmp_path / "tree"
    tree.mkdir()
    odd = "a b;$(touch pwned)`id`.txt"
    (tree / odd).write_text("odd\n")
    (tree / "données-π.csv").write_text("utf8\n")
    proc = cli("upload", str(tree), "bad-input-tree")
    assert proc.returncode == 0, proc.stderr
    listing = node_sh(NAME, "n1", f"ls {USERDIR}/files/bad-input-tree").stdout.splitlines()
    assert sorted(listing) == sorted([odd, "données-π.csv"])
    assert node_sh(NAME, "n1", f"ls {USERDIR}/files/bad-input-tree/pwned pwned").returncode != 0
    (tree / "hostkey").symlink_to("/etc/passwd")
    before = userdir_tree()
    proc = cli("upload", str(tree), "bad-input-tree-2")
    assert proc.returncode == 2, proc.stderr
    assert "hostkey: upload: symlink to /etc/passwd, outside" in proc.stderr
    assert userdir_tree() == before
    node_sh(NAME, "n1", f"rm -rf {USERDIR}/files/bad-input-tree")
