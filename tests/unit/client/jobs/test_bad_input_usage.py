"""Usage errors of `tcloud` exit 2 as argparse's do (issue [11] point 7): a bad job id, a
path argument that does not exist or cannot be used. One line `tcloud: error: ...`, no
traceback, and the cluster (a port that counts connections) is never contacted."""

from __future__ import annotations

import pytest

from tests.unit.client.test_bad_input_tcloud import Sentinel, Tcloud

pytestmark = pytest.mark.bad_input


@pytest.fixture
def tcloud(tmp_path):
    sentinel = Sentinel()
    yield Tcloud(tmp_path, sentinel)
    sentinel.close()


USAGE_CASES = [
    # (id, argv, what the one error line holds)
    ("status-word", ["status", "abc"], "not a job id: abc (expected numbers such as 1234"),
    ("cancel-command", ["cancel", "1;rm"], "not a job id: 1;rm"),
    ("cancel-one-bad-of-two", ["cancel", "12", "12_x"], "not a job id: 12_x"),
    ("logs-substitution", ["logs", "$(id)"], "not a job id: $(id)"),
    ("halt-negative", ["halt", "-5"], "not a job id: -5"),
    ("resume-float", ["resume", "1.5"], "not a job id: 1.5"),
    ("rerun-space", ["rerun", "1 2"], "not a job id: 1 2"),
    ("validate-missing-path", ["validate", "{tmp}/nowhere"], "path {tmp}/nowhere: no such file"),
    ("submit-missing-path", ["submit", "{tmp}/nowhere"], "path {tmp}/nowhere: no such file"),
    (
        "dry-run-missing-path",
        ["submit", "--dry-run", "{tmp}/nowhere/tcloud.yaml"],
        "path {tmp}/nowhere/tcloud.yaml: no such file or directory",
    ),
    ("plugins-missing-path", ["plugins", "{tmp}/nowhere"], "path {tmp}/nowhere: no such file"),
    (
        "download-dest-parent-missing",
        ["download", "12", "{tmp}/no/such/dir"],
        "{tmp}/no/such/dir: no such directory {tmp}/no/such",
    ),
    (
        "download-dest-is-a-file",
        ["download", "12", "{tmp}/a-file"],
        "{tmp}/a-file: exists and is not a directory",
    ),
    ("upload-missing-path", ["upload", "{tmp}/nowhere"], "{tmp}/nowhere does not exist"),
    ("cat-outside", ["cat", "../x"], "path '../x' is outside your cluster directory"),
]


@pytest.mark.parametrize(
    ("argv", "fragment"), [c[1:] for c in USAGE_CASES], ids=[c[0] for c in USAGE_CASES]
)
def test_a_usage_error_exits_2_with_one_line(tcloud, tmp_path, argv, fragment):
    (tmp_path / "a-file").write_text("x\n")
    argv = [word.replace("{tmp}", str(tmp_path)) for word in argv]
    stderr = tcloud.refused(
        tcloud(*argv, cwd=tmp_path), 2, fragment.replace("{tmp}", str(tmp_path))
    )
    assert stderr.startswith("tcloud: error: ") and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "no").exists()


def test_a_bad_job_id_is_refused_before_the_config_is_read(tcloud, tmp_path):
    """Nothing about the cluster is needed to refuse it: not even a readable config."""
    proc = tcloud("status", "abc", env={"TCLOUD_CONFIG": str(tmp_path / "none.yaml")})
    tcloud.refused(proc, 2, "not a job id: abc")
