"""The agent's side of `image: {build: PATH}` without Charliecloud: imagebuild with a
stub base puller and a stub RUN runner that runs each step's argv on the host in the work
rootfs (with exactly the variables of the step's env file): built once per key under the
lock and reused, the key recomputed from the job's files, COPY's Docker rules (inside the
context and inside the rootfs only), RUN's environment, failures and timeouts that leave
nothing behind, and the batch step's job_container for a build."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.execute import launch as execute
from tacc_agent.tasks.images import build as imagebuild
from tacc_agent.tasks.images import cache as imagecache
from tacc_contract import buildfile

BASE = "n1:5000/tacc/base:bookworm@sha256:" + "ab" * 32
BASE_HEX = "ab" * 32
INDEX = "http://n1:3141/tacc/cluster/+simple/"


class StubPuller:
    """A base image: /etc, /usr/bin with /bin -> usr/bin, an absolute link /app ->
    /opt/app, and a config.json with the image's env and working directory."""

    def __init__(self) -> None:
        self.pulls = 0

    def __call__(self, ref, work: Path, log) -> Path:
        self.pulls += 1
        bundle = work / "bundle"
        rootfs = bundle / "rootfs"
        for directory in ("etc", "usr/bin", "opt/app", "srv"):
            (rootfs / directory).mkdir(parents=True)
        (rootfs / "bin").symlink_to("usr/bin")
        (rootfs / "app").symlink_to("/opt/app")
        (rootfs / "etc" / "os-release").write_text("ID=debian\n")
        spec = {
            "process": {"env": ["PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8"], "cwd": "/srv"}
        }
        (bundle / "config.json").write_text(json.dumps(spec))
        return bundle


def env_file_values(path: Path) -> dict[str, str]:
    """What ch-run 0.31 makes of KEY='VALUE' lines: one pair of single quotes stripped."""
    found = {}
    for line in path.read_text().splitlines():
        key, value = line.split("=", 1)
        assert value.startswith("'") and value.endswith("'")
        found[key] = value[1:-1]
    return found


class HostRunner:
    """Runs a RUN step's argv on the host, in the rootfs path of its cwd, with the env
    file's variables only (plus ROOTFS, the rootfs's host path, for the test's lines)."""

    def __init__(self, counter: Path | None = None, delay: float = 0.0) -> None:
        self.calls: list[dict] = []
        self.counter, self.delay = counter, delay

    def __call__(self, rootfs, argv, cwd, env_file, sink) -> int:
        env = env_file_values(env_file)
        self.calls.append({"argv": list(argv), "cwd": cwd, "env": env})
        if self.counter is not None:
            with self.counter.open("a") as handle:
                handle.write("run\n")
        time.sleep(self.delay)
        proc = subprocess.run(
            list(argv),
            cwd=imagebuild.in_image(rootfs, cwd),
            env={**env, "ROOTFS": str(rootfs), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            check=False,
        )
        for line in (proc.stdout + proc.stderr).splitlines():
            sink(line)
        return proc.returncode


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def make_job(
    tmp_path: Path,
    containerfile: str,
    files: dict[str, str] | None = None,
    context: str = "",
    name: str = "Containerfile",
    modes: dict[str, int] | None = None,
) -> tuple[Path, Path, dict]:
    """(user_dir, job_dir, task.image_build) as tcloud would have made them: the files
    under code/, the manifest in instruction.json, the key from the same files."""
    user_dir = tmp_path / "workspace" / "alice"
    job_dir = user_dir / "jobs" / "abc-1"
    code = job_dir / "code"
    (job_dir / "status").mkdir(parents=True)
    everything = {posixpath_join(context, name): containerfile, **(files or {})}
    manifest = {}
    for path, text in everything.items():
        (code / path).parent.mkdir(parents=True, exist_ok=True)
        (code / path).write_text(text)
        mode = (modes or {}).get(path, 0o644)
        manifest[f"code/{path}"] = [sha(text), len(text), mode]
    (job_dir / "instruction.json").write_text(json.dumps({"manifest": manifest}))
    build = buildfile.parse(containerfile, posixpath_join(context, name))
    prefix = f"{context}/" if context else ""
    digests = {
        p[len(prefix) :]: (sha(t), bool((modes or {}).get(p, 0o644) & 0o111))
        for p, t in everything.items()
        if p.startswith(prefix)
    }
    key = buildfile.build_key(build, BASE, digests)
    image_build = {
        "file": posixpath_join(context, name),
        "context": context,
        "base": BASE,
        "key": key,
    }
    return user_dir, job_dir, image_build


def posixpath_join(context: str, name: str) -> str:
    return f"{context}/{name}" if context else name


def settings(**changes) -> imagebuild.BuildSettings:
    return imagebuild.BuildSettings(**{"lock_timeout": 5, "package_index": INDEX, **changes})


def build(tmp_path, containerfile, files=None, runner=None, job_id="1", **job):
    user_dir, job_dir, image_build = make_job(tmp_path, containerfile, files, **job)
    lines: list[str] = []
    runner = runner or HostRunner()
    marker = imagebuild.ensure_build(
        user_dir, job_dir, image_build, job_id, lines.append, settings(), runner, StubPuller()
    )
    return SimpleNamespace(
        user_dir=user_dir,
        job_dir=job_dir,
        image_build=image_build,
        marker=marker,
        lines=lines,
        runner=runner,
        rootfs=Path(marker["path"]),
    )


CONTAINERFILE = """\
FROM n1:5000/tacc/base:bookworm
ARG VERSION=1.2
ENV APP_HOME=/opt/app GREETING="hello world"
WORKDIR work
COPY requirements.txt ./
RUN echo "$GREETING $VERSION" > "$ROOTFS/etc/greeting" && echo done building
CMD ["ignored"]
"""


def test_an_image_is_built_once_per_key_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("https_proxy", "http://10.77.6.1:3128")
    done = build(tmp_path, CONTAINERFILE, {"requirements.txt": "six\n"})
    hex_key = done.image_build["key"].split(":")[1]
    assert done.rootfs == done.user_dir / "images" / hex_key / "rootfs"
    assert (done.rootfs / "etc" / "greeting").read_text() == "hello world 1.2\n"
    assert (done.rootfs / "srv" / "work" / "requirements.txt").read_text() == "six\n"
    assert (done.rootfs / "etc" / "os-release").is_file()  # the base's files
    # the base is in the cache too, untouched by the build
    base_rootfs = done.user_dir / "images" / BASE_HEX / "rootfs"
    assert not (base_rootfs / "etc" / "greeting").exists()
    marker = done.marker
    assert marker["digest"] == done.image_build["key"]
    assert marker["reference"] == "build Containerfile"
    assert marker["build"] == {"file": "Containerfile", "base": BASE}
    assert marker["built_by_job"] == "1" and marker["runtime"] == "charliecloud"
    # the image's own variables: the base's and ENV's, not ARG's nor the agent's
    assert marker["env"] == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "APP_HOME": "/opt/app",
        "GREETING": "hello world",
    }
    run_env = done.runner.calls[0]["env"]
    assert run_env["VERSION"] == "1.2" and run_env["GREETING"] == "hello world"
    assert run_env["PIP_INDEX_URL"] == INDEX and run_env["PIP_TRUSTED_HOST"] == "n1"
    assert run_env["https_proxy"] == "http://10.77.6.1:3128" and run_env["HOME"] == "/root"
    assert done.runner.calls[0]["argv"][:2] == ["/bin/sh", "-c"]
    assert done.runner.calls[0]["cwd"] == "/srv/work"
    assert "build: done building" in done.lines
    assert any(
        line.startswith("image build Containerfile ") and "built in" in line for line in done.lines
    )
    # a second job of the user reuses it without running anything
    lines: list[str] = []
    again = imagebuild.ensure_build(
        done.user_dir, done.job_dir, done.image_build, "2", lines.append, settings(), failing_runner
    )
    assert again["built_by_job"] == "1"
    assert lines == [f"image build Containerfile {hex_key[:12]}: reused (built by job 1)"]
    listed = imagecache.listing(done.user_dir)
    built = [i for i in listed if i["digest"] == done.image_build["key"]]
    assert built and "env" not in built[0] and "built_on" not in built[0]
    assert built[0]["build"] == {"file": "Containerfile", "base": BASE}
    assert not list((done.user_dir / "images").glob(".build-*"))


def failing_runner(*_args) -> int:
    raise AssertionError("nothing is run for a ready image")


def test_run_exec_form_and_shell_and_the_agents_index_only_when_set(tmp_path):
    text = (
        'FROM n1:5000/tacc/base:bookworm\nSHELL ["/bin/bash", "-c"]\nRUN echo one\n'
        'RUN ["/bin/sh", "-c", "echo two"]\n'
    )
    user_dir, job_dir, image_build = make_job(tmp_path, text)
    runner = HostRunner()
    imagebuild.ensure_build(
        user_dir,
        job_dir,
        image_build,
        "1",
        lambda _l: None,
        settings(package_index=""),
        runner,
        StubPuller(),
    )
    assert runner.calls[0]["argv"] == ["/bin/bash", "-c", "echo one"]
    assert runner.calls[1]["argv"] == ["/bin/sh", "-c", "echo two"]
    assert "PIP_INDEX_URL" not in runner.calls[0]["env"]


def test_copy_follows_dockers_rules(tmp_path):
    text = """\
FROM n1:5000/tacc/base:bookworm
COPY src /dest/
COPY tool.sh /usr/local/bin/tool
COPY a.txt b.txt /many/
COPY *.cfg /configs/
COPY a.txt /app/
WORKDIR /w
COPY a.txt rel/
COPY a.txt /bin
"""
    files = {
        "src/x.py": "x\n",
        "src/pkg/y.py": "y\n",
        "tool.sh": "#!/bin/sh\n",
        "a.txt": "a\n",
        "b.txt": "b\n",
        "one.cfg": "1\n",
        "two.cfg": "2\n",
    }
    done = build(tmp_path, text, files, modes={"tool.sh": 0o755})
    root = done.rootfs
    # a directory source copies its contents, not itself
    assert (root / "dest" / "x.py").read_text() == "x\n"
    assert (root / "dest" / "pkg" / "y.py").read_text() == "y\n"
    assert not (root / "dest" / "src").exists()
    # a file to a name; its mode from the job's manifest
    assert (root / "usr" / "local" / "bin" / "tool").read_text() == "#!/bin/sh\n"
    assert (root / "usr" / "local" / "bin" / "tool").stat().st_mode & 0o777 == 0o755
    assert (root / "many" / "a.txt").is_file() and (root / "many" / "b.txt").is_file()
    assert sorted(p.name for p in (root / "configs").iterdir()) == ["one.cfg", "two.cfg"]
    # an absolute link in the image leads inside the rootfs, never to the host's /opt
    assert (root / "opt" / "app" / "a.txt").read_text() == "a\n"
    assert (root / "w" / "rel" / "a.txt").is_file()  # relative to WORKDIR
    assert (root / "usr" / "bin" / "a.txt").is_file()  # /bin -> usr/bin, a directory


@pytest.mark.bad_input
def test_several_sources_need_a_destination_directory(tmp_path):
    text = "FROM n1:5000/tacc/base:bookworm\nCOPY *.txt /one\n"
    user_dir, job_dir, image_build = make_job(tmp_path, text, {"a.txt": "a\n", "b.txt": "b\n"})
    with pytest.raises(AgentError, match=r"Containerfile:2: COPY with several sources"):
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
    images = user_dir / "images"
    assert not (images / image_build["key"].split(":")[1]).exists()
    assert not list(images.glob(".build-*"))


@pytest.mark.security
def test_a_copy_source_linking_outside_the_context_is_refused(tmp_path):
    text = "FROM n1:5000/tacc/base:bookworm\nCOPY secret.txt /s\n"
    user_dir, job_dir, image_build = make_job(tmp_path, text, {"secret.txt": "ok\n"})
    outside = tmp_path / "outside.txt"
    outside.write_text("ok\n")  # same content: the key still matches
    link = job_dir / "code" / "secret.txt"
    link.unlink()
    link.symlink_to(outside)
    with pytest.raises(AgentError, match="not a file inside the build context"):
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


@pytest.mark.security
def test_paths_in_the_image_never_leave_the_rootfs(tmp_path):
    rootfs = tmp_path / "rootfs"
    (rootfs / "etc").mkdir(parents=True)
    (rootfs / "up").symlink_to("../../../../..")
    (rootfs / "abs").symlink_to("/etc")
    (rootfs / "loop").symlink_to("loop")
    assert imagebuild.in_image(rootfs, "/up/etc/passwd") == rootfs / "etc" / "passwd"
    assert imagebuild.in_image(rootfs, "abs/x") == rootfs / "etc" / "x"
    assert imagebuild.in_image(rootfs, "/../../etc") == rootfs / "etc"
    with pytest.raises(AgentError, match="too many symbolic links"):
        imagebuild.in_image(rootfs, "/loop/x")


@pytest.mark.fault
def test_a_failing_run_fails_the_build_and_leaves_nothing(tmp_path):
    text = (
        "FROM n1:5000/tacc/base:bookworm\nRUN echo first\n"
        "RUN echo trying && echo broke >&2 && exit 3\n"
    )
    user_dir, job_dir, image_build = make_job(tmp_path, text)
    lines: list[str] = []
    with pytest.raises(AgentError) as caught:
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lines.append,
            settings(),
            HostRunner(),
            StubPuller(),
        )
    assert str(caught.value) == "Containerfile:3: RUN exited 3: broke"
    assert "build: first" in lines
    images = user_dir / "images"
    hex_key = image_build["key"].split(":")[1]
    assert not (images / hex_key).exists() and not list(images.glob(".build-*"))
    assert imagecache.ready(images / BASE_HEX)  # the base stays for the next try


@pytest.mark.fault
def test_a_step_past_the_timeout_says_so(tmp_path):
    def slow(*_args) -> int:
        raise imagebuild.StepTimeout

    text = "FROM n1:5000/tacc/base:bookworm\nRUN sleep 100\n"
    user_dir, job_dir, image_build = make_job(tmp_path, text)
    with pytest.raises(AgentError, match=r"Containerfile:2: RUN took longer than 7 s"):
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lambda _l: None,
            settings(step_timeout=7),
            slow,
            StubPuller(),
        )
    assert not list((user_dir / "images").glob(".build-*"))


@pytest.mark.fault
def test_the_real_runner_stops_a_step_at_its_timeout(tmp_path):
    fake = tmp_path / "ch-run"
    fake.write_text(
        '#!/bin/sh\nhere=$(dirname "$0")\necho "$@" > "$here/argv"\necho $$ > "$here/pid"\n'
        "echo started\nexec sleep 30\n"
    )
    fake.chmod(0o755)
    runner = imagebuild.ChRun(timeout=1, binary=str(fake))
    lines: list[str] = []
    with pytest.raises(imagebuild.StepTimeout):
        runner(tmp_path / "rootfs", ["sh", "-c", "x"], "/", tmp_path / "env", lines.append)
    assert lines == ["started"]
    # Stopped, not waited for: the step (its sleep) is gone when the runner gives up.
    assert not Path(f"/proc/{int((tmp_path / 'pid').read_text())}").exists()
    assert (tmp_path / "argv").read_text().split() == [
        "-w",
        "--uid=0",
        "--gid=0",
        "--private-tmp",
        "--unset-env=*",
        "--env-no-expand",
        f"--set-env={tmp_path / 'env'}",
        "--cd=/",
        str(tmp_path / "rootfs"),
        "--",
        "sh",
        "-c",
        "x",
    ]


@pytest.mark.security
def test_files_changed_since_submit_do_not_build(tmp_path):
    text = "FROM n1:5000/tacc/base:bookworm\nCOPY app.py /app.py\n"
    user_dir, job_dir, image_build = make_job(tmp_path, text, {"app.py": "print(1)\n"})
    (job_dir / "code" / "app.py").write_text("print(2)\n")
    puller = StubPuller()
    with pytest.raises(AgentError, match="does not match its key"):
        imagebuild.ensure_build(
            user_dir, job_dir, image_build, "1", lambda _l: None, settings(), HostRunner(), puller
        )
    assert puller.pulls == 0


def test_files_outside_the_copies_and_the_context_do_not_change_the_key(tmp_path):
    text = "FROM n1:5000/tacc/base:bookworm\nCOPY app.py /app.py\n"
    files = {"docker/app.py": "print(1)\n", "train.py": "x\n", "docker/notes.md": "n\n"}
    done = build(tmp_path, text, files, context="docker")
    assert (done.rootfs / "app.py").read_text() == "print(1)\n"
    (done.job_dir / "code" / "docker" / "notes.md").write_text("changed\n")
    imagecache.remove_tree(done.user_dir / "images" / done.image_build["key"].split(":")[1])
    imagebuild.ensure_build(
        done.user_dir,
        done.job_dir,
        done.image_build,
        "2",
        lambda _l: None,
        settings(),
        HostRunner(),
        StubPuller(),
    )


@pytest.mark.bad_input
def test_other_runtimes_are_refused_before_anything_is_done(tmp_path):
    user_dir, job_dir, image_build = make_job(tmp_path, "FROM n1:5000/tacc/base:bookworm\n")
    with pytest.raises(AgentError) as caught:
        imagebuild.ensure_build(
            user_dir,
            job_dir,
            image_build,
            "1",
            lambda _l: None,
            settings(runtime="apptainer"),
            HostRunner(),
        )
    assert str(caught.value) == (
        "local image builds need Charliecloud (container_runtime: charliecloud) on the node"
    )
    assert not (user_dir / "images").exists()


def test_what_an_interrupted_build_left_is_cleared(tmp_path):
    user_dir, job_dir, image_build = make_job(tmp_path, "FROM n1:5000/tacc/base:bookworm\n")
    hex_key = image_build["key"].split(":")[1]
    images = user_dir / "images"
    (images / f".build-{hex_key}-999" / "bundle").mkdir(parents=True)
    (images / hex_key / "rootfs").mkdir(parents=True)  # no marker: never finished
    imagebuild.ensure_build(
        user_dir, job_dir, image_build, "1", lambda _l: None, settings(), HostRunner(), StubPuller()
    )
    assert not (images / f".build-{hex_key}-999").exists()
    assert imagecache.ready(images / hex_key)["built_by_job"] == "1"


def test_the_env_file_passes_values_as_they_are(tmp_path):
    path = tmp_path / "env"
    values = {"A": "one two", "B": "it's", "C": '"dq"', "D": "$PATH:x", "E": "a=b", "F": ""}
    imagebuild.write_env_file(path, values, "Containerfile:3")
    assert env_file_values(path) == values
    assert path.stat().st_mode & 0o777 == 0o600
    with pytest.raises(AgentError, match="Containerfile:3: the variable 'G' holds a newline"):
        imagebuild.write_env_file(path, {"G": "a\nb"}, "Containerfile:3")


def concurrent_build(tmp_path: Path, image_build: dict, job_id: str) -> None:
    user_dir = tmp_path / "workspace" / "alice"
    runner = HostRunner(counter=tmp_path / "runs", delay=0.5)
    imagebuild.ensure_build(
        user_dir,
        user_dir / "jobs" / "abc-1",
        image_build,
        job_id,
        lambda _l: None,
        settings(),
        runner,
        StubPuller(),
    )


def test_concurrent_jobs_build_once_and_wait(tmp_path):
    text = "FROM n1:5000/tacc/base:bookworm\nRUN echo built\n"
    _user_dir, _job_dir, image_build = make_job(tmp_path, text)
    context = multiprocessing.get_context("fork")
    jobs = [
        context.Process(target=concurrent_build, args=(tmp_path, image_build, str(n)))
        for n in (1, 2, 3)
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(60)
    assert [job.exitcode for job in jobs] == [0, 0, 0]
    assert (tmp_path / "runs").read_text() == "run\n"


def task_with_build(image_build: dict) -> SimpleNamespace:
    return SimpleNamespace(
        image=None,
        image_build=image_build,
        datasets=[],
        environment={"env": {"OMP_NUM_THREADS": "2"}},
    )


def test_the_batch_step_builds_and_the_wrappers_find_the_build(tmp_path, monkeypatch):
    user_dir, job_dir, image_build = make_job(
        tmp_path, "FROM n1:5000/tacc/base:bookworm\nENV APP=1\nRUN true\n"
    )
    monkeypatch.setattr(imagecache, "SkopeoUmoci", lambda *_a, **_k: StubPuller())
    monkeypatch.setattr(imagebuild, "ChRun", lambda *_a, **_k: HostRunner())
    config = AgentConfig(
        workspace=str(tmp_path / "workspace"),
        container_binds=(),
        slurm_spool_dir="",
        container_gpu_driver_dir="",
    )
    task = task_with_build(image_build)
    container = execute.job_container(task, job_dir, config, prepare=True, job_id="7")
    hex_key = image_build["key"].split(":")[1]
    assert container.rootfs == user_dir / "images" / hex_key / "rootfs"
    assert container.env["APP"] == "1" and container.env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    recorded = imagecache.job_image(job_dir)
    assert recorded["digest"] == image_build["key"] and recorded["built_by_job"] == "7"
    assert (container.rootfs / str(user_dir).lstrip("/")).is_dir()  # the bind's mount point
    wrapper = execute.job_container(task, job_dir, config)
    assert wrapper.rootfs == container.rootfs and wrapper.env == container.env


@pytest.mark.bad_input
def test_the_batch_step_refuses_a_build_on_another_runtime(tmp_path):
    _user_dir, job_dir, image_build = make_job(tmp_path, "FROM n1:5000/tacc/base:bookworm\n")
    config = AgentConfig(workspace=str(tmp_path / "workspace"), container_runtime="enroot")
    with pytest.raises(AgentError, match="local image builds need Charliecloud"):
        execute.job_container(task_with_build(image_build), job_dir, config, prepare=True)
