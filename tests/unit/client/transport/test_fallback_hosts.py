"""A cluster's fallback login hosts (issue [21]: a controller that survives its node):
tcloud tries them in order when `host` does not answer, and only then."""

from __future__ import annotations

import pytest

from tcloud import config
from tcloud.config import Cluster
from tcloud.errors import TcloudError
from tcloud.transport import ssh
from tests.conftest import run_cli


@pytest.fixture
def cfg(tmp_path, monkeypatch):
    monkeypatch.setenv("TCLOUD_CONFIG", str(tmp_path / "config.yaml"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("TCLOUD_CLUSTER", raising=False)
    return tmp_path / "config.yaml"


class Client:
    def __init__(self, host: str) -> None:
        self.host = host
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fake_connect(answering: set[str], tried: list[str], error=ssh.Unreachable):
    def connect(endpoint, known_hosts, sock=None):
        tried.append(endpoint.hostname)
        if endpoint.hostname not in answering:
            raise error(f"cannot connect to {endpoint.hostname}:22: No route to host")
        return Client(endpoint.hostname)

    return connect


def test_the_first_fallback_that_answers_is_used(cfg, monkeypatch):
    tried: list[str] = []
    monkeypatch.setattr(ssh, "connect", fake_connect({"head2"}, tried))
    cluster = Cluster(name="lab", host="head1", fallback_hosts=("head2", "head3"))
    with ssh.session(cluster) as client:
        assert client.host == "head2"
    assert tried == ["head1", "head2"]


def test_the_host_itself_is_used_while_it_answers(cfg, monkeypatch):
    tried: list[str] = []
    monkeypatch.setattr(ssh, "connect", fake_connect({"head1", "head2"}, tried))
    with ssh.session(Cluster(name="lab", host="head1", fallback_hosts=("head2",))) as client:
        assert client.host == "head1"
    assert tried == ["head1"]


@pytest.mark.fault
def test_no_host_answering_names_every_one_tried(cfg, monkeypatch):
    tried: list[str] = []
    monkeypatch.setattr(ssh, "connect", fake_connect(set(), tried))
    with (
        pytest.raises(TcloudError, match=r"head1:22.*; cannot connect to head2:22"),
        ssh.session(Cluster(name="lab", host="head1", fallback_hosts=("head2",))),
    ):
        pass
    assert tried == ["head1", "head2"]


@pytest.mark.security
def test_a_host_key_mismatch_is_not_passed_over_for_a_fallback(cfg, monkeypatch):
    """A host that answers with the wrong key may be someone in the middle: tcloud stops
    there instead of trying the next host (only a host that does not answer is skipped)."""
    tried: list[str] = []
    monkeypatch.setattr(ssh, "connect", fake_connect(set(), tried, error=TcloudError))
    with (
        pytest.raises(TcloudError),
        ssh.session(Cluster(name="lab", host="head1", fallback_hosts=("head2",))),
    ):
        pass
    assert tried == ["head1"]


def test_config_add_keeps_fallback_hosts_in_order(cfg):
    env = {"TCLOUD_CONFIG": str(cfg)}
    argv = ["tcloud", "config", "add", "lab", "--host", "h1"]
    argv += ["--fallback-host", "h3", "--fallback-host", "h2"]
    assert run_cli(*argv, env=env).returncode == 0
    assert config.cluster("lab").fallback_hosts == ("h3", "h2")
    config.set_cluster("lab", {"user": "alice"})  # an update keeps them
    assert config.cluster("lab").fallback_hosts == ("h3", "h2")


@pytest.mark.bad_input
@pytest.mark.parametrize("value", ["h2", [""], [2], {"h2": 1}])
def test_fallback_hosts_that_are_not_a_list_of_names_are_refused(cfg, value):
    cfg.write_text(
        config.yaml.safe_dump({"clusters": {"lab": {"host": "h1", "fallback_hosts": value}}})
    )
    with pytest.raises(
        TcloudError, match="cluster 'lab': fallback_hosts must be a list of host names"
    ):
        config.cluster("lab")
