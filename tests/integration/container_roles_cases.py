"""Issue [13], operations side, on the slurm lab (`tacc-lab up --container-image`): the
image_registry role seeded the lab's archive into n1's registry with its own digest,
pushing it again changes nothing, and the container_runtime role's tools work as a
researcher on a node: a rootless pull, unpack and `ch-run` of the image.

Collected by test_slurm_cluster.py (which imports these tests), on its lab.
"""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.integration.lab_helpers import node_ok
from tests.integration.labs import SLURM_LAB

LAB = SLURM_LAB  # a module setting, so the cases can run on another lab by hand
SEED_DIR = "/var/lib/tacc-image-seed"


def lab_vars(inventory: Path) -> dict:
    return yaml.safe_load(inventory.read_text())["all"]["vars"]


def seeded(inventory: Path) -> tuple[Path, str]:
    """The archive the inventory seeds and the name it is served as."""
    (entry,) = lab_vars(inventory)["image_registry_seed"]
    return Path(entry["archive"]), entry["name"]


def archive_digest(archive: Path) -> str:
    raw = subprocess.run(
        ["skopeo", "inspect", "--raw", f"oci-archive:{archive}"],
        capture_output=True,
        check=True,
        timeout=120,
    ).stdout
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def sh(node: str, script: str) -> str:
    return node_ok(LAB, node, script)


@pytest.mark.lab
def test_the_registry_serves_the_seeded_archive_by_its_digest(cluster):
    archive, name = seeded(cluster)
    registry = lab_vars(cluster)["tacc_image_registry"]
    served = sh("n2", f"skopeo inspect --format '{{{{.Digest}}}}' docker://{registry}/{name}")
    assert served.strip() == archive_digest(archive)
    # The nodes reach it over plain HTTP because the inventory says so, and only it and
    # the caches beside it on the same host (issue [24]: nvcr.io's, n1:5010).
    conf = sh("n2", "cat /etc/containers/registries.conf.d/50-tacc.conf")
    assert f'location = "{registry}"\ninsecure = true' in conf
    host = registry.rsplit(":", 1)[0]
    caches = [f"{host}:{u['port']}" for u in lab_vars(cluster)["tacc_image_upstreams"]]
    assert caches == ["n1:5010"]
    assert 'prefix = "nvcr.io"\nlocation = "n1:5010"\ninsecure = true' in conf
    assert conf.count("insecure = true") == 1 + len(caches)


def seeded_copy(name: str) -> str:
    """Where the role copies the archive seeded as `name` on the registry host."""
    return f"{SEED_DIR}/{hashlib.sha256(name.encode()).hexdigest()}.oci.tar"


@pytest.mark.lab
def test_pushing_the_seed_again_changes_nothing(cluster):
    archive, name = seeded(cluster)
    settings = lab_vars(cluster)
    seed = [
        f"{SEED_DIR}/image_seed.py",
        "--registry",
        settings["tacc_image_registry"],
        "--seed-registry",
        "127.0.0.1:5001",
        "--seed-command",
        "/usr/bin/docker-registry",
        "--seed-config",
        "/etc/docker/registry/seed.yml",
        "--seed-user",
        "docker-registry",
    ]
    out = sh("n1", shlex.join(["python3", *seed, "--", seeded_copy(name), name]))
    assert out.splitlines() == [f"present {name} {archive_digest(archive)}", "ok"]


@pytest.mark.lab
@pytest.mark.security
def test_a_researcher_cannot_push_into_the_cluster_registry(cluster):
    """The registry is read-only to the cluster network: alice replacing the seeded tag
    (everyone's next submit would pin her digest and run her code as them) or filling the
    registry's disk with a new repository is refused, and the served digest is unchanged.
    Nothing writable listens on n1 between seeds."""
    archive, name = seeded(cluster)
    registry = lab_vars(cluster)["tacc_image_registry"]
    target = f"docker://{registry}/{name}"
    digest = archive_digest(archive)
    # Another manifest for the same image (converted to Docker v2s2): a new digest.
    script = f"""
skopeo copy --quiet --format v2s2 {shlex.quote(target)} {shlex.quote(target)} 2>&1
echo "replace=$?"
skopeo copy --quiet {shlex.quote(target)} {shlex.quote(f"docker://{registry}/alice/fill:x")} 2>&1
echo "new=$?"
"""
    out = sh("n2", shlex.join(["runuser", "-u", "alice", "--", "sh", "-c", script]))
    assert "replace=1" in out.splitlines(), out
    assert "new=1" in out.splitlines(), out
    assert out.count("StatusCode: 405") == 2, out
    served = sh("n2", f"skopeo inspect --format '{{{{.Digest}}}}' {shlex.quote(target)}")
    assert served.strip() == digest
    # Only the read-only instance listens, on the cluster address: nothing on the
    # loopback, nothing on the seeding port.
    address = yaml.safe_load(cluster.read_text())["all"]["hosts"]["n1"]["ansible_host"]
    ports = [line.split()[3] for line in sh("n1", "ss -Hltn").splitlines()]
    assert [port for port in ports if port.endswith((":5000", ":5001"))] == [f"{address}:5000"]


@pytest.mark.lab
def test_a_researcher_pulls_unpacks_and_runs_the_image_rootless(cluster):
    """skopeo by digest, umoci unpack --rootless, ch-run: the files and the process are
    the researcher's, and the marker shows it is the image, not the node."""
    archive, name = seeded(cluster)
    registry = lab_vars(cluster)["tacc_image_registry"]
    ref = f"{registry}/{name.split(':')[0]}@{archive_digest(archive)}"
    script = f"""set -e
work=$(mktemp -d); cd "$work"
skopeo copy --quiet {shlex.quote("docker://" + ref)} "oci:$work/oci:img"
umoci unpack --rootless --image "$work/oci:img" "$work/bundle" >/dev/null
echo "owner=$(stat -c %U "$work/bundle/rootfs/etc/os-release")"
echo "marker=$(ch-run "$work/bundle/rootfs" -- cat /etc/tacc-image)"
echo "uid=$(ch-run "$work/bundle/rootfs" -- id -u) me=$(id -u)"
echo "node_marker=$(cat /etc/tacc-image 2>/dev/null || echo none)"
rm -rf "$work"
"""
    out = sh("login1", shlex.join(["runuser", "-u", "alice", "--", "sh", "-c", script]))
    facts = dict(line.split("=", 1) for line in out.split() if "=" in line)
    assert facts["owner"] == "alice"
    assert facts["marker"] == name
    assert facts["uid"] == facts["me"] != "0"
    assert facts["node_marker"] == "none"
