"""A task's image from `Cluster.submit` through the real `tacc-agent` (its session,
`image resolve`, store and submit; tests/unit/client/test_sdk.py's harness, fake Slurm) down to
a skopeo on the agent's PATH that serves one manifest and refuses other references as
skopeo does: the job's instruction holds the reference pinned to the manifest's digest;
a reference the registry does not know is refused on the task's `image:` line with the
registry's answer, and nothing reaches the store."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from tcloud import Cluster
from tcloud.errors import TaskFileError
from tests.unit.client.test_sdk import FakeCluster

REFERENCE = "n1:5000/tacc/base:bookworm"
MISSING = "n1:5000/tacc/nope:1"
MANIFEST = b'{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json"}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
# What skopeo 1.9 writes for a tag the registry does not have (its logrus line).
UNKNOWN = (
    'time="2026-11-24T11:00:00Z" level=fatal msg="Error parsing image name '
    '\\"docker://n1:5000/tacc/nope:1\\": reading manifest 1 in n1:5000/tacc/nope: '
    'manifest unknown: manifest unknown"'
)


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    """test_sdk's cluster, its agent with a skopeo that knows REFERENCE only."""
    cluster = FakeCluster(tmp_path, monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "manifest.json").write_bytes(MANIFEST)
    skopeo = bin_dir / "skopeo"
    skopeo.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tmp_path / "skopeo.calls"}\n'
        f'if [ "$3" = "docker://{REFERENCE}" ]; then exec cat {tmp_path / "manifest.json"}; fi\n'
        f"echo '{UNKNOWN}' >&2\nexit 1\n"
    )
    skopeo.chmod(0o755)
    cluster.env["PATH"] = f"{bin_dir}{os.pathsep}{cluster.env['PATH']}"
    return cluster


def requests(fake: FakeCluster) -> list[list[str]]:
    """The verbs asked of the agent's session (not the session's own start)."""
    return [verb for verb in fake.verbs() if verb != ["session"]]


def project(root: Path, image: str) -> Path:
    root.mkdir(parents=True)
    (root / "tcloud.yaml").write_text(f"name: t\nrun: [cat /etc/os-release]\nimage: {image}\n")
    (root / "train.py").write_text("print('hi')\n")
    return root


def test_the_submitted_instruction_holds_the_image_pinned_by_the_agent(fake, tmp_path):
    with Cluster() as cluster:
        job = cluster.submit(project(tmp_path / "p", REFERENCE))
    instruction = json.loads((Path(job.submission.workdir) / "instruction.json").read_text())
    assert instruction["task"]["image"] == f"{REFERENCE}@{DIGEST}"
    verbs = requests(fake)
    assert verbs[0] == ["image", "resolve", REFERENCE]
    assert [verb[:2] for verb in verbs].count(["image", "resolve"]) == 1
    assert (tmp_path / "skopeo.calls").read_text().split() == [
        "inspect",
        "--raw",
        f"docker://{REFERENCE}",
    ]


def test_a_reference_the_registry_does_not_know_is_refused_before_any_upload(fake, tmp_path):
    task = project(tmp_path / "p", MISSING)
    with Cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(task)
    assert str(refused.value) == (
        f"{task}/tcloud.yaml:3:8: image: the cluster cannot resolve {MISSING}: the registry "
        "answered: reading manifest 1 in n1:5000/tacc/nope: manifest unknown: manifest unknown"
    )
    assert requests(fake) == [["image", "resolve", MISSING]]  # no store: nothing uploaded
    assert not (fake.user_dir / "store").exists() or not any((fake.user_dir / "store").iterdir())
    assert fake.slurm.calls("sbatch") == []
