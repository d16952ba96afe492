"""tcloud's side of an image built from the task's build file (`image: {build: PATH}`,
tcloud.compile.imagebuild): at submit the build file's base is resolved by the cluster like an
`image:` reference (before any upload), the key is computed from exactly the files its
COPY steps read, and `task.image_build` {file, context, base, key} lands in the
instruction before its digest is taken; validate and dry run do not connect; a base the
cluster cannot resolve is a problem of the build file's FROM line (exit 3); `tcloud
images` and `tcloud status` show builds.

The cluster is faked at the agent session as in test_tcloud_images."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import pytest

from tacc_contract.buildfile import build_key, parse
from tacc_contract.errors import EXIT_INVALID_TASK, TaskFileError
from tacc_contract.instruction import parse as parse_instruction
from tcloud import core, dry_run, validate
from tcloud.compile import images
from tcloud.jobs import verbs as jobs
from tests.unit.client.compile.test_tcloud_images import (
    DIGEST,
    NO_SUCH_IMAGE,
    PINNED,
    REFERENCE,
    FakeCluster,
    cli_run,
)

TASK_TEXT = "name: t\nrun: [python3 train.py]\nimage:\n  build: .\n"
BUILD_TEXT = (
    "# the task's image\n"
    f"FROM {REFERENCE}\n"
    "COPY requirements.txt /tmp/\n"
    "RUN pip install -r /tmp/requirements.txt\n"
)
REQUIREMENTS = "numpy==2.0.0\n"


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    return FakeCluster(tmp_path, monkeypatch)


def project(root: Path, task: str = TASK_TEXT, build: str = BUILD_TEXT, where: str = "") -> Path:
    (root / where).mkdir(parents=True, exist_ok=True)
    (root / "tcloud.yaml").write_text(task)
    (root / "train.py").write_text("print('hi')\n")
    (root / where / "Containerfile").write_text(build)
    (root / where / "requirements.txt").write_text(REQUIREMENTS)
    return root


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def expected_key(build_text: str = BUILD_TEXT, files: dict[str, str] | None = None) -> str:
    """The key as the agent recomputes it: from the build file and the context's files
    (sha256 by path; none of them executable)."""
    files = files or {"requirements.txt": sha256(REQUIREMENTS)}
    keyed = {path: (digest, False) for path, digest in files.items()}
    return build_key(parse(build_text, "Containerfile"), PINNED, keyed)


def test_submit_resolves_the_base_once_and_writes_the_build_into_the_instruction(fake, tmp_path):
    task = project(tmp_path / "p")
    with fake.cluster() as cluster:
        job = cluster.submit(task)
    assert fake.session.verbs == [["image", "resolve", REFERENCE]]
    [instruction] = fake.uploaded
    build = instruction.document["task"]["image_build"]
    assert build == {"file": "Containerfile", "context": "", "base": PINNED, "key": expected_key()}
    assert "image" not in instruction.document["task"]
    assert job.submission.image_build == build and job.submission.image is None
    # What the cluster reads (pinned=True) accepts it, and the digest covers the key.
    spec = parse_instruction(json.dumps(instruction.document), "instruction", pinned=True)
    assert spec.image_build == build
    assert instruction.digest != dry_run(task).digest


def test_the_key_follows_the_copied_files_only(fake, tmp_path):
    task = project(tmp_path / "p")
    with fake.cluster() as cluster:
        cluster.submit(task)
        (task / "train.py").write_text("print('changed')\n")  # not copied into the image
        cluster.submit(task)
        (task / "requirements.txt").write_text("numpy==2.1.0\n")  # copied
        cluster.submit(task)
    first, second, third = (i.document["task"]["image_build"]["key"] for i in fake.uploaded)
    assert first == second != third
    assert third == expected_key(files={"requirements.txt": sha256("numpy==2.1.0\n")})


def test_a_build_in_a_subdirectory_has_it_as_its_context(fake, tmp_path):
    task = project(tmp_path / "p", TASK_TEXT.replace("build: .", "build: env"), where="env")
    with fake.cluster() as cluster:
        cluster.submit(task)
    build = fake.uploaded[0].document["task"]["image_build"]
    assert (build["file"], build["context"]) == ("env/Containerfile", "env")
    assert build["key"] == expected_key()
    assert "code/env/requirements.txt" in fake.uploaded[0].manifest


def test_a_build_file_named_directly_and_a_dockerfile(fake, tmp_path):
    task = project(tmp_path / "p", TASK_TEXT.replace("build: .", "build: env/Dockerfile"))
    (task / "env").mkdir()
    (task / "Containerfile").rename(task / "env" / "Dockerfile")
    (task / "requirements.txt").rename(task / "env" / "requirements.txt")
    with fake.cluster() as cluster:
        cluster.submit(task)
    build = fake.uploaded[0].document["task"]["image_build"]
    assert (build["file"], build["context"]) == ("env/Dockerfile", "env")


def test_paths_are_relative_to_the_uploaded_code_directory(fake, tmp_path):
    text = "name: t\nrun: [x]\ncode:\n  workdir: src\nimage:\n  build: src/env\n"
    task = project(tmp_path / "p", text, where="src/env")
    with fake.cluster() as cluster:
        cluster.submit(task)
    build = fake.uploaded[0].document["task"]["image_build"]
    assert (build["file"], build["context"]) == ("env/Containerfile", "env")
    assert "code/env/Containerfile" in fake.uploaded[0].manifest


def test_a_dict_task_builds_too(fake, tmp_path):
    base = project(tmp_path / "p")
    with fake.cluster() as cluster:
        cluster.submit({"name": "t", "run": ["x"], "image": {"build": "."}}, base_dir=base)
    assert fake.uploaded[0].document["task"]["image_build"]["key"] == expected_key()


def test_a_base_the_cluster_cannot_resolve_is_a_problem_of_the_from_line(
    fake, tmp_path, monkeypatch
):
    fake.answer(("image", "resolve"), 2, {"error": NO_SUCH_IMAGE, "field": "image"})
    task = project(tmp_path / "p")
    with fake.cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(task)
    [problem] = refused.value.problems
    assert (problem.path, problem.line, problem.field) == ("Containerfile", 2, "FROM")
    assert f"the cluster cannot resolve {REFERENCE}: {NO_SUCH_IMAGE}" == problem.message
    assert fake.uploaded == []
    monkeypatch.chdir(task)
    code, out, err = cli_run("submit")
    assert code == EXIT_INVALID_TASK and out == ""
    assert err == (
        f"tcloud: error: Containerfile:2: FROM: the cluster cannot resolve {REFERENCE}: "
        f"{NO_SUCH_IMAGE}\n"
    )


def test_a_bad_build_file_is_refused_before_the_cluster_is_asked(fake, tmp_path):
    task = project(tmp_path / "p", build=BUILD_TEXT + "USER nobody\n")
    with fake.cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(task)
    assert str(refused.value) == (
        "Containerfile:5: USER: not supported: the container runs as the job's user"
    )
    assert fake.session.verbs == [] and fake.uploaded == []


def test_the_cli_says_what_it_built_from(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path / "p"))
    code, out, _ = cli_run("submit")
    key = expected_key().removeprefix("sha256:")[:12]
    assert code == 0
    assert f"  image: built from Containerfile (key {key}) FROM {PINNED}" in out.splitlines()
    code, out, _ = cli_run("submit", "--json")
    assert json.loads(out)["image_build"]["key"] == expected_key()


def test_validate_and_dry_run_do_not_connect_and_show_the_build(fake, tmp_path, monkeypatch):
    monkeypatch.setattr(core, "Link", lambda *_args: pytest.fail("connected"))
    monkeypatch.chdir(project(tmp_path / "p"))
    shown = f"image build Containerfile FROM {REFERENCE} (built on the cluster once per content"
    code, out, _ = cli_run("validate")
    assert code == 0 and shown in out
    code, out, _ = cli_run("validate", "--json")
    assert json.loads(out)["image_build"] == {"file": "Containerfile", "base": REFERENCE}
    code, out, _ = cli_run("submit", "--dry-run")
    assert code == 0 and shown in out and "the key is computed at submit" in out
    code, out, _ = cli_run("submit", "--dry-run", "--json")
    build = json.loads(out)["instruction"]["task"]["image_build"]
    assert build == {"file": "Containerfile", "context": "", "base": REFERENCE}
    assert validate(".").spec.image_build == {"build": "."}


BUILT = {
    "digest": "sha256:" + "ef" * 32,
    "reference": "build env/Containerfile",
    "path": "/w/alice/images/" + "ef" * 32,
    "build": {"file": "env/Containerfile", "base": PINNED},
    "built_by_job": "31",
    "bytes": 2 * 1024 * 1024,
    "runtime": "charliecloud",
}


def test_images_shows_a_build_with_its_file_base_and_job(fake):
    pulled = {
        "digest": DIGEST,
        "reference": PINNED,
        "path": "/w/alice/images/" + "ab" * 32,
        "pulled_by_job": "12",
    }
    fake.answer(("image", "ls"), 0, [pulled, BUILT])
    code, out, _ = cli_run("images")
    assert code == 0
    _, first, second = out.splitlines()
    assert first.split() == [DIGEST, REFERENCE, "12", pulled["path"]]
    assert second.split() == [
        BUILT["digest"],
        "build",
        "env/Containerfile",
        "FROM",
        REFERENCE,
        "charliecloud",
        "31",
        "2.0M",
        BUILT["path"],
    ]
    assert images.by_job(BUILT) == "31"


def test_status_shows_the_build_a_job_ran_in() -> None:
    out = io.StringIO()
    info = {"job_id": "7", "name": "t", "state": "RUNNING", "workdir": "/w/alice/jobs/7"}
    jobs.describe({**info, "image": BUILT}, out)
    assert (
        f"image: built from env/Containerfile (key {'ef' * 6}) FROM {PINNED} "
        f"(cached in {BUILT['path']})"
    ) in out.getvalue().splitlines()
