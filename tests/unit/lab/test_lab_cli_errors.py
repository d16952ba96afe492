"""Bad input to tacc-lab: a clear one-line error, non-zero exit, no traceback, no change."""

import pytest

from tacc_lab.errors import LabError
from tacc_lab.prereqs import check_prerequisites
from tests.conftest import run_cli


def test_not_root_is_refused():
    with pytest.raises(LabError, match="must run as root"):
        check_prerequisites(euid=1000)


def test_missing_tools_name_the_packages():
    def which(cmd):
        return None if cmd in ("systemd-nspawn", "debootstrap") else f"/usr/bin/{cmd}"

    with pytest.raises(LabError) as err:
        check_prerequisites(euid=0, which=which)
    assert "debootstrap, systemd-nspawn" in str(err.value)
    assert "apt-get install debootstrap systemd-container" in str(err.value)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["up", "--nodes", "0"], "--nodes must be at least 1"),
        (["up", "--subnet", "8.8.8.0/24"], "not a private range"),
        (["up", "--subnet", "banana"], "not an IPv4 network"),
        (["--name", "Bad-Name", "status"], "lab name 'Bad-Name' is invalid"),
        (["ssh", "n1", "true"], "is not up"),
    ],
)
def test_bad_arguments(argv, message, tmp_path):
    proc = run_cli("tacc-lab", *argv, env={"TACC_LAB_STATE_ROOT": str(tmp_path / "state")})
    assert proc.returncode == 1
    assert message in proc.stderr
    assert proc.stderr.startswith("tacc-lab: error:")
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "state").exists()  # nothing was created


def test_status_of_absent_lab(tmp_path):
    proc = run_cli("tacc-lab", "status", env={"TACC_LAB_STATE_ROOT": str(tmp_path)})
    assert proc.returncode == 0
    assert "is down" in proc.stdout
