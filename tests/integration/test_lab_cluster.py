"""Boot a real 3-node lab, reach it with Ansible, grow it, and tear it down completely.

Runs in CI as root: nothing here is skipped. The lab is named `itest` on its own subnet,
so it never disturbs a developer's `make lab-up` lab.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tacc_lab.config import STATE_ROOT
from tacc_lab.proxy import default_pip_index_hosts
from tests.integration.lab_helpers import ansible, host_leftovers, lab_cli, lab_status, node_sh

pytestmark = pytest.mark.lab

NAME = "itest"
SUBNET = "10.77.9.0/24"
STATE_DIR = STATE_ROOT / NAME


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lab") / "hosts.yml"
    lab_cli(NAME, "down")  # a crashed earlier run must not leak into this one
    start = time.monotonic()
    proc = lab_cli(NAME, "up", "--nodes", "3", "--subnet", SUBNET, "--inventory", str(path))
    assert proc.returncode == 0, proc.stderr
    print(f"lab up: {time.monotonic() - start:.1f} s", file=sys.stderr)
    yield path
    lab_cli(NAME, "down")


def _ping_hosts(inventory: Path) -> set[str]:
    proc = ansible(inventory, "all", "-m", "ansible.builtin.ping")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {line.split()[0] for line in proc.stdout.splitlines() if "SUCCESS" in line}


def test_three_nodes_and_the_login_node_answer_ansible_ping(inventory):
    assert _ping_hosts(inventory) == {"login1", "n1", "n2", "n3"}
    groups = yaml.safe_load(inventory.read_text())["all"]["children"]
    assert list(groups["slurm_compute"]["hosts"]) == ["n2", "n3"]
    assert list(groups["login"]["hosts"]) == ["login1"]  # the production shape
    assert list(groups["nfs_server"]["hosts"]) == ["n1"]


def test_status_reports_running_nodes(inventory):
    status = lab_status(NAME)
    assert [(n["name"], n["address"], n["state"]) for n in status["nodes"]] == [
        ("login1", "10.77.9.10", "running"),
        ("n1", "10.77.9.11", "running"),
        ("n2", "10.77.9.12", "running"),
        ("n3", "10.77.9.13", "running"),
    ]
    assert status["bridge"].endswith("(up)")
    assert status["proxy"].endswith("(running)")


def test_up_again_is_a_noop(inventory):
    before = (STATE_DIR / "state.json").read_text()
    boot_id = node_sh(NAME, "n1", "cat /proc/sys/kernel/random/boot_id").stdout
    proc = lab_cli(NAME, "up", "--nodes", "3", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stderr
    assert "already up: nothing to do" in proc.stdout
    assert (STATE_DIR / "state.json").read_text() == before
    assert node_sh(NAME, "n1", "cat /proc/sys/kernel/random/boot_id").stdout == boot_id


def test_each_node_has_its_own_verified_host_key(inventory):
    known = (STATE_DIR / "ssh/known_hosts").read_text().splitlines()
    assert len(known) == 4
    assert len({line.split()[2] for line in known}) == 4  # no shared host key
    # With an empty known_hosts, strict checking refuses the node.
    empty = STATE_DIR / "ssh/empty_known_hosts"
    empty.write_text("")
    proc = subprocess.run(
        [
            "ssh",
            "-i",
            str(STATE_DIR / "ssh/id_ed25519"),
            "-o",
            f"UserKnownHostsFile={empty}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
            "root@10.77.9.11",
            "true",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
    )
    empty.unlink()
    assert proc.returncode != 0
    assert "Host key verification failed" in proc.stderr


def test_shared_directory_is_seen_by_every_node(inventory):
    assert node_sh(NAME, "n1", "echo from-n1 > /shared/probe").returncode == 0
    assert node_sh(NAME, "n3", "cat /shared/probe").stdout.strip() == "from-n1"


def test_registries_only_through_the_proxy(inventory):
    # No default route: the proxy on the bridge is the only way out.
    routes = node_sh(NAME, "n2", "ip -4 route").stdout
    assert "default" not in routes
    # apt reaches the host's Debian mirror through the proxy.
    apt = node_sh(NAME, "n2", "apt-get update -q")
    assert apt.returncode == 0, apt.stdout + apt.stderr
    # HTTPS to pip's index works (CONNECT + the host's CA certificates are trusted).
    index_host = sorted(default_pip_index_hosts(sys.executable))[-1]
    fetch = (
        ". /etc/environment; export https_proxy; python3 -c "
        f"\"import urllib.request as u; print(u.urlopen('https://{index_host}/simple/pip/').status)\""
    )
    proc = node_sh(NAME, "n2", fetch)
    assert proc.stdout.strip() == "200", proc.stdout + proc.stderr
    # Anything not on the allow-list is refused by the proxy itself (.invalid never resolves).
    refused = node_sh(
        NAME,
        "n2",
        'python3 -c "import urllib.request as u; '
        "h=u.ProxyHandler({'http': 'http://10.77.9.1:3128'}); "
        "u.build_opener(h).open('http://blocked.invalid/')\"",
    )
    assert refused.returncode != 0
    assert "403" in refused.stderr


def test_subnet_in_use_is_refused_without_side_effects(inventory, tmp_path):
    proc = lab_cli(
        "other", "up", "--nodes", "1", "--subnet", SUBNET, "--inventory", str(tmp_path / "x.yml")
    )
    assert proc.returncode == 1
    assert f"subnet {SUBNET} is already in use on this host by tacc-{NAME}" in proc.stderr
    assert "Traceback" not in proc.stderr
    lab_cli("other", "down")
    assert host_leftovers("other", STATE_ROOT / "other") == []


def test_up_with_one_more_node_leaves_others_untouched(inventory):
    before = {n["name"]: n for n in lab_status(NAME)["nodes"]}
    boot_ids = {
        node: node_sh(NAME, node, "cat /proc/sys/kernel/random/boot_id").stdout for node in before
    }
    proc = lab_cli(NAME, "up", "--nodes", "4", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stderr
    assert "started n4" in proc.stdout
    for node, boot_id in boot_ids.items():
        assert node_sh(NAME, node, "cat /proc/sys/kernel/random/boot_id").stdout == boot_id
    assert _ping_hosts(inventory) == {"login1", "n1", "n2", "n3", "n4"}
    shrink = lab_cli(NAME, "up", "--nodes", "2", "--inventory", str(inventory))
    assert shrink.returncode == 1
    assert "only adds nodes" in shrink.stderr
    no_login = lab_cli(NAME, "up", "--nodes", "4", "--no-login-node", "--inventory", str(inventory))
    assert no_login.returncode == 1
    assert "has a login node" in no_login.stderr


def test_down_leaves_nothing_behind(inventory):
    assert host_leftovers(NAME, STATE_DIR) != []
    proc = lab_cli(NAME, "down")
    assert proc.returncode == 0, proc.stderr
    assert host_leftovers(NAME, STATE_DIR) == []
    assert not inventory.exists()
    assert lab_cli(NAME, "down").returncode == 0  # idempotent
