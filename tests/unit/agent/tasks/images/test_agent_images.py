"""The agent's side of container images without a registry: `image resolve` over a fake
skopeo on PATH (the digest of the raw manifest, the registry's own error line, the
timeout), the per-user image cache with a stub puller (pulled once under a lock, reused,
nothing left behind by a failed pull), `image ls` and the job's image record."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent.cli import SessionVerbs, build_parser
from tacc_agent.errors import AGENT_CLUSTER, AgentError, Rejected
from tacc_agent.tasks.images import cache as imagecache
from tacc_agent.tasks.images import registry as registry_client
from tacc_agent.tasks.schedule import submit
from tacc_contract import verbs
from tacc_contract.images import parse_reference
from tests.unit.agent_jobs import agent, agent_env

MANIFEST = b'{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}'
DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
REFERENCE = "n1:5000/tacc/base:bookworm"
PINNED = f"{REFERENCE}@{DIGEST}"
UNKNOWN = (
    'time="2026-11-24T11:00:00Z" level=fatal msg="Error parsing image name '
    '\\"docker://n1:5000/tacc/nope:1\\": reading manifest 1 in n1:5000/tacc/nope: '
    'manifest unknown: manifest unknown"'
)


def fake_skopeo(tmp_path: Path, body: str) -> Path:
    """A skopeo on PATH that logs its argv to skopeo.calls and runs `body` (sh)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "skopeo"
    calls = tmp_path / "skopeo.calls"
    script.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n{body}\n')
    script.chmod(0o755)
    return bin_dir


@pytest.fixture
def skopeo_serving(tmp_path, monkeypatch) -> Path:
    manifest = tmp_path / "manifest.json"
    manifest.write_bytes(MANIFEST)
    bin_dir = fake_skopeo(tmp_path, f"cat {manifest}")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path / "skopeo.calls"


def test_resolve_pins_the_digest_of_the_raw_manifest(skopeo_serving):
    answer = registry_client.resolve(REFERENCE, timeout=10)
    assert answer == {"reference": REFERENCE, "pinned": PINNED, "digest": DIGEST}
    verbs.IMAGE_RESOLVE.answer.check(answer)
    assert skopeo_serving.read_text().split() == ["inspect", "--raw", f"docker://{REFERENCE}"]


def test_a_pinned_reference_is_asked_by_digest_and_checked(skopeo_serving):
    answer = registry_client.resolve(PINNED, timeout=10)
    assert answer["pinned"] == PINNED
    # skopeo refuses tag and digest together: the registry is asked by digest alone
    assert skopeo_serving.read_text().split()[-1] == f"docker://n1:5000/tacc/base@{DIGEST}"
    other = "sha256:" + "0" * 64
    with pytest.raises(Rejected, match="not the one the reference pins") as caught:
        registry_client.resolve(f"{REFERENCE}@{other}", timeout=10)
    assert caught.value.field == "image"


@pytest.mark.bad_input
def test_an_unknown_reference_names_itself_and_the_registrys_answer(tmp_path, monkeypatch):
    bin_dir = fake_skopeo(tmp_path, f"echo {json.dumps(UNKNOWN)} >&2; exit 1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(Rejected) as caught:
        registry_client.resolve("n1:5000/tacc/nope:1", timeout=10)
    assert str(caught.value) == (
        "n1:5000/tacc/nope:1: the registry answered: reading manifest 1 in "
        "n1:5000/tacc/nope: manifest unknown: manifest unknown"
    )
    assert caught.value.field == "image" and "\n" not in str(caught.value)


@pytest.mark.bad_input
def test_a_plain_error_line_is_taken_as_it_is_and_trimmed(tmp_path, monkeypatch):
    long_line = "dial tcp 10.0.0.1:5000: connect: connection refused " + "x" * 600
    bin_dir = fake_skopeo(tmp_path, f"echo first line >&2; echo '{long_line}' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(Rejected) as caught:
        registry_client.resolve(REFERENCE, timeout=10)
    message = str(caught.value)
    assert message.startswith(f"{REFERENCE}: the registry answered: dial tcp 10.0.0.1:5000")
    assert message.endswith("...") and len(message) < 500 and "first line" not in message


@pytest.mark.fault
def test_a_registry_that_does_not_answer_is_bounded_by_the_timeout(tmp_path, monkeypatch):
    bin_dir = fake_skopeo(tmp_path, f"echo $$ > {tmp_path / 'pid'}; exec sleep 30")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(AgentError, match=r"did not answer the manifest request within 0\.5 s") as e:
        registry_client.resolve(REFERENCE, timeout=0.5)
    assert e.value.exit_code == AGENT_CLUSTER
    # Stopped at the timeout, not waited for: the silent skopeo is gone (no pid: it was
    # stopped before it could even write it).
    pid = (tmp_path / "pid").read_text().strip() if (tmp_path / "pid").exists() else ""
    assert not pid or not Path(f"/proc/{pid}").exists()


@pytest.mark.bad_input
@pytest.mark.parametrize("reference", ["base:bookworm", "N1:5000/Tacc/base", "n1:5000/x@sha256:1"])
def test_a_bad_reference_is_refused_before_any_registry_is_asked(reference, skopeo_serving):
    with pytest.raises(Rejected, match="is not an image reference: expected an image") as caught:
        registry_client.resolve(reference, timeout=10)
    assert caught.value.field == "image" and repr(reference) in str(caught.value)
    assert not skopeo_serving.exists()


@pytest.mark.bad_input
def test_a_registry_off_the_clusters_list_is_refused_naming_the_list(skopeo_serving, tmp_path):
    """Issue [24] point 1: with image_registries set, an image from any other registry is
    refused at submit (resolve) and at the pull of a rerun alike, naming the list, before
    any registry is asked."""
    allowed = ("n1:5000", "nvcr.io", "docker.io")
    expected = (
        "quay.io/org/tool:1: the registry quay.io is not one this cluster takes images "
        "from; it allows n1:5000, nvcr.io, docker.io (the agent's image_registries, from "
        "the inventory's tacc_image_registry and tacc_image_upstreams)"
    )
    with pytest.raises(Rejected) as caught:
        registry_client.resolve("quay.io/org/tool:1", timeout=10, allowed=allowed)
    assert str(caught.value) == expected and caught.value.field == "image"
    # The rerun's pinned reference: what job_container checks before it pulls.
    with pytest.raises(Rejected, match=r"the registry quay\.io is not one this cluster"):
        registry_client.check_task(f"quay.io/org/tool:1@{DIGEST}", None, allowed)
    assert not skopeo_serving.exists()  # neither asked a registry
    # A listed registry is asked as before.
    answer = registry_client.resolve("nvcr.io/nvidia/pytorch:24.10-py3", 10, allowed)
    assert answer["pinned"] == f"nvcr.io/nvidia/pytorch:24.10-py3@{DIGEST}"


@pytest.mark.security
def test_skopeo_never_reads_the_callers_own_registries_settings(tmp_path, monkeypatch):
    """A researcher's ~/.config/containers/registries.conf (or CONTAINERS_REGISTRIES_CONF)
    could send a listed registry's name elsewhere or turn TLS off: skopeo runs with a
    HOME that holds none, without those variables (review of issue [24])."""
    bin_dir = fake_skopeo(
        tmp_path,
        f'echo "HOME=$HOME CONF=${{CONTAINERS_REGISTRIES_CONF-unset}} '
        f'XDG=${{XDG_CONFIG_HOME-unset}} AUTH=${{REGISTRY_AUTH_FILE-unset}}" > {tmp_path / "env"}'
        f"; printf '%s' '{MANIFEST.decode()}'",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    mine = tmp_path / "home/.config/containers"
    mine.mkdir(parents=True)
    (mine / "registries.conf").write_text('[[registry]]\nprefix="nvcr.io"\nlocation="evil.org"\n')
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(mine / "registries.conf"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "home/.config"))
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "auth.json"))
    registry_client.resolve("nvcr.io/nvidia/pytorch:24.10-py3", 10, ("nvcr.io",))
    assert (tmp_path / "env").read_text().split() == [
        "HOME=/nonexistent",
        "CONF=unset",
        "XDG=unset",
        "AUTH=unset",
    ]


@pytest.mark.security
def test_a_task_or_build_from_an_unlisted_registry_is_refused_at_submit_and_launch():
    """A hand-written instruction skips tcloud's `image resolve`: the submit and the job's
    start check the task's image, or its build file's base, against the list too."""
    allowed = ("n1:5000", "nvcr.io")
    pinned = f"ghcr.io/x/y@{DIGEST}"
    with pytest.raises(Rejected, match=r"the registry ghcr\.io is not one"):
        registry_client.check_task(pinned, None, allowed)
    with pytest.raises(Rejected, match=r"the registry ghcr\.io is not one"):
        registry_client.check_task(None, {"base": pinned, "file": "Containerfile"}, allowed)
    registry_client.check_task(f"nvcr.io/x/y@{DIGEST}", None, allowed)
    registry_client.check_task(pinned, None, ())  # no list: any registry
    task = SimpleNamespace(image=pinned, image_build=None, datasets=[])
    with pytest.raises(Rejected, match=r"the registry ghcr\.io is not one"):
        submit.check_container(task, allowed)


@pytest.mark.fault
def test_no_skopeo_on_the_node_is_said_plainly(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(AgentError, match="skopeo is not installed on this node"):
        registry_client.resolve(REFERENCE, timeout=10)


def test_the_resolve_and_ls_verbs_answer_in_a_session_and_one_shot(skopeo_serving, tmp_path):
    session_verbs = SessionVerbs(
        build_parser().parse_args(["--userdir", str(tmp_path / "u"), "session"])
    )
    rc, answer = session_verbs(list(verbs.IMAGE_RESOLVE.request(reference=REFERENCE)), b"", None)
    assert rc == 0 and verbs.IMAGE_RESOLVE.check_answer(answer)["pinned"] == PINNED
    rc, answer = session_verbs(["image", "resolve", "n1:5000/tacc/UPPER"], b"", None)
    assert rc == 2 and answer["field"] == "image" and "not an image reference" in answer["error"]
    rc, answer = session_verbs(list(verbs.IMAGE_LS.request()), b"", None)
    assert (rc, answer) == (0, [])
    env = agent_env(tmp_path) | {"PATH": os.environ["PATH"]}
    proc = agent("image", "resolve", REFERENCE, env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout)["digest"] == DIGEST


# ---------------------------------------------------------------- the cache
class StubPuller:
    """Makes bundle/rootfs and a runtime spec as umoci would; counts its pulls."""

    def __init__(self, fail: bool = False) -> None:
        self.pulls = 0
        self.fail = fail

    def __call__(self, ref, work: Path, log) -> Path:
        self.pulls += 1
        bundle = work / "bundle"
        (bundle / "rootfs" / "etc").mkdir(parents=True)
        (bundle / "rootfs" / "etc" / "os-release").write_text("NAME=image\n")
        (bundle / "umoci.json").write_text("{}")
        (bundle / "sha256_abc.mtree").write_text("")
        spec = {"process": {"env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"]}}
        (bundle / "config.json").write_text(json.dumps(spec))
        if self.fail:
            raise AgentError(f"{ref}: the registry answered: connection refused")
        return bundle


def test_an_image_is_pulled_once_and_reused(tmp_path):
    user_dir, puller, lines = tmp_path / "alice", StubPuller(), []
    user_dir.mkdir(mode=0o700)
    first = imagecache.ensure(user_dir, PINNED, "11", lines.append, 5, puller)
    second = imagecache.ensure(user_dir, PINNED, "12", lines.append, 5, puller)
    assert puller.pulls == 1
    target = user_dir / "images" / DIGEST.split(":")[1]
    assert first["path"] == second["path"] == str(target / "rootfs")
    assert first["pulled_by_job"] == second["pulled_by_job"] == "11"
    assert first["env"] == {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert lines[0].endswith(f"pulling {PINNED} ...") and "pulled and unpacked in" in lines[1]
    assert lines[2].endswith("reused (pulled by job 11)")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "rootfs", "tacc-image.json"]
    assert (target.stat().st_mode & 0o777) == 0o700
    assert ((user_dir / "images").stat().st_mode & 0o777) == 0o700
    assert [p.name for p in (user_dir / "images").iterdir() if p.name.startswith(".pull")] == []


@pytest.mark.fault
def test_a_failed_pull_leaves_nothing_a_later_job_takes_for_ready(tmp_path):
    user_dir = tmp_path / "alice"
    user_dir.mkdir()
    with pytest.raises(AgentError, match="connection refused"):
        imagecache.ensure(user_dir, PINNED, "11", lambda _line: None, 5, StubPuller(fail=True))
    assert sorted(p.name for p in (user_dir / "images").iterdir()) == [
        f"{DIGEST.split(':')[1]}.lock"
    ]
    assert imagecache.listing(user_dir) == []
    puller = StubPuller()
    imagecache.ensure(user_dir, PINNED, "12", lambda _line: None, 5, puller)
    assert puller.pulls == 1 and imagecache.listing(user_dir)[0]["pulled_by_job"] == "12"


@pytest.mark.fault
def test_what_an_interrupted_pull_left_is_cleared_and_pulled_again(tmp_path):
    user_dir = tmp_path / "alice"
    hex_digest = DIGEST.split(":")[1]
    stale = user_dir / "images" / f".pull-{hex_digest}-99999" / "bundle" / "rootfs"
    stale.mkdir(parents=True)
    stale.chmod(0o500)  # an unpacked image may hold directories its owner cannot write
    unfinished = user_dir / "images" / hex_digest / "rootfs"
    unfinished.mkdir(parents=True)  # a directory without its marker was never finished
    puller = StubPuller()
    imagecache.ensure(user_dir, PINNED, "13", lambda _line: None, 5, puller)
    assert puller.pulls == 1
    assert not stale.parent.parent.exists()
    assert (user_dir / "images" / hex_digest / imagecache.MARKER).is_file()


LOCK_HOLDER = textwrap.dedent(
    """
    import fcntl, sys, time
    handle = open(sys.argv[1], "a")
    fcntl.lockf(handle, fcntl.LOCK_EX)
    print("locked", flush=True)
    time.sleep(30)
    """
)


@pytest.mark.fault
def test_a_job_waits_for_the_one_pulling_the_same_image(tmp_path):
    user_dir = tmp_path / "alice"
    (user_dir / "images").mkdir(parents=True)
    lock = user_dir / "images" / f"{DIGEST.split(':')[1]}.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", LOCK_HOLDER, str(lock)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        puller = StubPuller()
        with pytest.raises(AgentError, match="still locked after 1 s"):
            imagecache.ensure(user_dir, PINNED, "14", lambda _line: None, 1, puller)
        assert puller.pulls == 0
    finally:
        holder.kill()
        holder.wait()
    imagecache.ensure(user_dir, PINNED, "14", lambda _line: None, 1, puller)
    assert puller.pulls == 1


def test_image_ls_answers_the_images_shape_without_the_runtimes_extras(tmp_path):
    user_dir = tmp_path / "alice"
    user_dir.mkdir()
    imagecache.ensure(user_dir, PINNED, "15", lambda _line: None, 5, StubPuller(), "charliecloud")
    (user_dir / "images" / "not-an-image").mkdir()
    listed = verbs.IMAGE_LS.answer.check(imagecache.listing(user_dir), "image ls", "")
    assert [i["digest"] for i in listed] == [DIGEST]
    assert listed[0]["reference"] == PINNED and "env" not in listed[0]
    assert listed[0]["path"].endswith("/rootfs") and listed[0]["runtime"] == "charliecloud"
    env = agent_env(tmp_path)
    proc = agent("--userdir", str(user_dir), "image", "ls", env=env)
    assert proc.returncode == 0 and json.loads(proc.stdout) == listed


def test_mount_points_are_made_in_the_image_and_a_link_is_refused(tmp_path):
    user_dir = tmp_path / "alice"
    user_dir.mkdir()
    imagecache.ensure(user_dir, PINNED, "16", lambda _line: None, 5, StubPuller())
    ref = parse_reference(PINNED)
    rootfs = imagecache.rootfs_at(user_dir, imagecache.digest_hex(ref))
    imagecache.make_mount_points_at(
        user_dir, imagecache.digest_hex(ref), str(ref), ["/shared", "/var/spool/slurmd"], 5
    )
    assert (rootfs / "shared").is_dir() and (rootfs / "var/spool/slurmd").is_dir()
    (rootfs / "data").symlink_to("/etc")
    with pytest.raises(AgentError, match="/data is a symbolic link in the image"):
        imagecache.make_mount_points_at(
            user_dir, imagecache.digest_hex(ref), str(ref), ["/data"], 5
        )


def test_the_job_record_is_what_job_status_answers(tmp_path):
    job_dir = tmp_path / "job"
    (job_dir / "status").mkdir(parents=True)
    assert imagecache.job_image(job_dir) is None
    user_dir = tmp_path / "alice"
    user_dir.mkdir()
    image = imagecache.ensure(user_dir, PINNED, "17", lambda _line: None, 5, StubPuller())
    imagecache.record_for_job(job_dir, {**image, "runtime": "charliecloud"})
    recorded = imagecache.job_image(job_dir)
    assert recorded["reference"] == PINNED and recorded["runtime"] == "charliecloud"
    assert "env" not in recorded and recorded["pulled_by_job"] == "17"
