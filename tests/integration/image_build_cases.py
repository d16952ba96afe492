"""Issue [13] on the slurm lab: images built on the cluster from a Containerfile in the task.

`image: {build: env/Containerfile}`: tcloud pins the FROM image at submit and computes the
build's key (its steps and the files COPY reads); the batch step builds it once per key
and user, under a lock, with Charliecloud (RUN in a user namespace, as the researcher
outside), and every rank runs in it like in a pulled image.

Collected as part of test_slurm_cluster.py (which imports these tests), so they run on
its lab and its researchers alice and bob.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.integration.containers_cases import IMAGE, finished, no_process, uid_of
from tests.integration.lab_helpers import node_sh, submit, wait_state
from tests.integration.labs import SLURM_LAB

BUILD_FILE = f"""\
# the lab's base image, with a greeting, a data file and a note of who ran RUN
FROM {IMAGE}
ARG GREETING=hello
ENV GREETING=${{GREETING}}-from-build
WORKDIR /opt/app
COPY data/ /opt/app/data/
RUN echo "built as $(id -u), shared=$(ls -A /shared 2>/dev/null | wc -l)" > built.txt \\
 && python3 -c "import numpy" && echo numpy >> built.txt
CMD ["ignored"]
"""
INSIDE = (
    'echo "inbuild host=$(hostname) uid=$(id -u) greet=$GREETING '
    'built=$(head -n1 /opt/app/built.txt | tr " " _) data=$(cat /opt/app/data/a.txt) '
    'sshd=$(test -e /usr/sbin/sshd && echo yes || echo no)"'
)
IMAGES_DIR = "/shared/tcloud/alice/images"


def build_task(
    root: Path,
    name: str,
    run: list[str],
    nodes: int = 1,
    data: str = "one",
    build_file: str = BUILD_FILE,
) -> Path:
    (root / "env/data").mkdir(parents=True)
    (root / "env/Containerfile").write_text(build_file)
    (root / "env/data/a.txt").write_text(data + "\n")
    (root / "train.txt").write_text(f"not in the build: {name}\n")
    task = {
        "name": name,
        "image": {"build": "env/Containerfile"},
        "resources": {"nodes": nodes, "mem": "200M", "time": "5"},
        "run": run,
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def leftovers() -> str:
    """Unfinished builds or pulls in alice's image cache."""
    return node_sh(
        SLURM_LAB, "n1", f"ls -A {IMAGES_DIR} | grep '^\\.build-\\|^\\.pull-' || true"
    ).stdout


def test_b1_a_two_node_task_runs_in_an_image_built_from_its_containerfile(alice, tmp_path):
    data = f"data-{time.time_ns()}"  # a new key: this lab has not built it yet
    job = submit(alice, build_task(tmp_path / "a", "built-a", [INSIDE], nodes=2, data=data))
    info, log = finished(alice, job, 600)
    assert info["state"] == "COMPLETED", (info, log[-4000:])
    assert re.search(r"image build env/Containerfile [0-9a-f]{12}: built", log), log
    lines = re.findall(r"^\[(n\d):\d+\] inbuild (.*)$", log, re.M)
    assert sorted(host for host, _ in lines) == ["n2", "n3"], log
    uid = uid_of("alice")
    for _, line in lines:
        # ENV with the ARG's default, the COPY'd file, RUN's output; no sshd: the image.
        assert "greet=hello-from-build " in line and f"data={data} sshd=no" in line, log
        # RUN ran as 0 in a user namespace (the researcher outside) and saw no /shared.
        assert "built=built_as_0,_shared=0" in line, log
        assert f"uid={uid}" in line, log  # the ranks run as alice, not as root
    built = info["image"]
    assert built["build"]["file"] == "env/Containerfile", info
    assert built["build"]["base"].startswith(f"{IMAGE}@sha256:"), info
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", built["digest"]), info
    # The unpacked tree belongs to alice, as a pulled image does.
    owner = node_sh(
        SLURM_LAB, "n1", f"stat -c %u {IMAGES_DIR}/{built['digest'][7:]}/rootfs/opt/app"
    )
    assert owner.stdout.strip() == uid, owner

    # The same build file and data, another file of the task changed: nothing is built.
    again = build_task(tmp_path / "b", "built-b", [INSIDE], data=data)
    second = submit(alice, again)
    info2, log2 = finished(alice, second, 300)
    assert info2["state"] == "COMPLETED", (info2, log2[-3000:])
    assert info2["image"]["digest"] == built["digest"], (info2, info)
    reused = rf"image build env/Containerfile [0-9a-f]{{12}}: reused \(built by job {job}\)"
    assert re.search(reused, log2), log2
    listed = json.loads(alice("images", "--json").stdout)
    mine = [entry for entry in listed if entry["digest"] == built["digest"]]
    assert len(mine) == 1 and mine[0]["build"]["file"] == "env/Containerfile", listed

    # A file COPY reads changed: a new key, built again, and the job sees the new data.
    changed = submit(alice, build_task(tmp_path / "c", "built-c", [INSIDE], data=data + "-2"))
    info3, log3 = finished(alice, changed, 600)
    assert info3["state"] == "COMPLETED", (info3, log3[-3000:])
    assert info3["image"]["digest"] != built["digest"], info3
    assert re.search(r"image build env/Containerfile [0-9a-f]{12}: built", log3), log3
    assert f"data={data}-2 " in log3, log3


def test_b2_two_jobs_of_one_new_build_build_it_once(alice, tmp_path):
    data = f"twice-{time.time_ns()}"
    jobs = [
        submit(alice, build_task(tmp_path / name, name, ["true"], data=data))
        for name in ("first", "second")
    ]
    logs = []
    for job in jobs:
        info, log = finished(alice, job, 600)
        assert info["state"] == "COMPLETED", (info, log[-3000:])
        logs.append(log)
    built = [log for log in logs if re.search(r"image build \S+ [0-9a-f]{12}: built", log)]
    reused = [log for log in logs if re.search(r"image build \S+ [0-9a-f]{12}: reused", log)]
    assert len(built) == 1 and len(reused) == 1, logs


@pytest.mark.fault
def test_b3_a_failing_run_step_fails_the_job_with_its_line_and_leaves_no_half_image(
    alice, tmp_path
):
    failing = BUILD_FILE.replace("CMD", f"RUN echo step-output-{time.time_ns()} && exit 7\nCMD")
    project = build_task(tmp_path / "t", "build-fails", ["echo never"], build_file=failing)
    job = submit(alice, project)
    info, log = finished(alice, job, 600)
    assert info["state"] == "FAILED", (info, log[-3000:])
    line = next(n for n, text in enumerate(failing.splitlines(), 1) if "exit 7" in text)
    assert f"env/Containerfile:{line}" in log and "exited 7" in log, log
    assert "build: step-output-" in log, log  # the step's own output is in the job's log
    assert not re.search(r"^\[n\d:\d+\] never$", log, re.M), log  # no run line ran
    assert leftovers() == "", leftovers()
    listed = json.loads(alice("images", "--json").stdout)
    assert not [e for e in listed if e.get("build") and "exit 7" in json.dumps(e)], listed


@pytest.mark.bad_input
def test_b4_a_user_line_is_refused_at_submit_with_its_place_and_nothing_is_made(alice, tmp_path):
    bad = BUILD_FILE.replace("WORKDIR /opt/app", "USER root\nWORKDIR /opt/app")
    project = build_task(tmp_path / "t", "build-user", ["true"], build_file=bad)
    jobs = "ls /shared/tcloud/alice/jobs | wc -l"
    before = node_sh(SLURM_LAB, "n1", jobs).stdout
    proc = alice("submit", str(project))
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "env/Containerfile:5" in proc.stderr and "USER" in proc.stderr, proc.stderr
    assert node_sh(SLURM_LAB, "n1", jobs).stdout == before


@pytest.mark.fault
def test_b5_cancel_during_a_build_leaves_no_build_process_and_no_half_image(alice, tmp_path):
    slow = BUILD_FILE.replace("CMD", f"RUN echo slow-{time.time_ns()} && sleep 877\nCMD")
    job = submit(alice, build_task(tmp_path / "t", "build-cancel", ["true"], build_file=slow))
    deadline = time.monotonic() + 180
    while all(no_process(node, "sleep 877") for node in ("n2", "n3")):
        assert time.monotonic() < deadline, "the slow RUN step never started"
        time.sleep(0.5)
    assert alice("cancel", job).returncode == 0
    wait_state(alice, job, ("CANCELLED",), 60)
    deadline = time.monotonic() + 30
    patterns = ("sleep 877", "ch-run")
    while not all(no_process(n, p) for n in ("n2", "n3") for p in patterns):
        assert time.monotonic() < deadline, "a build process survived cancel"
        time.sleep(1)
    while leftovers():  # the batch step removes its unfinished build when it is stopped
        assert time.monotonic() < deadline, leftovers()
        time.sleep(1)
