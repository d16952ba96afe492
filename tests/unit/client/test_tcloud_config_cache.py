"""tcloud clusters config and the local hash cache."""

from __future__ import annotations

import os

import pytest

from tcloud import config
from tcloud.errors import TcloudError
from tcloud.transfer.hashcache import HashCache
from tcloud.transfer.manifest import sha256_file
from tcloud.transport.ssh import resolve
from tests.conftest import run_cli


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLOUD_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
    return tmp_path / "config.yaml"


def test_several_clusters_and_switching_with_one_line(cfg):
    config.set_cluster("lab", {"host": "10.77.0.11", "user": "alice"})
    config.set_cluster("prod", {"host": "login.example", "port": 2222, "proxy_jump": "bastion"})
    assert config.cluster().name == "lab"  # the first one added is current
    config.use("prod")
    current = config.cluster()
    assert (current.name, current.port, current.proxy_jump) == ("prod", 2222, "bastion")
    assert oct(cfg.stat().st_mode & 0o777) == "0o600"
    with pytest.raises(TcloudError, match="no cluster 'nope'; known: lab, prod"):
        config.use("nope")


def test_cli_config_add_use_ls_json(cfg):
    env = {"TCLOUD_CONFIG": str(cfg)}
    assert run_cli("tcloud", "config", "add", "a", "--host", "h1", env=env).returncode == 0
    assert run_cli("tcloud", "config", "add", "b", "--host", "h2", env=env).returncode == 0
    assert run_cli("tcloud", "config", "use", "b", env=env).returncode == 0
    listing = run_cli("tcloud", "config", "ls", "--json", env=env)
    assert '"current": true' in listing.stdout
    missing = run_cli("tcloud", "config", "add", "c", env=env)
    assert missing.returncode == 4 and "needs --host" in missing.stderr


def test_ssh_config_fills_what_the_entry_leaves_out(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh/id_test").write_text("not a real key\n")
    (home / ".ssh/config").write_text(
        "Host tacc\n  HostName 10.1.2.3\n  User bob\n  Port 2200\n"
        f"  IdentityFile {home}/.ssh/id_test\n  ProxyJump jump.example\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr("pathlib.Path.home", lambda: home)
    endpoint = resolve("tacc")
    assert (endpoint.hostname, endpoint.user, endpoint.port) == ("10.1.2.3", "bob", 2200)
    assert endpoint.keys == [f"{home}/.ssh/id_test"]
    assert endpoint.proxy_jump == "jump.example"
    assert resolve("tacc", user="carol").user == "carol"


def test_hash_cache_skips_unchanged_files_and_notices_changes(tmp_path):
    data = tmp_path / "data.bin"
    data.write_bytes(b"a" * 1000)
    with HashCache(tmp_path / "cache.sqlite") as cache:
        first = cache(data, data.stat())
        second = cache(data, data.stat())
        assert first == second == sha256_file(data)
        assert (cache.misses, cache.hits) == (1, 1)
        data.write_bytes(b"b" * 1000)
        os.utime(data, ns=(1, 1))
        assert cache(data, data.stat()) == sha256_file(data) != first
        assert cache.misses == 2
