"""The review of issue 19's local builds, agent side: whatever a build step meets (a name
too long, a NUL byte, a full disk) fails the job with a positioned reason, never a
traceback; what a RUN leaves running ends with it; a job waits for another one's build
as long as that build may take and says whom it waits for; interrupted builds of any
key are swept; Docker's ENV-over-ARG precedence, the base image's ENV included."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.tasks.images import build as imagebuild
from tacc_agent.tasks.images import cache as imagecache
from tacc_contract.buildfile import BuildFile, Step
from tests.unit.agent.tasks.images.test_agent_image_build import (
    HostRunner,
    StubPuller,
    build,
    make_job,
    settings,
)

FROM = "FROM n1:5000/tacc/base:bookworm\n"


def no_work_dirs(user_dir: Path) -> bool:
    return not list((user_dir / "images").glob(".build-*"))


# --- OS errors and NUL bytes in steps: positioned, nothing left ----------------------------------
@pytest.mark.bad_input
def test_a_workdir_name_too_long_fails_with_its_line(tmp_path):
    name = "x" * 300
    with pytest.raises(AgentError) as caught:
        build(tmp_path, f"{FROM}WORKDIR /{name}\n")
    assert str(caught.value) == f"Containerfile:2: WORKDIR: File name too long: /{name}"
    assert no_work_dirs(tmp_path / "workspace" / "alice")


@pytest.mark.bad_input
def test_a_copy_destination_too_long_fails_with_its_line(tmp_path):
    name = "y" * 300
    with pytest.raises(AgentError) as caught:
        build(tmp_path, f"{FROM}ENV A=1\nCOPY a /{name}/\n", {"a": "1"})
    message = str(caught.value)
    assert message.startswith("Containerfile:3: COPY: File name too long: /")
    assert str(tmp_path) not in message  # a path in the image, not the node's work dir
    assert no_work_dirs(tmp_path / "workspace" / "alice")


def nul_build(tmp_path: Path, step: Step) -> tuple[Path, BuildFile]:
    """A build file as a contract that let a NUL byte through would give it."""
    rootfs = tmp_path / "rootfs"
    (rootfs / "srv").mkdir(parents=True)
    return rootfs, BuildFile("Containerfile", "n1:5000/tacc/base:bookworm", 1, (step,))


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "step",
    [
        Step("WORKDIR", ("/a\0b",), 4),
        Step("RUN", ("exec", ("echo", "a\0b")), 4),
        Step("COPY", (("a",), "/a\0b"), 4),
    ],
)
def test_a_nul_byte_in_a_step_fails_with_its_line(tmp_path, step):
    rootfs, steps = nul_build(tmp_path, step)
    context_dir = tmp_path / "code"
    context_dir.mkdir()
    (context_dir / "a").write_text("1\n")
    context = imagebuild.Context(context_dir, {"a": 0o644})
    state = imagebuild.BuildState({}, {})
    with pytest.raises(AgentError) as caught:
        imagebuild.apply_steps(
            steps, context, rootfs, tmp_path / "env", state, HostRunner(), 5, lambda _l: None
        )
    assert str(caught.value) == f"Containerfile:4: {step.kind}: a NUL byte in a path or argument"


@pytest.mark.bad_input
def test_a_nul_byte_in_a_variable_is_named_as_such(tmp_path):
    path = tmp_path / "env"
    cases = {
        ("A", "x\0y"): "the variable 'A' has a NUL byte in its value",
        ("A=B", "x"): "the variable 'A=B' has '=' in its name",
        ("A\nB", "x"): "the variable 'A\\nB' has a newline in its name",
        ("A\0", "x"): "the variable 'A\\x00' has a NUL byte in its name",
    }
    for (key, value), message in cases.items():
        with pytest.raises(AgentError) as caught:
            imagebuild.write_env_file(path, {key: value}, "Containerfile:3")
        assert str(caught.value) == f"Containerfile:3: {message}; a RUN step cannot get it"


def test_an_os_error_shows_the_path_in_the_image_or_the_context_never_the_node(tmp_path):
    rootfs, context = tmp_path / "w" / "rootfs", imagebuild.Context(tmp_path / "code", {})
    failure = imagebuild.step_failure(
        PermissionError(13, "Permission denied", str(rootfs / "opt" / "d" / "e")),
        "Containerfile:5",
        "COPY",
        rootfs,
        context,
    )
    assert str(failure) == "Containerfile:5: COPY: Permission denied: /opt/d/e"
    failure = imagebuild.step_failure(
        OSError(5, "Input/output error", str(tmp_path / "code" / "data" / "x")),
        "Containerfile:6",
        "COPY",
        rootfs,
        context,
    )
    assert str(failure) == "Containerfile:6: COPY: Input/output error: /data/x in the build context"
    failure = imagebuild.step_failure(
        OSError(28, "No space left on device", "/var/x"), "Containerfile:7", "RUN", rootfs, context
    )
    assert str(failure) == "Containerfile:7: RUN: No space left on device"


@pytest.mark.fault
def test_an_os_error_outside_the_steps_fails_the_job_and_leaves_nothing(tmp_path, monkeypatch):
    user_dir, job_dir, image_build = make_job(tmp_path, f"{FROM}RUN true\n")

    def full_disk(_source, target) -> None:
        target.mkdir()
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(imagebuild, "copy_rootfs", full_disk)
    with pytest.raises(AgentError) as caught:
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lambda _l: None,
            settings(),
            HostRunner(),
            StubPuller(),
        )
    short = image_build["key"].split(":")[1][:12]
    assert str(caught.value) == f"image build Containerfile {short}: No space left on device"
    assert no_work_dirs(user_dir)


# --- ENV over ARG, the base image's ENV included ------------------------------------------------
def test_the_base_images_env_wins_over_an_arg_of_the_same_name(tmp_path):
    """Docker: an ENV (the base image's too: LANG=C.UTF-8 here) wins over an ARG of the
    same name for RUN; the file's own ENV wins over the base's."""
    done = build(tmp_path, f"{FROM}ARG LANG=xx ONLY=arg\nRUN true\nENV LANG=de\nRUN true\n")
    first, second = (call["env"] for call in done.runner.calls)
    assert first["LANG"] == "C.UTF-8" and first["ONLY"] == "arg"
    assert second["LANG"] == "de"
    assert done.marker["env"]["LANG"] == "de"


# --- what a RUN leaves running ends with it ------------------------------------------------------
FAKE_CH_RUN = """#!/bin/sh
# a RUN step that leaves a process in its group and a daemon in a session of its own
here=$(dirname "$0")
sleep 1000 &
echo $! > "$here/background"
setsid sh -c 'echo $$ > "$0/daemon"; exec sleep 1001' "$here" &
while [ ! -s "$here/daemon" ]; do sleep 0.05; done
echo step done
exit 0
"""

SUBREAPER_RUN = """
import ctypes, json, sys, threading
from pathlib import Path
from tacc_agent.tasks.images import build as imagebuild
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # as the batch step: a child subreaper
here = Path(sys.argv[1])
lines, given_up, join = [], [], threading.Thread.join

def joined(thread, timeout=None):  # a reader still reading after its join: given up on
    join(thread, timeout)
    if thread.is_alive():
        given_up.append(thread.name)

threading.Thread.join = joined
code = imagebuild.ChRun(timeout=60, binary=str(here / "ch-run"))(
    here / "rootfs", ["x"], "/", here / "env", lines.append)
print(json.dumps({"code": code, "lines": lines, "given_up": given_up}))
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.fault
def test_what_a_run_step_leaves_running_is_stopped_with_it(tmp_path):
    fake = tmp_path / "ch-run"
    fake.write_text(FAKE_CH_RUN)
    fake.chmod(0o755)
    proc = subprocess.run(
        [sys.executable, "-c", SUBREAPER_RUN, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    pids = [int((tmp_path / name).read_text()) for name in ("background", "daemon")]
    try:
        assert proc.returncode == 0, proc.stderr
        result = json.loads(proc.stdout)
        assert result["code"] == 0 and result["lines"] == ["step done"]
        # No wait for the output pipe the leftovers held: they were stopped first, so the
        # reader saw the pipe's end (its join did not run out).
        assert result["given_up"] == []
        assert [pid for pid in pids if alive(pid)] == []
    finally:
        for pid in pids:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- interrupted builds of other keys ------------------------------------------------------------
def hold_lock(lock: Path, ready, release) -> None:
    with lock.open("a") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)
        ready.set()
        release.wait(30)


@pytest.mark.fault
def test_interrupted_builds_of_other_keys_are_swept_unless_building(tmp_path):
    user_dir, job_dir, image_build = make_job(tmp_path, FROM)
    images = user_dir / "images"
    stale, running = "c" * 64, "d" * 64
    for key in (stale, running):
        (images / f".build-{key}-999" / "bundle").mkdir(parents=True)
    (images / ".build-not-a-key-1").mkdir()
    context = multiprocessing.get_context("fork")
    ready, release = context.Event(), context.Event()
    holder = context.Process(target=hold_lock, args=(images / f"{running}.lock", ready, release))
    holder.start()
    try:
        assert ready.wait(10)
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lambda _l: None,
            settings(),
            HostRunner(),
            StubPuller(),
        )
    finally:
        release.set()
        holder.join(10)
    assert not (images / f".build-{stale}-999").exists()
    assert (images / f".build-{running}-999").is_dir()  # its build may still be running
    assert (images / ".build-not-a-key-1").is_dir()


# --- waiting for another job's build -------------------------------------------------------------
def hold_build(images: Path, hex_key: str, ready, seconds: float) -> None:
    with imagebuild.build_lock(images, hex_key, "9", "holder", lambda _l: None, lambda: 1.0):
        ready.set()
        time.sleep(seconds)


def wait_for_holder(tmp_path: Path, hold: float, **changes) -> tuple[list[str], Exception | None]:
    user_dir, job_dir, image_build = make_job(tmp_path, f"{FROM}RUN true\n")
    hex_key = image_build["key"].split(":")[1]
    images = user_dir / "images"
    images.mkdir(parents=True)
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=hold_build, args=(images, hex_key, ready, hold))
    holder.start()
    lines: list[str] = []
    failure = None
    try:
        assert ready.wait(10)
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lines.append,
            settings(**changes),
            HostRunner(),
            StubPuller(),
        )
    except AgentError as exc:
        failure = exc
    finally:
        holder.join(30)
    return lines, failure


@pytest.mark.fault
def test_a_job_waits_past_the_lock_timeout_for_a_build_and_says_for_whom(tmp_path):
    """A build may take a RUN's timeout per step on top of the pull: a second job waits
    that long (here 2 x 0.5 + 2 x 0.5 + 1 x 1 = 3 s), not the lock timeout (0.5 s)."""
    lines, failure = wait_for_holder(tmp_path, 1.5, lock_timeout=0.5, step_timeout=1)
    assert failure is None
    waiting = [line for line in lines if "waiting for" in line]
    assert len(waiting) == 1 and "waiting for job 9 on " in waiting[0]
    assert waiting[0].endswith("(at most 3 s)")
    assert any("built in" in line for line in lines)


@pytest.mark.fault
def test_a_build_that_outlasts_its_bound_fails_the_waiting_job_naming_it(tmp_path):
    _lines, failure = wait_for_holder(tmp_path, 6, lock_timeout=0.5, step_timeout=1)
    assert isinstance(failure, AgentError)
    assert "still being built by job 9 on " in str(failure)
    assert str(failure).endswith("after 3 s; submit again later")


def test_no_holder_file_stays_behind(tmp_path):
    done = build(tmp_path, f"{FROM}RUN true\n")
    assert not list((done.user_dir / "images").glob("*.holder"))
    assert imagecache.listing(done.user_dir)
