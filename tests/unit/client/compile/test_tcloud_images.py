"""tcloud's side of container images (tcloud.compile.images): at submit the task's image
reference is resolved by the cluster's agent (`image resolve`), once, before anything
is uploaded, and its pinned form lands in the instruction (so the digest pins the
image); the agent's refusal is a task-file problem on the `image:` line (exit 3) and
nothing is uploaded; a task without an image costs no round trip; validate and dry run
do not connect and show the reference as written; `tcloud images` lists the cached
images and `tcloud status` the job's image.

The cluster is faked at the agent session (tcloud.transport.link.Link's place in tcloud.core):
each request is recorded and answered from a table, and `store` (the upload) is refused
by the fake, so a test sees every verb tcloud sent and whether an upload began."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
import yaml

from tacc_contract.instruction import parse
from tcloud import cli, core, dry_run
from tcloud.compile import images, tasks
from tcloud.errors import EXIT_CLUSTER, EXIT_INVALID_TASK, TaskFileError, TcloudError
from tcloud.jobs import verbs as jobs
from tcloud.transfer import upload as upload_module
from tcloud.transfer.upload import UploadResult
from tcloud.transport.agent import AgentMismatch
from tcloud.transport.link import Direct

REFERENCE = "n1:5000/tacc/base:bookworm"
DIGEST = "sha256:" + "ab" * 32
PINNED = f"{REFERENCE}@{DIGEST}"
RESOLVED = {"reference": REFERENCE, "pinned": PINNED, "digest": DIGEST}
NO_SUCH_IMAGE = (
    "the registry answered: reading manifest latest in n1:5000/tacc/nope: manifest unknown"
)
TASK_TEXT = f"name: t\nrun: [cat /etc/os-release]\n# the image to run in\nimage: {REFERENCE}\n"
IMAGE_LINE = 4  # where TASK_TEXT's `image:` value starts
IMAGE_COLUMN = 8


class FakeSession:
    """An agent session: every request recorded, answered from `answers` (verb words
    -> (rc, answer)); `store` means an upload began, which these tests must not see
    unless they ask for it."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, object]]) -> None:
        self.answers, self.verbs, self.dead = answers, [], False

    def request(self, verb, userdir, stdin=b"", produce=None):
        self.verbs.append(list(verb))
        assert verb[0] != "store", "an upload began"
        return self.answers[tuple(verb[:2])]

    def close(self) -> None:
        self.dead = True


class FakeLink:
    """What tcloud.core makes its `client` of: agent sessions only (no SSH)."""

    def __init__(self, session: FakeSession) -> None:
        self.session = session

    def agent_session(self) -> FakeSession:
        return self.session

    def close(self) -> None:
        pass


class FakeCluster:
    """A configured cluster `fake` whose agent is a FakeSession; an upload is captured
    (the instruction it would send) and answers a submitted job."""

    def __init__(self, tmp: Path, monkeypatch) -> None:
        config = tmp / "tcloud-config.yaml"
        settings = {"host": "cluster.invalid", "user": "alice", "userdir": "/w/alice"}
        config.write_text(yaml.safe_dump({"current": "fake", "clusters": {"fake": settings}}))
        monkeypatch.setenv("TCLOUD_CONFIG", str(config))
        monkeypatch.setenv("TCLOUD_CACHE_DIR", str(tmp / "cache"))
        monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
        self.session = FakeSession({("image", "resolve"): (0, RESOLVED)})
        self.uploaded: list = []
        monkeypatch.setattr(core, "Link", lambda *_args: FakeLink(self.session))
        # tcloud.core imports upload when a submit needs it (a lazy start-up import)
        monkeypatch.setattr(upload_module, "upload", self.upload)

    def upload(self, client, instruction, userdir, submit=False) -> UploadResult:
        self.uploaded.append(instruction)
        job = {"job_id": "7", "name": "t", "workdir": "/w/alice/jobs/7", "partition": "batch"}
        return UploadResult(job["workdir"], "/w/alice", 0, 0, 0.0, job)

    def answer(self, verb: tuple[str, ...], rc: int, answer: object) -> None:
        self.session.answers[verb] = (rc, answer)

    def cluster(self) -> core.Cluster:
        return core.Cluster(direct=Direct(no_ssh, lambda _settings: True))


def no_ssh(_settings):
    raise AssertionError("a direct SSH connection was opened")


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeCluster:
    return FakeCluster(tmp_path, monkeypatch)


def project(root: Path, text: str = TASK_TEXT) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "tcloud.yaml").write_text(text)
    (root / "train.py").write_text("print('hi')\n")
    return root


def cli_run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


# --- submit: resolved once, pinned in the instruction ------------------------------------


def test_submit_resolves_the_image_once_and_the_pinned_form_lands_in_the_instruction(
    fake, tmp_path
):
    task = project(tmp_path / "p")
    with fake.cluster() as cluster:
        job = cluster.submit(task)
    assert fake.session.verbs == [["image", "resolve", REFERENCE]]
    [instruction] = fake.uploaded
    assert instruction.document["task"]["image"] == PINNED
    assert job.submission.digest == instruction.digest
    assert job.submission.image == PINNED and job.submission.as_dict()["image"] == PINNED
    # The pinned form changes the digest (it covers the image's bits) ...
    assert instruction.digest != dry_run(task).digest
    # ... and is what the cluster's reading (pinned=True) accepts.
    spec = parse(json.dumps(instruction.document), "instruction", pinned=True)
    assert spec.image == PINNED


def test_another_digest_for_the_same_reference_is_another_instruction_digest(fake, tmp_path):
    task = project(tmp_path / "p")
    with fake.cluster() as cluster:
        cluster.submit(task)
        other = "sha256:" + "cd" * 32
        fake.answer(
            ("image", "resolve"), 0, {**RESOLVED, "pinned": f"{REFERENCE}@{other}", "digest": other}
        )
        cluster.submit(task)
    first, second = fake.uploaded
    assert first.digest != second.digest
    assert first.manifest_json() == second.manifest_json()


def test_a_task_without_an_image_never_asks_the_agent_to_resolve(fake, tmp_path):
    task = project(tmp_path / "p", "name: t\nrun: [echo hi]\n")
    with fake.cluster() as cluster:
        job = cluster.submit(task)
    assert fake.session.verbs == []
    assert "image" not in fake.uploaded[0].document["task"]
    assert job.submission.image is None


def test_a_sweep_resolves_its_image_once_for_all_its_trials(fake, tmp_path):
    text = TASK_TEXT + "sweep:\n  parameters: {LR: ['0.1', '0.01', '0.001']}\n"
    with fake.cluster() as cluster:
        cluster.submit(project(tmp_path / "p", text), sweep=True)
    assert fake.session.verbs == [["image", "resolve", REFERENCE]]
    assert fake.uploaded[0].document["task"]["image"] == PINNED


def test_a_dict_task_is_resolved_too(fake, tmp_path):
    base = project(tmp_path / "p")
    task = {"name": "t", "run": ["true"], "image": REFERENCE}
    with fake.cluster() as cluster:
        cluster.submit(task, base_dir=base)
    assert fake.uploaded[0].document["task"]["image"] == PINNED


# --- the agent's refusal: a task problem on the image line, nothing uploaded ----------------


@pytest.mark.parametrize(
    ("rc", "said"),
    [
        (2, NO_SUCH_IMAGE),
        (
            3,
            'pinging container registry n1:5000: Get "http://n1:5000/v2/": dial tcp '
            "10.77.0.11:5000: connect: connection refused",
        ),
    ],
    ids=["unknown-reference", "registry-unreachable"],
)
def test_an_agent_refusal_is_a_positioned_task_file_error_and_nothing_is_uploaded(
    fake, tmp_path, rc, said
):
    fake.answer(("image", "resolve"), rc, {"error": said, "field": "image"})
    task = project(tmp_path / "p")
    with fake.cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(task)
    [problem] = refused.value.problems
    assert problem.path == str(task / "tcloud.yaml")
    assert (problem.line, problem.column, problem.field) == (IMAGE_LINE, IMAGE_COLUMN, "image")
    assert REFERENCE in problem.message and said in problem.message
    assert refused.value.exit_code == EXIT_INVALID_TASK
    assert fake.uploaded == []
    assert fake.session.verbs == [["image", "resolve", REFERENCE]]  # no store: no upload


def test_the_cli_prints_the_refusal_with_file_line_and_field_and_exits_3(
    fake, tmp_path, monkeypatch
):
    fake.answer(("image", "resolve"), 2, {"error": NO_SUCH_IMAGE, "field": "image"})
    monkeypatch.chdir(project(tmp_path / "p"))
    code, out, err = cli_run("submit")
    assert code == EXIT_INVALID_TASK, err
    expected = (
        f"tcloud: error: tcloud.yaml:{IMAGE_LINE}:{IMAGE_COLUMN}: image: the cluster cannot "
        f"resolve {REFERENCE}: {NO_SUCH_IMAGE}\n"
    )
    assert err == expected and out == ""
    assert fake.uploaded == []


def test_a_dict_tasks_refusal_names_the_field_without_a_line(fake, tmp_path):
    fake.answer(("image", "resolve"), 2, {"error": NO_SUCH_IMAGE, "field": "image"})
    task = {"name": "t", "run": ["true"], "image": REFERENCE}
    with fake.cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(task, base_dir=project(tmp_path / "p"))
    assert str(refused.value) == (
        f"task: image: the cluster cannot resolve {REFERENCE}: {NO_SUCH_IMAGE}"
    )
    assert fake.uploaded == []


def test_an_agent_without_the_verb_is_a_version_mismatch_not_a_task_problem(fake, tmp_path):
    said = "tacc-agent: argument command: invalid choice: 'image' (choose from 'hello', 'job')"
    fake.answer(("image", "resolve"), 2, {"error": said, "field": ""})
    with fake.cluster() as cluster, pytest.raises(AgentMismatch, match="image resolve") as exc:
        cluster.submit(project(tmp_path / "p"))
    assert exc.value.exit_code == EXIT_CLUSTER
    assert fake.uploaded == []


@pytest.mark.parametrize(
    "answer",
    [
        {**RESOLVED, "pinned": f"n1:5000/tacc/other:bookworm@{DIGEST}"},  # another image
        {**RESOLVED, "pinned": REFERENCE},  # not pinned
        {**RESOLVED, "digest": "sha256:" + "00" * 32},  # disagrees with itself
        {**RESOLVED, "pinned": f"n1:5000/tacc/base:trixie@{DIGEST}"},  # another tag
        {**RESOLVED, "pinned": f"n1:5000/tacc/base@{DIGEST}"},  # the tag dropped
    ],
    ids=["other-repository", "unpinned", "other-digest", "other-tag", "no-tag"],
)
def test_an_answer_that_is_not_the_image_pinned_is_refused(fake, tmp_path, answer):
    fake.answer(("image", "resolve"), 0, answer)
    with fake.cluster() as cluster, pytest.raises(TcloudError, match="not that image pinned"):
        cluster.submit(project(tmp_path / "p"))
    assert fake.uploaded == []


@pytest.mark.security
def test_an_answer_that_replaces_the_digest_the_user_pinned_is_refused(fake, tmp_path):
    """The user pinned the bits: an agent (or registry) answering another digest for the
    same name must not change what runs."""
    other = "sha256:" + "cd" * 32
    fake.answer(
        ("image", "resolve"),
        0,
        {"reference": PINNED, "pinned": f"{REFERENCE}@{other}", "digest": other},
    )
    with fake.cluster() as cluster, pytest.raises(TcloudError, match="not that image pinned"):
        cluster.submit(project(tmp_path / "p", TASK_TEXT.replace(REFERENCE, PINNED)))
    assert fake.uploaded == []


def test_an_answer_keeping_the_digest_the_user_pinned_is_taken(fake, tmp_path):
    fake.answer(("image", "resolve"), 0, {**RESOLVED, "reference": PINNED})
    with fake.cluster() as cluster:
        cluster.submit(project(tmp_path / "p", TASK_TEXT.replace(REFERENCE, PINNED)))
    assert fake.uploaded


# --- no cluster: validate and dry run show the reference as written -------------------------


def test_validate_and_dry_run_do_not_connect_and_show_the_reference_as_written(
    fake, tmp_path, monkeypatch
):
    monkeypatch.setattr(core, "Link", lambda *_args: pytest.fail("connected"))
    monkeypatch.chdir(project(tmp_path / "p"))
    code, out, _ = cli_run("validate")
    assert code == 0
    assert f"image {REFERENCE} (as written; resolved to a digest at submit)" in out
    code, out, _ = cli_run("validate", "--json")
    assert json.loads(out)["image"] == REFERENCE
    code, out, _ = cli_run("submit", "--dry-run")
    assert code == 0
    assert f"image: {REFERENCE} (as written; resolved to a digest at submit" in out
    code, out, _ = cli_run("submit", "--dry-run", "--json")
    assert json.loads(out)["instruction"]["task"]["image"] == REFERENCE
    assert tasks.validate(".").spec.image == REFERENCE


# --- tcloud images, tcloud status ---------------------------------------------------------

IMAGES = [
    {
        "digest": DIGEST,
        "reference": PINNED,
        "path": "/w/alice/images/" + "ab" * 32,
        "pulled_by_job": "12",
        "seconds": 41.5,
        "bytes": 312 * 1024 * 1024,
        "runtime": "charliecloud",
        "time": 1764000000.0,
    },
    {
        "digest": "sha256:" + "cd" * 32,
        "reference": "n1:5000/tacc/tiny@sha256:" + "cd" * 32,
        "path": "/w/alice/images/" + "cd" * 32,
    },
]


def test_images_lists_the_cached_images_as_a_table_and_as_json(fake):
    fake.answer(("image", "ls"), 0, IMAGES)
    with fake.cluster() as cluster:
        assert cluster.images() == IMAGES
    code, out, _ = cli_run("images")
    assert code == 0
    header, first, second = out.splitlines()
    assert header.split() == ["DIGEST", "REFERENCE", "RUNTIME", "PULLED_BY_JOB", "SIZE", "PATH"]
    # The digest once, in its column; the reference as the task named it (tag kept).
    assert first.split() == [DIGEST, REFERENCE, "charliecloud", "12", "312.0M", IMAGES[0]["path"]]
    assert second.split() == [IMAGES[1]["digest"], "n1:5000/tacc/tiny", IMAGES[1]["path"]]
    code, out, _ = cli_run("images", "--json")
    assert json.loads(out) == IMAGES
    assert fake.session.verbs.count(["image", "ls"]) == 3


def test_images_with_none_cached_prints_the_header_only(fake):
    fake.answer(("image", "ls"), 0, [])
    code, out, _ = cli_run("images")
    assert (code, out.split()) == (
        0,
        ["DIGEST", "REFERENCE", "RUNTIME", "PULLED_BY_JOB", "SIZE", "PATH"],
    )


def test_an_images_answer_of_the_wrong_shape_is_a_cluster_error(fake):
    fake.answer(("image", "ls"), 0, [{"digest": DIGEST}])
    code, _, err = cli_run("images")
    assert code == EXIT_CLUSTER and "reference" in err and "Traceback" not in err


STATUS = {
    "job_id": "7",
    "name": "t",
    "state": "COMPLETED",
    "workdir": "/w/alice/jobs/7",
    "exit_code": 0,
}


@pytest.mark.parametrize(
    ("image", "line"),
    [
        (
            {"reference": PINNED, "digest": DIGEST, "path": "/w/alice/images/x"},
            f"image: {PINNED} (cached in /w/alice/images/x)",
        ),
        ({"reference": REFERENCE, "digest": DIGEST}, f"image: {PINNED}"),
    ],
    ids=["pinned", "tag-and-digest-apart"],
)
def test_status_shows_the_jobs_pinned_image(fake, image, line):
    fake.answer(("job", "status"), 0, {**STATUS, "image": image})
    code, out, _ = cli_run("status", "7")
    assert code == 0 and line in out.splitlines()
    out = io.StringIO()
    jobs.describe({**STATUS, "image": None}, out)
    assert "image" not in out.getvalue()


@pytest.mark.parametrize(
    ("count", "shown"),
    [
        (None, ""),
        (0, "0B"),
        (1023, "1023B"),
        (1024, "1.0K"),
        (int(1.5 * 1024**3), "1.5G"),
        (3 * 1024**5, "3072.0T"),
    ],
)
def test_sizes_are_shown_for_people(count, shown):
    assert images.size(count) == shown


def test_the_registrys_answer_is_shown_on_one_line_without_terminal_escapes(fake, tmp_path):
    said = f"{REFERENCE}: reading manifest latest:\n  manifest unknown\x1b[2J\n"  # named once
    fake.answer(("image", "resolve"), 2, {"error": said, "field": "image"})
    with fake.cluster() as cluster, pytest.raises(TaskFileError) as refused:
        cluster.submit(project(tmp_path / "p"))
    assert refused.value.problems[0].message == (
        f"the cluster cannot resolve {REFERENCE}: reading manifest latest:; "
        "manifest unknown\\x1b[2J"
    )


def test_the_cli_says_which_digest_it_pinned(fake, tmp_path, monkeypatch):
    monkeypatch.chdir(project(tmp_path / "p"))
    code, out, _ = cli_run("submit")
    assert code == 0 and f"  image {PINNED}" in out.splitlines()
    code, out, _ = cli_run("submit", "--json")
    assert json.loads(out)["image"] == PINNED
