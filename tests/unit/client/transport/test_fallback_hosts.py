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


def fake_connect(answering: set[str], tried: list[str], error=ssh.Unreachable, asked=None):
    def connect(endpoint, known_hosts, sock=None, may_ask=True):
        tried.append(endpoint.hostname)
        if asked is not None:
            asked[endpoint.hostname] = may_ask
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


@pytest.mark.security
def test_a_fallback_hosts_unknown_key_is_refused_not_asked_about(cfg, monkeypatch):
    """Someone on the network can make `host` not answer; the fallback's key must then be
    known already: tcloud never asks a user to trust a new key at that moment."""
    tried: list[str] = []
    asked: dict[str, bool] = {}
    monkeypatch.setattr(ssh, "connect", fake_connect({"head2"}, tried, asked=asked))
    with ssh.session(Cluster(name="lab", host="head1", fallback_hosts=("head2",))):
        pass
    assert asked == {"head1": True, "head2": False}
    monkeypatch.setattr(ssh.sys.stdin, "isatty", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _prompt: pytest.fail("asked about a fallback"))
    known = ssh.known_hosts_file.load({cfg.parent / "known_hosts": None})
    policy = ssh.AskOrRefuse(cfg.parent / "known_hosts", known, may_ask=False)
    key = ssh.paramiko.RSAKey.generate(1024)
    with pytest.raises(TcloudError, match="unknown fallback host: head2 offers a ssh-rsa"):
        policy.missing_host_key(ssh.paramiko.SSHClient(), "head2", key)


@pytest.mark.security
def test_a_host_that_answers_but_not_as_ssh_should_is_not_passed_over(cfg, monkeypatch):
    """Only a host that does not answer at all (OSError: no route, refused, timed out) is
    skipped: a failed handshake stops tcloud there."""

    def handshake_fails(*args, **kwargs):
        raise ssh.paramiko.SSHException("Error reading SSH protocol banner")

    client = ssh.verifying_client(cfg.parent / "known_hosts")
    monkeypatch.setattr(client, "connect", handshake_fails)
    monkeypatch.setattr(ssh, "verifying_client", lambda *args, **kwargs: client)
    endpoint = ssh.Endpoint("head1", 22, "alice", [], None)
    with pytest.raises(TcloudError, match="head1:22: Error reading SSH protocol banner") as err:
        ssh.connect(endpoint, cfg.parent / "known_hosts")
    assert not isinstance(err.value, ssh.Unreachable)


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
