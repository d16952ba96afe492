"""Issue [15] on the slurm lab: operating the cluster (docs/monitoring.md,
docs/operations.md, docs/usage.md).

Prometheus on the controller (n1) finds every agent and node exporter through the cluster
DNS and reports them up; a node drained by a failing check fires its alert and
Alertmanager's webhook receives it; `tcloud usage` matches the jobs the test ran (read
from slurmdbd); a rolling reboot of the compute nodes in two waves keeps a checkpointing
job alive; a rolling upgrade brings a package to the version its repository now has and
reboots the node; the cluster's DNS reaches a node whose /etc/resolv.conf systemd-resolved
owns, or a DHCP client would rewrite. The node that joins with a failed acceptance test:
test_slurm_cluster's add-node test.

Collected as part of test_slurm_cluster.py (which imports these tests), so they run on
its lab and its researchers alice and bob.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tacc_lab.inventory import ALERT_WEBHOOK_PORT
from tests.conftest import ROOT
from tests.integration.lab_helpers import (
    CHECKPOINTING_COUNTER,
    node_sh,
    playbook,
    resumed_log,
    submit,
    wait_state,
)
from tests.integration.labs import SLURM_LAB

HOSTS = {"login1", "n1", "n2", "n3"}

# Asks the controller's Prometheus (loopback only) for something, from n1 itself.
PROMETHEUS_QUERY = """
import json, sys, urllib.parse, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
path = sys.argv[1]
print(json.dumps(json.load(opener.open("http://127.0.0.1:9090" + path, timeout=10))["data"]))
"""

# Alertmanager's webhook: every POST body appended as one line to a file.
WEBHOOK = f"""
import http.server
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open("/root/alerts.jsonl", "ab") as out:
            out.write(body.replace(b"\\n", b" ") + b"\\n")
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", {ALERT_WEBHOOK_PORT}), Hook).serve_forever()
"""


def prometheus(path: str) -> dict | list:
    node_sh(SLURM_LAB, "n1", f"cat > /root/promq.py <<'EOF'\n{PROMETHEUS_QUERY}\nEOF")
    proc = node_sh(SLURM_LAB, "n1", f"python3 /root/promq.py '{path}'")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def up_targets() -> set[tuple[str, str]]:
    active = prometheus("/api/v1/targets?state=active")["activeTargets"]
    return {(t["labels"]["job"], t["labels"]["instance"]) for t in active if t["health"] == "up"}


def test_o1_prometheus_reports_every_agent_and_node_exporter_up(cluster):
    wanted = {(job, host) for job in ("tacc_agent", "node") for host in HOSTS}
    deadline = time.monotonic() + 90
    while not wanted <= (found := up_targets()):
        assert time.monotonic() < deadline, f"not up: {sorted(wanted - found)}"
        time.sleep(3)
    # The controller's agent exports the cluster-wide Slurm figures.
    series = prometheus("/api/v1/query?query=tacc_agent_slurm_up")["result"]
    assert {s["metric"]["daemon"]: s["value"][1] for s in series} == {
        "slurmctld": "1",
        "slurmdbd": "1",
    }
    nodes = prometheus("/api/v1/query?query=sum(tacc_agent_slurm_nodes)")["result"]
    assert nodes and float(nodes[0]["value"][1]) == 2  # n2 and n3


def test_o2_a_node_drained_by_a_failing_check_fires_its_alert_to_the_webhook(cluster):
    """The agent on n3 watches a tmpfs (1 s checks, on the real agent's port, so Prometheus
    scrapes it); the tmpfs goes, the agent drains n3, TaccNodeDrainedByCheck fires and
    Alertmanager posts it to the webhook on n1."""
    hook = f"cat > /root/hook.py <<'EOF'\n{WEBHOOK}\nEOF\n"
    node_sh(
        SLURM_LAB,
        "n1",
        f"rm -f /root/alerts.jsonl; {hook}systemd-run --unit tacc-test-hook python3 /root/hook.py",
    )
    settings = "services: [munge, slurmd]\nmounts: [{path: /mnt/tacc-alert, fstype: tmpfs}]\n"
    node_sh(
        SLURM_LAB,
        "n3",
        "systemctl stop tacc-agent; mkdir -p /mnt/tacc-alert && "
        f"mount -t tmpfs tmpfs /mnt/tacc-alert && printf '{settings}' > /tmp/alert.yaml && "
        "systemd-run --unit tacc-agent-alert tacc-agent --config /tmp/alert.yaml serve "
        "--interval 1",
    )
    try:
        node_sh(SLURM_LAB, "n3", "umount /mnt/tacc-alert")
        deadline = time.monotonic() + 120
        fired: list[dict] = []
        while not fired:
            assert time.monotonic() < deadline, node_sh(
                SLURM_LAB, "n1", "cat /root/alerts.jsonl"
            ).stdout
            time.sleep(3)
            lines = node_sh(SLURM_LAB, "n1", "cat /root/alerts.jsonl 2>/dev/null").stdout
            fired = [
                alert
                for line in lines.splitlines()
                if line.strip()
                for alert in json.loads(line)["alerts"]
                if alert["labels"]["alertname"] == "TaccNodeDrainedByCheck"
                and alert["status"] == "firing"
            ]
        assert fired[0]["labels"]["instance"] == "n3", fired
        said = json.dumps(fired[0]["annotations"])
        assert "mounts" in said, said
    finally:
        node_sh(
            SLURM_LAB,
            "n3",
            "systemctl stop tacc-agent-alert; umount /mnt/tacc-alert; "
            "scontrol update NodeName=n3 State=RESUME; systemctl start tacc-agent",
        )
        node_sh(SLURM_LAB, "n1", "systemctl stop tacc-test-hook")
    deadline = time.monotonic() + 30
    while "n3 idle" not in node_sh(SLURM_LAB, "n1", "sinfo -h -N -o '%N %t'").stdout:
        assert time.monotonic() < deadline, "n3 never came back"
        time.sleep(1)


def usage_total(tcloud, since: str) -> dict:
    proc = tcloud("usage", "--since", since, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["total"]


def sacct_cpu_seconds(jobs: list[str]) -> int:
    out = node_sh(
        SLURM_LAB,
        "n1",
        f"sacct -X -n -P -D --format=JobIDRaw,AllocCPUS,ElapsedRaw -j {','.join(jobs)}",
    ).stdout
    return sum(
        int(cpus) * int(seconds)
        for _, cpus, seconds in (line.split("|") for line in out.splitlines() if line)
    )


def test_o3_tcloud_usage_matches_the_jobs_the_test_ran(alice, tmp_path):
    today = time.strftime("%Y-%m-%d", time.gmtime())
    before = usage_total(alice, today)
    jobs = []
    for index, nodes in enumerate((1, 2)):
        root = tmp_path / f"u{index}"
        root.mkdir()
        task = {
            "name": f"usage{index}",
            "resources": {"nodes": nodes, "mem": "100M", "time": "5"},
            "run": ["sleep 3"],
        }
        (root / "tcloud.yaml").write_text(json.dumps(task))
        jobs.append(submit(alice, root))
    for job in jobs:
        assert wait_state(alice, job, ("COMPLETED",), 180)["state"] == "COMPLETED"
    expected = sacct_cpu_seconds(jobs)
    assert expected > 0
    deadline = time.monotonic() + 60  # slurmdbd records a job a moment after it ends
    while (after := usage_total(alice, today))["jobs"] != before["jobs"] + 2:
        assert time.monotonic() < deadline, (before, after)
        time.sleep(2)
    gained = after["cpu_seconds"] - before["cpu_seconds"]
    assert abs(gained - expected) <= 2, (gained, expected, before, after)
    assert after["gpu_hours"] == before["gpu_hours"]  # the lab has no GPUs
    # The ops report (root on the controller) has alice's row, and refuses a researcher.
    report = node_sh(SLURM_LAB, "n1", f"tacc-agent report usage --since {today} --format json")
    assert report.returncode == 0, report.stderr
    assert "alice" in {row["user"] for row in json.loads(report.stdout)["rows"]}
    assert (
        node_sh(SLURM_LAB, "login1", "su -s /bin/sh alice -c 'tacc-agent report usage'").returncode
        == 4
    )


def test_o7_quota_shows_her_association_and_no_association_cannot_submit(alice):
    """Accounting enforces associations (molecule's `cluster` scenario checks the same on
    its own inventory under `make molecule`): `tcloud quota` shows alice her account, and
    a user in no account cannot submit."""
    proc = alice("quota", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["user"] == "alice" and info["accounting"] is True, info
    assert "research" in {a["Account"] for a in info["associations"]}, info
    refused = node_sh(SLURM_LAB, "login1", "cd /tmp && runuser -u nobody -- sbatch --wrap true")
    assert refused.returncode != 0 and "Invalid account" in refused.stderr, refused.stderr


@pytest.mark.fault
def test_o4_a_rolling_reboot_in_two_waves_keeps_a_checkpointing_job_alive(cluster, alice, tmp_path):
    root = tmp_path / "counter"
    root.mkdir()
    (root / "count.py").write_text(CHECKPOINTING_COUNTER)
    task = {
        "name": "counter",
        "resources": {"nodes": 1, "mem": "100M", "time": "30"},
        "run": ["python3 count.py"],
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    job = submit(alice, root)
    try:
        wait_state(alice, job, ("RUNNING",), 120)
        time.sleep(5)
        before = node_sh(SLURM_LAB, "n1", "cut -d' ' -f22 /proc/1/stat").stdout  # n1 stays up
        boots = {
            n: node_sh(SLURM_LAB, n, "cut -d' ' -f22 /proc/1/stat").stdout for n in ("n2", "n3")
        }
        started = time.monotonic()
        run, changed = playbook(
            cluster,
            "playbooks/rolling.yml",
            "--limit",
            "n2,n3",
            "-e",
            "rolling_wave=1",
            "-e",
            "rolling_running_jobs=checkpoint",
            "-e",
            "rolling_checkpoint_grace=5",
        )
        seconds = time.monotonic() - started
        # Two waves of one node each, both rebooted for real (their init started again).
        assert run.stdout.count("PLAY [Rolling maintenance of the compute nodes]") == 2, run.stdout
        for node, boot in boots.items():
            assert node_sh(SLURM_LAB, node, "cut -d' ' -f22 /proc/1/stat").stdout != boot, node
        assert node_sh(SLURM_LAB, "n1", "cut -d' ' -f22 /proc/1/stat").stdout == before
        assert changed["n2"] > 0 and changed["n3"] > 0
        print(f"rolling reboot of n2, n3 in two waves: {seconds:.1f} s")
        # The job lives on: running again, from its checkpoint (its count goes on).
        log = resumed_log(alice, job)
        # A job that starts on n2 is requeued by both waves (n2's, then n3's); the log
        # keeps each node's lines together, so every resume is matched to any checkpoint.
        saved = {int(n) for n in re.findall(r"checkpoint (\d+)", log)}
        resumed = {int(n) for n in re.findall(r"start at ([1-9]\d*) on", log)}
        assert resumed <= saved and min(resumed) >= 5, log[-3000:]
        assert wait_state(alice, job, ("RUNNING",), 120)["state"] == "RUNNING"
        states = node_sh(SLURM_LAB, "n1", "sinfo -h -N -n n2,n3 -o '%N %t'").stdout
        assert "drain" not in states and "down" not in states, states  # both back in service
    finally:  # a job left running would hold a node from every later case
        alice("cancel", job)
    wait_state(alice, job, ("CANCELLED",), 60)


# A flat apt repository on the node (file:, trusted) holding version VERSION of a tiny
# package (a site package standing in for a driver or slurmd update); with KEEP=1 the
# Packages index of the repository is not rewritten (the version installed by dpkg).
UPGRADE_PROBE = "tacc-upgrade-probe"
UPGRADE_REPO = "/opt/tacc-upgrade-probe"
BUILD_PROBE = f"""set -eu
build=$(mktemp -d)
mkdir -p "$build/DEBIAN" "$build/usr/share/{UPGRADE_PROBE}" {UPGRADE_REPO}
printf '%s\\n' "$VERSION" > "$build/usr/share/{UPGRADE_PROBE}/version"
control="$build/DEBIAN/control"
printf 'Package: {UPGRADE_PROBE}\\nVersion: %s\\nArchitecture: all\\n' "$VERSION" > "$control"
printf 'Maintainer: tacc tests <root@localhost>\\nDescription: upgrade probe\\n' >> "$control"
deb={UPGRADE_REPO}/{UPGRADE_PROBE}_"$VERSION"_all.deb
dpkg-deb --root-owner-group --build "$build" "$deb" >/dev/null
rm -rf "$build"
cd {UPGRADE_REPO}
{{ dpkg-deb --field "$deb"; echo "Filename: ./$(basename "$deb")"
   echo "Size: $(stat -c %s "$deb")"
   echo "SHA256: $(sha256sum "$deb" | cut -d' ' -f1)"; }} > Packages
"""


def installed_probe(node: str) -> str:
    return node_sh(SLURM_LAB, node, f"dpkg-query -W -f '${{Version}}' {UPGRADE_PROBE}").stdout


def test_o5_a_rolling_upgrade_brings_the_new_version_and_reboots(cluster):
    setup = (
        f"VERSION=1.0; {BUILD_PROBE}\ndpkg -i {UPGRADE_REPO}/{UPGRADE_PROBE}_1.0_all.deb\n"
        f"VERSION=2.0; {BUILD_PROBE}\n"
        f"echo 'deb [trusted=yes] file:{UPGRADE_REPO} ./' "
        f"> /etc/apt/sources.list.d/{UPGRADE_PROBE}.list"
    )
    proc = node_sh(SLURM_LAB, "n3", setup)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert installed_probe("n3") == "1.0"
    boot = node_sh(SLURM_LAB, "n3", "cut -d' ' -f22 /proc/1/stat").stdout
    try:
        packages = json.dumps({"rolling_upgrade_packages": [UPGRADE_PROBE]})
        run, changed = playbook(
            cluster,
            "playbooks/rolling.yml",
            "--limit",
            "n3",
            "-e",
            "rolling_action=upgrade_reboot",
            "-e",
            packages,
        )
        # The node's package lists were read again: 2.0 is installed, then it rebooted.
        assert installed_probe("n3") == "2.0", run.stdout[-3000:]
        assert node_sh(SLURM_LAB, "n3", "cut -d' ' -f22 /proc/1/stat").stdout != boot
        assert changed["n3"] > 0
        state = node_sh(SLURM_LAB, "n1", "sinfo -h -N -n n3 -o %t").stdout.strip()
        assert state in ("idle", "mix", "alloc"), state  # back in service
    finally:
        node_sh(
            SLURM_LAB,
            "n3",
            f"rm -rf /etc/apt/sources.list.d/{UPGRADE_PROBE}.list "
            f"{UPGRADE_REPO}; dpkg --purge {UPGRADE_PROBE}",
        )


def common_only(tmp_path: Path, cluster: Path, host: str) -> tuple[str, int]:
    """The common role alone on host (what sets the resolver); its output and changed=."""
    book = tmp_path / "common.yml"
    book.write_text(
        json.dumps(
            [
                {
                    "hosts": host,
                    "gather_facts": True,
                    "gather_subset": ["min"],
                    "roles": [{"role": str(ROOT / "roles/common")}],
                }
            ]
        )
    )
    run, changed = playbook(cluster, str(book))
    return run.stdout, changed[host]


def test_o6_the_cluster_dns_reaches_nodes_with_resolved_or_a_dhcp_client(cluster, tmp_path):
    hook = "/etc/dhcp/dhclient-enter-hooks.d/tacc-keep-resolv-conf"
    nm_conf = "/etc/NetworkManager/conf.d/90-tacc-cluster-dns.conf"
    dropin = "/etc/systemd/resolved.conf.d/90-tacc-cluster-dns.conf"
    # The node image has neither /etc/dhcp nor /etc/NetworkManager: both are removed after.
    node_sh(
        SLURM_LAB,
        "login1",
        "cp /etc/resolv.conf /root/resolv.conf.saved && "
        "mkdir -p /etc/dhcp/dhclient-enter-hooks.d /etc/NetworkManager/conf.d",
    )
    try:
        # A DHCP client and NetworkManager: told to leave the file alone.
        output, changed = common_only(tmp_path, cluster, "login1")
        assert changed == 2, output
        found = node_sh(SLURM_LAB, "login1", f"cat {hook} {nm_conf}").stdout
        assert "make_resolv_conf() { :; }" in found and "dns=none" in found, found
        # systemd-resolved, as its package sets it up: /etc/resolv.conf a link to its stub.
        install = "DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd-resolved"
        proc = node_sh(SLURM_LAB, "login1", f"rm -f {hook} {nm_conf} && {install}")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        link = node_sh(SLURM_LAB, "login1", "readlink /etc/resolv.conf").stdout.strip()
        assert link.endswith("/run/systemd/resolve/stub-resolv.conf"), link
        output, changed = common_only(tmp_path, cluster, "login1")
        restarted = r"RUNNING HANDLER \[\S*common : Restart systemd-resolved\]"
        assert re.search(restarted, output), output
        assert node_sh(SLURM_LAB, "login1", "readlink /etc/resolv.conf").stdout.strip() == link
        inventory = yaml.safe_load(cluster.read_text())["all"]["hosts"]
        dns, n2 = inventory["n1"]["ansible_host"], inventory["n2"]["ansible_host"]
        assert f"DNS={dns}" in node_sh(SLURM_LAB, "login1", f"cat {dropin}").stdout
        resolved = node_sh(SLURM_LAB, "login1", "getent hosts n2; resolvectl dns").stdout
        assert re.search(rf"^{re.escape(n2)}\s+n2\.cluster\.internal", resolved, re.M), resolved
        assert dns in resolved
        assert not node_sh(SLURM_LAB, "login1", f"ls {hook} {nm_conf}").stdout  # not needed
        assert common_only(tmp_path, cluster, "login1")[1] == 0
    finally:
        purge = "DEBIAN_FRONTEND=noninteractive apt-get purge -y -q systemd-resolved"
        leftovers = "/etc/resolv.conf /etc/NetworkManager /etc/systemd/resolved.conf.d /etc/dhcp"
        restore = "cp /root/resolv.conf.saved /etc/resolv.conf"
        node_sh(SLURM_LAB, "login1", f"{purge}; rm -rf {leftovers}; {restore}")


def accepted(node: str) -> dict:
    return json.loads(
        node_sh(SLURM_LAB, "n1", f"cat /var/lib/tacc-agent/acceptance/{node}.json").stdout
    )


def acceptance_override(root: Path, node: str, thresholds: dict) -> Path:
    """A second inventory source giving `node` acceptance thresholds it cannot reach."""
    path = root / "acceptance.yml"
    path.write_text(json.dumps({"all": {"hosts": {node: {"tacc_agent_acceptance": thresholds}}}}))
    return path
