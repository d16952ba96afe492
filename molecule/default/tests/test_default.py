"""Verify the smoke converge on every lab node (testinfra, over the lab's SSH)."""

import json


def test_marker_written_from_facts(host):
    marker = host.file("/etc/tacc-molecule-marker")
    assert marker.exists
    assert marker.mode == 0o644
    release = host.check_output(". /etc/os-release && echo $VERSION_ID")  # the lab's release
    assert marker.content_string == f"{host.check_output('hostname')} Debian {release}\n"


def test_package_installed_through_proxy(host):
    assert host.package("jq").is_installed
    assert json.loads(host.check_output("echo '{\"a\": 1}' | jq -c .")) == {"a": 1}


def test_node_is_a_booted_systemd_machine(host):
    assert host.run("systemctl is-system-running").stdout.strip() in ("running", "degraded")
    assert host.service("ssh").is_running
