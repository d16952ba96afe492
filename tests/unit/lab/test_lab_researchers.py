"""The lab's researchers: their keys, their tcloud config, and `tacc-lab user NAME`."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from tacc_lab.config import LabConfig
from tacc_lab.errors import LabError
from tacc_lab.researchers import ensure_researcher_keys, write_user_config
from tacc_lab.state import LabState, NodeRecord, save_state
from tcloud import config as tcloud_config
from tests.conftest import run_cli


@pytest.fixture
def lab(tmp_path) -> LabConfig:
    return LabConfig.create("lab", "10.77.0.0/24", state_root=tmp_path / "state")


def test_one_key_per_researcher_created_once(lab):
    keys = ensure_researcher_keys(lab)
    # olga: the operator; carol, dave: the directory's
    assert sorted(keys) == ["alice", "bob", "carol", "dave", "olga"]
    assert keys["alice"].startswith("ssh-ed25519 ")
    assert keys["alice"].endswith(" alice@tacc-lab-lab")
    private = lab.researcher_key("alice")
    assert private == lab.state_dir / "users/alice/id_ed25519"
    assert private.stat().st_mode & 0o777 == 0o600
    assert private.parent.stat().st_mode & 0o777 == 0o700
    assert ensure_researcher_keys(lab) == keys  # not regenerated


def test_user_config_is_what_tcloud_reads(lab, monkeypatch):
    ensure_researcher_keys(lab)
    path = write_user_config(lab, "bob", "10.77.0.11")
    assert path == lab.users_dir / "bob/tcloud.yaml"
    assert path.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv("TCLOUD_CONFIG", str(path))
    monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
    cluster = tcloud_config.cluster()
    assert (cluster.name, cluster.host, cluster.user) == ("lab", "10.77.0.11", "bob")
    assert cluster.key == str(lab.researcher_key("bob"))
    assert cluster.known_hosts == str(lab.known_hosts)
    assert cluster.userdir is None  # the cluster decides
    assert cluster.fallback_hosts == ()


def test_user_config_of_a_lab_with_a_backup_controller_falls_back_to_it(lab, monkeypatch):
    ensure_researcher_keys(lab)
    path = write_user_config(lab, "bob", "10.77.0.11", ["10.77.0.13"])
    monkeypatch.setenv("TCLOUD_CONFIG", str(path))
    monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
    assert tcloud_config.cluster().fallback_hosts == ("10.77.0.13",)


def test_user_config_needs_a_researcher_and_a_key(lab):
    with pytest.raises(
        LabError, match=r"'mallory' is not a lab user.*alice, bob, olga, carol, dave"
    ):
        write_user_config(lab, "mallory", "10.77.0.11")
    with pytest.raises(LabError, match="run `tacc-lab up`"):
        write_user_config(lab, "alice", "10.77.0.11")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        (
            "mallory",
            "'mallory' is not a lab user; the users are: alice, bob, olga, carol, dave",
        ),
        ("alice", "is not up"),
    ],
)
def test_user_command_errors(name, message, tmp_path):
    proc = run_cli("tacc-lab", "user", name, env={"TACC_LAB_STATE_ROOT": str(tmp_path / "s")})
    assert proc.returncode == 1
    assert proc.stderr.startswith("tacc-lab: error:")
    assert message in proc.stderr
    assert proc.stdout == ""
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("name", ["alice", "olga"])  # olga: the operator, the same way
def test_user_command_prints_exports_for_eval(lab, tmp_path, name):
    ensure_researcher_keys(lab)
    state = LabState(subnet="10.77.0.0/24")
    state.nodes["n1"] = NodeRecord(name="n1", index=1, address="10.77.0.11")
    save_state(lab.state_file, state)
    proc = run_cli("tacc-lab", "user", name, env={"TACC_LAB_STATE_ROOT": str(lab.state_root)})
    assert proc.returncode == 0, proc.stderr
    config = lab.users_dir / name / "tcloud.yaml"
    assert proc.stdout.splitlines() == [
        f"export TCLOUD_CONFIG={shlex.quote(str(config))}",
        f"export TCLOUD_CACHE_DIR={shlex.quote(str(lab.users_dir / name / 'cache'))}",
    ]
    shell = subprocess.run(
        ["bash", "-c", 'eval "$1" && echo "$TCLOUD_CONFIG"', "-", proc.stdout],
        capture_output=True,
        text=True,
        check=True,
    )
    assert shell.stdout.strip() == str(config)
    assert config.exists()
