"""Bad input in a task's `image:` field (issue [13]): each case runs the real `tcloud
submit` (not --dry-run) against a cluster that is a local port counting connection
attempts (tests/unit/client/test_bad_input_tcloud.py's harness), and must exit 3 with the file,
line, column and field and what is expected, print no traceback and connect to nothing.
Also the SDK's dict task: the same problem, the field named without a line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tcloud import validate
from tcloud.errors import TaskFileError
from tests.unit.client.test_bad_input_tcloud import Sentinel, Tcloud, task_dir

pytestmark = pytest.mark.bad_input

EXPECTED = (
    "image: expected an image reference with its registry: host[:port]/path/name[:tag] or "
    "host[:port]/path/name@sha256:<64 hex digits> (e.g. n1:5000/tacc/base:bookworm)"
)
NOT_WITH_IMAGE = (
    "not with 'image': modules are the node's software, which the container does not see "
    "(build it into the image; Python packages may go in environment.requirements, "
    "installed on top of the image)"
)
HEAD = "name: t\nrun: [cat /etc/os-release]\n"
WITH_IMAGE = HEAD + "image: n1:5000/tacc/base:bookworm\n"

# (id, task file, fragments stderr must hold: file:line:column: field: what is expected)
CASES = [
    (
        "no-registry-host",
        HEAD + "image: tacc/base:bookworm\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'tacc/base:bookworm'"],
    ),
    (
        "docker-hub-short-name",
        HEAD + "image: ubuntu\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'ubuntu'"],
    ),
    (
        "uppercase-path",
        HEAD + "image: n1:5000/Tacc/Base:bookworm\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'n1:5000/Tacc/Base:bookworm'"],
    ),
    (
        "bad-digest",
        HEAD + "image: n1:5000/tacc/base@sha256:abc\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'n1:5000/tacc/base@sha256:abc'"],
    ),
    (
        "md5-digest",
        HEAD + "image: n1:5000/tacc/base@md5:" + "0" * 32 + "\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'n1:5000/tacc/base@md5:"],
    ),
    (
        "port-out-of-range",
        HEAD + "image: n1:99999/tacc/base\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got 'n1:99999/tacc/base'"],
    ),
    (
        "a-list",
        HEAD + "image: [n1:5000/tacc/base:bookworm]\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got a list"],
    ),
    (
        "a-mapping",
        HEAD + "image: {ref: n1:5000/tacc/base}\n",
        [f"tcloud.yaml:3:8: {EXPECTED}, got a mapping"],
    ),
    (
        "with-modules",
        WITH_IMAGE + "environment:\n  modules: [gcc]\n",
        [f"tcloud.yaml:5:12: environment.modules: {NOT_WITH_IMAGE}"],
    ),
    (
        "modules-beside-requirements",
        WITH_IMAGE + "environment:\n  requirements: [numpy]\n  lock: [numpy==2.0.0]"
        "\n  modules: [gcc]\n",
        ["tcloud.yaml:7:12: environment.modules: not with 'image'"],
    ),
]


@pytest.fixture
def tcloud(tmp_path):
    sentinel = Sentinel()
    yield Tcloud(tmp_path, sentinel)
    sentinel.close()


@pytest.mark.parametrize(
    ("text", "fragments"),
    [(text, fragments) for _, text, fragments in CASES],
    ids=[case for case, *_ in CASES],
)
def test_a_bad_image_field_is_refused_before_the_cluster(tcloud, tmp_path, text, fragments):
    project = task_dir(tmp_path / "p", text)
    stderr = tcloud.refused(tcloud("submit", str(project)), 3, *fragments)
    assert stderr.startswith(f"tcloud: error: {project}/tcloud.yaml:")


def test_env_goes_with_an_image(tmp_path: Path):
    project = task_dir(tmp_path / "p", WITH_IMAGE + "environment:\n  env: {A: '1'}\n")
    assert validate(project).spec.image == "n1:5000/tacc/base:bookworm"


def test_requirements_and_a_lock_go_with_an_image(tmp_path: Path):
    # Issue [24]: a venv on top of the image (its own Python), not a build file.
    text = WITH_IMAGE + "environment:\n  requirements: [numpy]\n  lock: [numpy==2.0.0]\n"
    spec = validate(task_dir(tmp_path / "p", text)).spec
    assert spec.environment["requirements"] == ["numpy"]
    assert spec.environment["lock"] == ["numpy==2.0.0"]


@pytest.mark.parametrize(
    ("image", "environment", "message"),
    [
        ("tacc/base", {}, f"task: {EXPECTED}, got 'tacc/base'"),
        (["n1:5000/tacc/base"], {}, f"task: {EXPECTED}, got a list"),
        (
            "n1:5000/tacc/base",
            {"modules": ["gcc"]},
            f"task: environment.modules: {NOT_WITH_IMAGE}",
        ),
    ],
    ids=["no-registry-host", "a-list", "with-modules"],
)
def test_a_dict_tasks_bad_image_names_the_field_without_a_line(
    tmp_path, image, environment, message
):
    task = {"name": "t", "run": ["true"], "image": image, "environment": environment}
    with pytest.raises(TaskFileError) as refused:
        validate(task, base_dir=task_dir(tmp_path / "p", ""))
    assert str(refused.value) == message
