"""Issue [13] on the slurm lab: tasks in container images from the cluster registry.

The lab builds its base image itself (`tacc-lab up --container-image`: Debian bookworm
minbase with python3, mpi4py and OpenMPI, no sshd) and the image_registry role seeds it
into the registry on n1 as n1:5000/tacc/base:bookworm. Every rank runs its lines in it
with Charliecloud's ch-run, as the researcher.

Collected as part of test_slurm_cluster.py (which imports these tests), so they run on
its lab and its researchers alice and bob.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.integration.lab_helpers import lab_cli, node_sh, submit, wait_state
from tests.integration.labs import SLURM_LAB

IMAGE = "n1:5000/tacc/base:bookworm"
FINAL = ("COMPLETED", "FAILED", "CANCELLED")
PINNED = re.compile(r"^n1:5000/tacc/base:bookworm@sha256:[0-9a-f]{64}$")
# What a line prints about where it runs: the image has no sshd and carries the lab's
# marker file; the lab's nodes have sshd and no marker.
WHERE = (
    'echo "where host=$(hostname) uid=$(id -u) '
    "sshd=$(test -e /usr/sbin/sshd && echo yes || echo no) "
    "marker=$(cat /etc/tacc-image 2>/dev/null || echo none) "
    'os=$(. /etc/os-release && echo $ID-$VERSION_ID)"'
)


def image_task(
    root: Path, name: str, run: list[str], nodes: int = 2, image: str = IMAGE, **extra
) -> Path:
    root.mkdir()
    task = {
        "name": name,
        "image": image,
        "resources": {"nodes": nodes, "mem": "200M", "time": "5"},
        "run": run,
        **extra,
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def no_process(node: str, pattern: str) -> bool:
    table = node_sh(SLURM_LAB, node, "ps -eo args").stdout.splitlines()
    return not [line for line in table if pattern in line]


def uid_of(user: str) -> str:
    return node_sh(SLURM_LAB, "n2", f"id -u {user}").stdout.strip()


def finished(tcloud, job: str, seconds: int = 300) -> tuple[dict, str]:
    info = wait_state(tcloud, job, FINAL, seconds)
    return info, tcloud("logs", job).stdout


def test_c1_a_two_node_task_runs_inside_the_registry_image_on_both_nodes(alice, tmp_path):
    job = submit(alice, image_task(tmp_path / "t", "in-image", [WHERE]))
    info, log = finished(alice, job)
    assert info["state"] == "COMPLETED", (info, log[-4000:])
    lines = re.findall(r"^\[(n\d):\d+\] where (.*)$", log, re.M)
    assert sorted(host for host, _ in lines) == ["n2", "n3"], log
    uid = uid_of("alice")
    for _, line in lines:
        # Inside the image (no sshd, its marker), as alice: no root inside.
        assert "sshd=no" in line and "marker=tacc/base:bookworm" in line, log
        assert f"uid={uid}" in line and uid != "0", log
    # The node itself has sshd and no marker: the line did not run on the node's system.
    assert (
        node_sh(SLURM_LAB, "n2", "test -e /usr/sbin/sshd && test ! -e /etc/tacc-image").returncode
        == 0
    )
    # The instruction pinned the image to its digest; status says which bits ran.
    pinned = info["image"]["reference"]
    assert PINNED.match(pinned), info
    assert info["image"]["digest"] == pinned.rsplit("@", 1)[1], info


def test_c2_a_second_job_of_the_same_image_pulls_nothing(alice, tmp_path):
    first = submit(alice, image_task(tmp_path / "a", "pull-a", ["true"], nodes=1))
    info, log = finished(alice, first)
    assert info["state"] == "COMPLETED", (info, log[-3000:])
    second = submit(alice, image_task(tmp_path / "b", "pull-b", ["true"], nodes=1))
    info, log = finished(alice, second)
    assert info["state"] == "COMPLETED", (info, log[-3000:])
    assert re.search(r"image .*: reused", log), log
    assert not re.search(r"image .*: pulling", log), log
    listed = json.loads(alice("images", "--json").stdout)
    digests = [entry["digest"] for entry in listed]
    assert digests.count(info["image"]["digest"]) == 1, listed


def test_c3_the_mpi_example_runs_in_the_image_on_two_nodes_by_two_ranks(alice, tmp_path):
    project = tmp_path / "mpi"
    shutil.copytree(ROOT / "examples/mpi-allreduce", project)
    task = (project / "container.yaml").read_text()
    # The test's own proof that the ranks ran in the image: the first run line fails on
    # a node's own system (which has sshd).
    task = task.replace("run:\n", "run:\n  - test ! -e /usr/sbin/sshd\n", 1)
    (project / "container.yaml").write_text(task)
    job = submit(alice, project / "container.yaml")
    info, log = finished(alice, job)
    assert info["state"] == "COMPLETED", (info, log[-4000:])
    assert log.count("allreduce sum 10 (expected 10) OK") == 4, log
    fetched = alice("download", job, str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    result = json.loads((tmp_path / "got/outputs/allreduce.json").read_text())
    assert result["size"] == 4 and result["per_node"] == {"n2": 2, "n3": 2}, result


def test_c4_cancel_leaves_no_ch_run_and_no_program_on_any_node(alice, tmp_path):
    job = submit(alice, image_task(tmp_path / "t", "in-image-sleeper", ["sleep 989"]))
    wait_state(alice, job, ("RUNNING",), 180)
    deadline = time.monotonic() + 60
    while no_process("n2", "sleep 989") or no_process("n3", "sleep 989"):
        assert time.monotonic() < deadline, "the program never started in both containers"
        time.sleep(0.5)
    assert alice("cancel", job).returncode == 0
    wait_state(alice, job, ("CANCELLED",), 60)
    deadline = time.monotonic() + 30
    patterns = ("sleep 989", "ch-run")
    while not all(no_process(n, p) for n in ("n2", "n3") for p in patterns):
        assert time.monotonic() < deadline, "a container process survived cancel"
        time.sleep(1)


@pytest.mark.bad_input
def test_c5_an_image_that_does_not_exist_is_refused_at_submit_before_any_upload(alice, tmp_path):
    project = image_task(tmp_path / "t", "no-such-image", ["true"], nodes=1)
    text = (project / "tcloud.yaml").read_text().replace(IMAGE, "n1:5000/tacc/no-such:1")
    (project / "tcloud.yaml").write_text(text)
    unique = f"only in this task {time.time_ns()}\n".encode()
    (project / "data.txt").write_bytes(unique)
    jobs = "ls /shared/tcloud/alice/jobs | wc -l"
    jobs_before = node_sh(SLURM_LAB, "n1", jobs).stdout
    proc = alice("submit", str(project))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "n1:5000/tacc/no-such:1" in proc.stderr and "image" in proc.stderr, proc.stderr
    assert "unknown" in proc.stderr.lower(), proc.stderr  # the registry's own answer
    # Nothing was uploaded or made: the file's blob is nowhere in alice's store (nor in
    # its partial uploads), and she has no new job directory.
    blob = hashlib.sha256(unique).hexdigest()
    found = node_sh(SLURM_LAB, "n1", f"find /shared/tcloud/alice/store -name '{blob}*'")
    assert found.returncode == 0 and found.stdout.strip() == "", found.stdout
    assert node_sh(SLURM_LAB, "n1", jobs).stdout == jobs_before


@pytest.mark.security
def test_c6_in_the_container_a_researcher_is_themselves_and_sees_no_other_workspace(
    alice, bob, tmp_path
):
    line = (
        'echo "probe uid=$(id -u) listing=$(ls /shared/tcloud | tr "\\n" ,)'
        " bob=$(test -e /shared/tcloud/bob && echo visible || echo hidden)"
        ' image=$(touch /etc/tacc-probe 2>/dev/null && echo writable || echo read-only)"'
    )
    job = submit(alice, image_task(tmp_path / "t", "in-image-probe", [line], nodes=1))
    info, log = finished(alice, job)
    assert info["state"] == "COMPLETED", (info, log[-3000:])
    match = re.search(r"probe uid=(\d+) listing=(\S*) bob=(\w+) image=(\S+)", log)
    assert match, log
    assert match.group(1) == uid_of("alice"), log  # no root inside, and not anybody else
    assert "bob" not in match.group(2).split(","), log  # another workspace is not there
    assert match.group(3) == "hidden", log
    # The image is read-only inside: a job cannot change the cached image under the next.
    assert match.group(4) == "read-only", log


def test_c7_image_plus_requirements_runs_in_a_venv_on_the_images_python_and_reruns_alike(
    alice, tmp_path
):
    """Issue [24]: `image:` with `environment.requirements` builds a venv in the image,
    on its own Python (keyed by the image's digest too), first on the container's PATH
    in every rank; the rerun runs the same locked versions in the same image."""
    probe = (
        "python3 -c \"import numpy, sys; print('in', numpy.__version__, sys.prefix, "
        "open('/etc/tacc-image').read().strip())\""
    )
    project = image_task(
        tmp_path / "p", "image-venv", [probe], environment={"requirements": ["numpy"]}
    )
    job = submit(alice, project)
    info, log = finished(alice, job)
    assert info["state"] == "COMPLETED", log[-3000:]
    found = re.findall(r"^\[(n\d):\d\] in (\S+) (\S+) (\S+)$", log, re.M)
    assert len(found) == 2 and len({f[0] for f in found}) == 2, log[-3000:]
    version, prefix = found[0][1], found[0][2]
    assert all(f[1:3] == (version, prefix) for f in found), found  # one venv, both ranks
    assert all(f[3] != "none" for f in found), found  # in the image, not on the node
    assert prefix.startswith("/shared/tcloud/alice/envs/"), prefix
    environment = info["environment"]
    assert f"numpy=={version}" in environment["lock"], environment
    assert environment["image"] == info["image"]["reference"].rsplit(":", 1)[1], info
    again = alice("rerun", "--json", job)
    assert again.returncode == 0, again.stderr
    rerun_id = json.loads(again.stdout)["job_id"]
    rerun_info, rerun_log = finished(alice, rerun_id)
    assert rerun_info["state"] == "COMPLETED", rerun_log[-3000:]
    assert rerun_info["environment"]["lock"] == environment["lock"]
    assert rerun_info["image"]["reference"] == info["image"]["reference"]
    assert re.search(rf"^\[n\d:0\] in {re.escape(version)} ", rerun_log, re.M), rerun_log


PUBLIC = "nvcr.io/tacc-lab/debian:bookworm"  # the lab's stand-in (tacc_lab/public_registry.py)
PUBLIC_PATH = PUBLIC.split("/", 1)[1]
CACHE = "/var/lib/docker-registry-cache/nvcr.io/docker/registry/v2/repositories/tacc-lab/debian"


def registry_answers(url: str) -> bool:
    """Whether something answers HTTP at `url` from n1 (a 401 is an answer), asked
    directly (not through the lab's HTTP proxy, which answers for anything)."""
    probe = (
        "import sys, urllib.request, urllib.error\n"
        "opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))\n"
        "try: opener.open(sys.argv[1], timeout=3)\n"
        "except urllib.error.HTTPError: pass\n"
    )
    return node_sh(SLURM_LAB, "n1", f"python3 -c {shlex.quote(probe)} {url}").returncode == 0


def test_c8_a_public_image_comes_through_the_cache_and_the_next_user_from_it_alone(
    alice, bob, tmp_path
):
    """Issue [24] point 1. The site allows one public registry, nvcr.io, played by the
    lab's stand-in (a registry with token auth on n1:5080 that only the cache's account
    may read); the cache of it runs on the registry host (n1:5010).

    alice's two-node job names nvcr.io/... as in any task file: resolved and pulled
    through the cache (the nodes' registries.conf sends nvcr.io there; no node is ever
    told the upstream). Then the upstream is stopped: bob's job with the same image, and
    alice's rerun by digest, are served by the cache alone (how we know: nothing else
    answers for nvcr.io any more). A registry not on the list is refused at submit,
    naming the list."""
    started = lab_cli(SLURM_LAB, "public-registry", "start", timeout=600)
    assert started.returncode == 0, started.stderr
    address = node_sh(SLURM_LAB, "n1", "getent ahostsv4 n1 | head -1").stdout.split()[0]
    # The cache has been asking for the upstream since site.yml (it starts again every
    # 10 s until its upstream answers).
    deadline = time.monotonic() + 60
    while not registry_answers(f"http://{address}:5010/v2/") and time.monotonic() < deadline:
        time.sleep(2)
    assert registry_answers(f"http://{address}:5010/v2/")
    # The upstream wants a token, which only its account gets.
    anonymous = node_sh(
        SLURM_LAB,
        "n1",
        f"skopeo inspect --raw --tls-verify=false docker://{address}:5080/{PUBLIC_PATH}",
    )
    assert anonymous.returncode != 0 and "authentication required" in anonymous.stderr, anonymous
    first = submit(alice, image_task(tmp_path / "a", "public-a", [WHERE], image=PUBLIC))
    info, log = finished(alice, first)
    assert info["state"] == "COMPLETED", log[-3000:]
    assert info["image"]["reference"].startswith(f"{PUBLIC}@sha256:"), info["image"]
    lines = re.findall(r"^\[(n\d):\d+\] where (.*)$", log, re.M)
    assert sorted(host for host, _ in lines) == ["n2", "n3"], log
    assert all("marker=tacc/base:bookworm" in line for _, line in lines), log
    # Its own pull (another digest than the seeded image's, which alice has cached), which
    # came through the cache: the cache now holds the image.
    pulled = json.loads(alice("images", "--json").stdout)
    assert [i for i in pulled if i["reference"] == info["image"]["reference"]], pulled
    assert node_sh(SLURM_LAB, "n1", f"test -d {CACHE}/_manifests").returncode == 0
    # From here on the upstream is gone.
    stopped = lab_cli(SLURM_LAB, "public-registry", "stop")
    assert stopped.returncode == 0, stopped.stderr
    assert not registry_answers(f"http://{address}:5080/v2/")
    second = submit(bob, image_task(tmp_path / "b", "public-b", [WHERE], image=PUBLIC))
    bob_info, bob_log = finished(bob, second)
    assert bob_info["state"] == "COMPLETED", bob_log[-3000:]
    assert bob_info["image"]["reference"] == info["image"]["reference"]  # the same digest
    digest = info["image"]["reference"].rsplit("@", 1)[1]
    images = json.loads(bob("images", "--json").stdout)
    assert digest in [image["digest"] for image in images], images  # bob pulled it himself
    again = alice("rerun", "--json", first)
    assert again.returncode == 0, again.stderr
    rerun_info, rerun_log = finished(alice, json.loads(again.stdout)["job_id"])
    assert rerun_info["state"] == "COMPLETED", rerun_log[-3000:]
    assert rerun_info["image"]["reference"] == info["image"]["reference"]
    # No one on the cluster network can push into the cache (Distribution refuses it).
    push = node_sh(
        SLURM_LAB,
        "n1",
        "cd /tmp && runuser -u alice -- skopeo copy --quiet --src-tls-verify=false "
        f"--dest-tls-verify=false docker://{IMAGE} docker://{address}:5010/{PUBLIC_PATH}-x",
    )
    assert push.returncode != 0, push
    assert node_sh(SLURM_LAB, "n1", f"test ! -e {CACHE}/_manifests/tags/bookworm-x").returncode == 0
    # A registry the site does not list: refused at submit, naming the list.
    project = image_task(tmp_path / "q", "unlisted", ["true"], nodes=1, image="quay.io/org/tool:1")
    refused = alice("submit", str(project))
    assert refused.returncode == 3, (refused.stdout, refused.stderr)
    said = " ".join(refused.stderr.split())
    assert "the registry quay.io is not one this cluster takes images from" in said, said
    assert "it allows n1:5000, nvcr.io" in said and "Traceback" not in said, said
