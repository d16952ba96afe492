"""Bad input in a task's `image: {build: PATH}` and in its build file (issue [13]): each
case runs the real `tcloud submit` (not --dry-run) against a cluster that is a local port
counting connection attempts (tests/unit/client/test_bad_input_tcloud.py's harness), and must
exit 3 with the file, line (and in tcloud.yaml the column) and field and what is
expected, print no traceback and connect to nothing. A path that leaves the task
directory is a security case."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.unit.client.test_bad_input_tcloud import Sentinel, Tcloud, task_dir

pytestmark = pytest.mark.bad_input

BASE = "n1:5000/tacc/base:bookworm"
HEAD = "name: t\nrun: [python3 train.py]\n"
BUILD_HERE = HEAD + "image:\n  build: .\n"  # the value `.` is at 4:10
GOOD = f"FROM {BASE}\nCOPY requirements.txt /tmp/\nRUN pip install -r /tmp/requirements.txt\n"
RELATIVE = (
    "expected a path relative to the task directory, without '..' (and not absolute): a build "
    "file, or a directory holding Containerfile or Dockerfile"
)


@pytest.fixture
def tcloud(tmp_path):
    sentinel = Sentinel()
    yield Tcloud(tmp_path, sentinel)
    sentinel.close()


def project(root: Path, task: str = BUILD_HERE, build: str | bytes | None = GOOD) -> Path:
    task_dir(root, task)
    (root / "requirements.txt").write_text("numpy==2.0.0\n")
    if build is not None:
        data = build if isinstance(build, bytes) else build.encode()
        (root / "Containerfile").write_bytes(data)
    return root


# (id, task file, build file or None, fragments stderr must hold)
TASK_CASES = [
    (
        "parent-path",
        HEAD + "image:\n  build: ../Containerfile\n",
        GOOD,
        [f"tcloud.yaml:4:10: image.build: {RELATIVE}, got '../Containerfile'"],
    ),
    (
        "absolute-path",
        HEAD + "image:\n  build: /etc\n",
        GOOD,
        [f"tcloud.yaml:4:10: image.build: {RELATIVE}, got '/etc'"],
    ),
    (
        "empty-path",
        HEAD + "image:\n  build: ''\n",
        GOOD,
        [f"tcloud.yaml:4:10: image.build: {RELATIVE}, got ''"],
    ),
    (
        "a-mapping-without-build",
        HEAD + "image: {file: Containerfile}\n",
        GOOD,
        [
            "tcloud.yaml:3:8: image: expected an image reference with its registry",
            "got a mapping without 'build' (a build file is image: {build: PATH})",
        ],
    ),
    (
        "an-unknown-key",
        HEAD + "image: {build: ., pull: always}\n",
        GOOD,
        ["tcloud.yaml:3:19: image.pull: unknown key; known keys: build"],
    ),
    (
        "build-a-list",
        HEAD + "image: {build: [a, b]}\n",
        GOOD,
        ["tcloud.yaml:3:16: image.build: expected a path relative", "got a list"],
    ),
    (
        "no-such-path",
        HEAD + "image:\n  build: env\n",
        GOOD,
        ["tcloud.yaml:4:10: image.build: env: no such file or directory in the task directory"],
    ),
    (
        "no-build-file-in-the-directory",
        BUILD_HERE,
        None,
        ["tcloud.yaml:4:10: image.build: .: the directory holds no Containerfile or Dockerfile"],
    ),
    (
        "with-modules",
        BUILD_HERE + "environment:\n  modules: [gcc]\n",
        GOOD,
        ["tcloud.yaml:6:12: environment.modules: not with 'image'"],
    ),
    (
        "build-file-excluded",
        BUILD_HERE + "code:\n  exclude: [Containerfile]\n",
        GOOD,
        [
            "tcloud.yaml:4:10: image.build: Containerfile is left out of the upload by "
            "code.include, code.exclude or .tcloudignore"
        ],
    ),
    (
        "outside-the-code-directory",
        HEAD + "code:\n  workdir: src\nimage:\n  build: .\n",
        GOOD,
        [
            "tcloud.yaml:6:10: image.build: Containerfile is outside the code directory tcloud "
            "uploads (code.workdir 'src')"
        ],
    ),
]

# (id, build file, fragments): problems inside the build file name `Containerfile:<line>`.
BUILD_CASES = [
    ("empty", "", ["Containerfile: empty build file: expected FROM <image reference>"]),
    ("comments-only", "# nothing\n\n", ["Containerfile: empty build file"]),
    ("no-from", "RUN true\n", ["Containerfile:1: RUN: expected FROM <image reference> first"]),
    (
        "short-name",
        "FROM ubuntu:24.04\n",
        ["Containerfile:1: FROM: expected an image reference with its registry", "'ubuntu:24.04'"],
    ),
    (
        "platform",
        f"FROM --platform=linux/arm64 {BASE}\n",
        ["Containerfile:1: FROM: flags (--platform) are not supported"],
    ),
    (
        "multi-stage",
        f"FROM {BASE} AS a\nRUN true\nFROM {BASE}\n",
        [
            "Containerfile:3: FROM: a second FROM (line 1 is the first): multi-stage builds "
            "are not supported"
        ],
    ),
    (
        "user",
        f"FROM {BASE}\nUSER 1000\n",
        ["Containerfile:2: USER: not supported: the container runs as the job's user"],
    ),
    (
        "add",
        f"FROM {BASE}\nADD https://example.org/x.tgz /opt/\n",
        [
            "Containerfile:2: ADD: not supported: use COPY; ADD's URLs and archive unpacking "
            "are not supported"
        ],
    ),
    ("onbuild", f"FROM {BASE}\nONBUILD RUN true\n", ["Containerfile:2: ONBUILD: not supported"]),
    (
        "run-mount",
        f"FROM {BASE}\nRUN --mount=type=secret,id=k cat /run/secrets/k\n",
        ["Containerfile:2: RUN: flags (--mount=type=secret,id=k) are not supported"],
    ),
    (
        "copy-from",
        f"FROM {BASE}\nCOPY --from=other /x /x\n",
        ["Containerfile:2: COPY: flags (--from=other) are not supported"],
    ),
    (
        "copy-chown",
        f"FROM {BASE}\nCOPY --chown=root requirements.txt /x\n",
        ["Containerfile:2: COPY: flags (--chown=root) are not supported"],
    ),
    (
        "unknown-instruction",
        f"FROM {BASE}\nRUNN true\n",
        ["Containerfile:2: RUNN: unknown instruction RUNN"],
    ),
    (
        "shell-not-json",
        f"FROM {BASE}\nSHELL bash -c\n",
        ["Containerfile:2: SHELL: expected a JSON list of strings"],
    ),
    (
        "several-sources-no-slash",
        f"FROM {BASE}\nCOPY requirements.txt Containerfile /opt\n",
        ["Containerfile:2: COPY: several sources need a destination ending in '/'"],
    ),
    (
        "copy-matches-nothing",
        f"FROM {BASE}\nRUN true\nCOPY data/*.csv /data/\n",
        ["Containerfile:3: COPY: source 'data/*.csv' matches no file in the build context"],
    ),
    (
        "every-problem",
        f"FROM {BASE}\nUSER x\nADD a b\nHEALTHCHECK NONE\nVOLUME /v\nFOO\n",
        ["Containerfile:2: USER", "Containerfile:3: ADD", "Containerfile:6: FOO"],
    ),
    (
        "over-256-kib",
        f"FROM {BASE}\n" + "RUN true\n" * 30000,
        ["Containerfile: over 256 KiB: not a build file"],
    ),
]


@pytest.mark.parametrize(
    ("text", "build", "fragments"),
    [(text, build, fragments) for _, text, build, fragments in TASK_CASES],
    ids=[case for case, *_ in TASK_CASES],
)
def test_a_bad_build_field_is_refused_before_the_cluster(tcloud, tmp_path, text, build, fragments):
    root = project(tmp_path / "p", text, build)
    (root / "src").mkdir()
    stderr = tcloud.refused(tcloud("submit", str(root)), 3, *fragments)
    assert stderr.startswith(f"tcloud: error: {root}/tcloud.yaml:"), stderr


@pytest.mark.parametrize(
    ("build", "fragments"),
    [(build, fragments) for _, build, fragments in BUILD_CASES],
    ids=[case for case, *_ in BUILD_CASES],
)
def test_a_bad_build_file_is_refused_with_its_line(tcloud, tmp_path, build, fragments):
    root = project(tmp_path / "p", build=build)
    stderr = tcloud.refused(tcloud("submit", str(root)), 3, *fragments)
    assert stderr.startswith("tcloud: error: Containerfile"), stderr


def test_a_build_file_that_is_not_utf8(tcloud, tmp_path):
    root = project(tmp_path / "p", build=f"FROM {BASE}\nRUN echo \xff\n".encode("latin-1"))
    tcloud.refused(
        tcloud("submit", str(root)),
        3,
        "Containerfile:2: not UTF-8 text; save the build file as UTF-8",
    )


def test_a_copy_source_left_out_by_the_ignore_file(tcloud, tmp_path):
    root = project(tmp_path / "p")
    (root / ".tcloudignore").write_text("requirements.txt\n")
    tcloud.refused(
        tcloud("submit", str(root)),
        3,
        "Containerfile:2: COPY: source 'requirements.txt': its files are left out of the upload",
    )


def test_validate_reports_the_build_files_problems_too(tcloud, tmp_path):
    root = project(tmp_path / "p", build=f"FROM {BASE}\nUSER 1000\n")
    tcloud.refused(tcloud("validate", str(root)), 3, "Containerfile:2: USER: not supported")


@pytest.mark.security
def test_a_build_path_through_a_symlink_out_of_the_task_directory(tcloud, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "Containerfile").write_text(GOOD)
    root = project(tmp_path / "p", HEAD + "image:\n  build: env\n", None)
    os.symlink(outside, root / "env")
    tcloud.refused(
        tcloud("submit", str(root)),
        3,
        f"tcloud.yaml:4:10: image.build: env resolves to {outside}, outside the task directory",
    )


@pytest.mark.security
@pytest.mark.parametrize(
    "source", ["../secret.txt", "/etc/passwd", "a/../../secret.txt", "${UP}/secret.txt"]
)
def test_a_copy_source_out_of_the_context(tcloud, tmp_path, source):
    (tmp_path / "secret.txt").write_text("s3cret\n")
    build = f"FROM {BASE}\nARG UP=..\nCOPY {source} /x\n"
    root = project(tmp_path / "p", build=build)
    shown = source.replace("${UP}", "..")
    tcloud.refused(
        tcloud("submit", str(root)),
        3,
        f"Containerfile:3: COPY: source '{shown}': expected a path inside the build context",
    )


@pytest.mark.security
@pytest.mark.parametrize("name", ["Containerfile", "Dockerfile"])
@pytest.mark.parametrize("text", ["FROM n1:5000/s3cret/image:1\nRUN s3cret\n", "S3CRET=hunter2\n"])
def test_a_build_file_found_in_the_directory_linking_out_of_the_task_directory(
    tcloud, tmp_path, name, text
):
    """`build: .` finds Containerfile (or Dockerfile): a symlink to a file outside is
    refused before it is read -- its text is never shown nor its FROM resolved."""
    outside = tmp_path / "secret"
    outside.write_text(text)
    root = project(tmp_path / "p", build=None)
    os.symlink(outside, root / name)
    result = tcloud("submit", str(root))
    tcloud.refused(
        result,
        3,
        f"tcloud.yaml:4:10: image.build: ./{name} resolves outside the task directory",
    )
    assert "s3cret" not in (result.stderr + result.stdout).lower()
