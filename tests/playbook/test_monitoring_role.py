"""roles/monitoring and roles/node_exporter rendered by Ansible itself (no lab) for a small
inventory, with and without the cluster DNS, and checked by the tools Prometheus and
Alertmanager ship: `promtool check config`, `promtool check rules`, `amtool check-config`,
and `promtool test rules` with series that make each alert fire, and stay quiet when the
cluster is fine (docs/monitoring.md).

promtool and amtool come from Debian's prometheus and prometheus-alertmanager (the
Makefile installs them with the host's packages): a missing one is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT
from tests.playbook.monitoring_render import (
    ADDRESSES,
    NODE_ROLE,
    ROLE,
    ansible_playbook,
    default_args,
    inventory,
    render,
    role_vars_files,
    run,
    template_task,
    tool,
)

WEBHOOK = "https://hooks.example.org/tacc?token=s3cret-webhook-token"  # a test value
# The agent's port, declared once (roles/tacc_agent's defaults).
AGENT_PORT = yaml.safe_load((ROOT / "roles/tacc_agent/defaults/main.yml").read_text())[
    "tacc_agent_metrics_port"
]


def render_with_token(tmp: Path, **settings: object) -> Path:
    """render(), the scrapers' token file beside the files (promtool checks it is there)."""
    out = render(tmp, monitoring_agent_token_file=str(tmp / "out/tacc-agent-token"), **settings)
    (out / "tacc-agent-token").write_text("t" * 64)
    return out


@pytest.fixture(scope="module")
def static(tmp_path_factory) -> Path:
    return render_with_token(tmp_path_factory.mktemp("static"))


@pytest.fixture(scope="module")
def dns(tmp_path_factory) -> Path:
    return render_with_token(tmp_path_factory.mktemp("dns"), dns=True)


def scrape_job(out: Path, name: str) -> dict:
    config = yaml.safe_load((out / "prometheus.yml").read_text())
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == name]
    return job


# --- the rendered files pass Prometheus' and Alertmanager's own checks ---


@pytest.mark.parametrize("variant", ["static", "dns"])
def test_rendered_files_pass_promtool_and_amtool(variant, request):
    out = request.getfixturevalue(variant)
    proc = run(tool("promtool"), "check", "config", str(out / "prometheus.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS: 2 rule files found" in proc.stdout
    proc = run(
        tool("promtool"),
        "check",
        "rules",
        str(out / "tacc-alerts.yml"),
        str(out / "tacc-records.yml"),
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run(tool("amtool"), "check-config", str(out / "alertmanager.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_site_receivers_routes_and_webhook_pass_amtool(tmp_path):
    out = render(
        tmp_path,
        monitoring_alert_webhook_url=WEBHOOK,
        monitoring_alertmanager_receivers=[
            {
                "name": "oncall",
                "email_configs": [
                    {
                        "to": "ops@example.org",
                        "from": "am@example.org",
                        "smarthost": "mail.example.org:25",
                    }
                ],
            }
        ],
        monitoring_alertmanager_routes=[
            {"receiver": "oncall", "matchers": ['severity="critical"'], "continue": True}
        ],
    )
    proc = run(tool("amtool"), "check-config", str(out / "alertmanager.yml"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = yaml.safe_load((out / "alertmanager.yml").read_text())
    assert config["route"]["receiver"] == "tacc-webhook"
    assert config["route"]["routes"][0]["receiver"] == "oncall"
    webhook = config["receivers"][0]
    assert webhook == {
        "name": "tacc-webhook",
        "webhook_configs": [{"url": WEBHOOK, "send_resolved": True}],
    }
    assert WEBHOOK not in proc.stdout + proc.stderr


def test_without_a_webhook_alerts_stay_in_alertmanager(static):
    config = yaml.safe_load((static / "alertmanager.yml").read_text())
    assert config["receivers"] == [{"name": "tacc-webhook"}]
    assert config["route"]["group_by"] == ["alertname", "instance"]


# --- targets ---


def test_static_targets_are_every_inventory_host_named_by_its_inventory_name(static):
    for job, port in (("tacc_agent", AGENT_PORT), ("node", 9100)):
        found = {
            c["labels"]["instance"]: c["targets"] for c in scrape_job(static, job)["static_configs"]
        }
        wanted = {host: [f"{address}:{port}"] for host, address in ADDRESSES.items()}
        if job == "tacc_agent":
            wanted["n2"] = ["10.77.6.12:9771"]  # the host's own tacc_agent_metrics_port
        assert found == wanted
        assert "dns_sd_configs" not in scrape_job(static, job)


def test_with_the_cluster_dns_targets_come_from_its_srv_records(dns):
    for job, record in (("tacc_agent", "_tacc-agent._tcp"), ("node", "_node-exporter._tcp")):
        config = scrape_job(dns, job)
        assert "static_configs" not in config
        assert config["dns_sd_configs"] == [
            {"names": [f"{record}.cluster.internal"], "type": "SRV", "refresh_interval": "60s"}
        ]
        (relabel,) = config["relabel_configs"]
        assert relabel["source_labels"] == ["__meta_dns_srv_record_target"]
        assert relabel["target_label"] == "instance"
        # Prometheus anchors the regex; the SRV target is the FQDN with its final dot.
        for target in ("n2.cluster.internal.", "n2.cluster.internal", "n2"):
            match = re.fullmatch(relabel["regex"], target)
            assert match and match.expand(relabel["replacement"].replace("$1", r"\1")) == "n2"


def test_the_agents_slurm_job_label_is_left_as_prometheus_names_it(static):
    """The agent labels per-job figures `job` (the Slurm job); the target's own `job`
    label displaces it to `exported_job`, which the ops usage report reads
    (tacc_agent/tasks/accounting/gpu_time_used.py): no relabelling may rename it."""
    job = scrape_job(static, "tacc_agent")
    assert "metric_relabel_configs" not in job and "honor_labels" not in job


# --- listening: multi-tenant defaults ---


@pytest.mark.security
def test_prometheus_and_alertmanager_listen_on_the_loopback_by_default(static):
    """Prometheus holds per-job figures labelled with users' names and answers any query;
    anyone reaching Alertmanager could silence alerts. Neither is on the network by
    default, no admin API or lifecycle endpoint, no Alertmanager gossip port."""
    prometheus = default_args(static / "prometheus.default")
    alertmanager = default_args(static / "alertmanager.default")
    assert "--web.listen-address=127.0.0.1:9090" in prometheus
    assert "--web.listen-address=127.0.0.1:9093" in alertmanager
    assert "--cluster.listen-address=" in alertmanager
    for word in prometheus + alertmanager:
        assert not word.startswith(("--web.enable-admin-api", "--web.enable-lifecycle")), word
    config = yaml.safe_load((static / "prometheus.yml").read_text())
    assert config["alerting"]["alertmanagers"] == [
        {"static_configs": [{"targets": ["127.0.0.1:9093"]}]}
    ]


@pytest.mark.security
def test_listening_on_the_hosts_address_is_opt_in(tmp_path):
    out = render(tmp_path, monitoring_prometheus_listen_on_host=True)
    assert "--web.listen-address=10.77.6.11:9090" in default_args(out / "prometheus.default")
    assert "--web.listen-address=127.0.0.1:9093" in default_args(out / "alertmanager.default")


@pytest.mark.security
def test_the_webhook_url_is_written_under_no_log_readable_by_the_daemon_only():
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    (task,) = [t for t in tasks if "alertmanager.yml" in str(t.get("ansible.builtin.template"))]
    assert task["no_log"] is True
    assert task["ansible.builtin.template"]["mode"] == "0640"
    assert task["ansible.builtin.template"]["group"] == "{{ monitoring_group }}"
    spec = yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"]["monitoring_alert_webhook_url"]["no_log"]


def test_rendered_files_are_validated_before_they_are_installed():
    tasks = yaml.safe_load((ROLE / "tasks/main.yml").read_text())
    validate = {
        t["ansible.builtin.template"]["dest"].rsplit("/", 1)[-1]: t["ansible.builtin.template"].get(
            "validate"
        )
        for t in tasks
        if "ansible.builtin.template" in t
    }
    assert validate["tacc-alerts.yml"] == "{{ monitoring_promtool }} check rules %s"
    assert validate["tacc-records.yml"] == "{{ monitoring_promtool }} check rules %s"
    assert validate["prometheus.yml"] == "{{ monitoring_promtool }} check config %s"
    assert validate["alertmanager.yml"] == "{{ monitoring_amtool }} check-config %s"
    names = [t.get("name", "") for t in tasks]
    # The rules are in place before the configuration that names them is checked.
    assert names.index("Write the alert rules") < names.index("Write Prometheus' configuration")


# --- the scrapers' token (issue [18], review point 5) ---

SECRET_NAMES = re.compile(r"tacc_agent_metrics_job_token(_value|_kept)?\b|builtin\.password")
TOKEN_TASK_FILES = [
    ROOT / "roles/tacc_agent/tasks/main.yml",
    ROOT / "roles/tacc_agent/tasks/metrics_token.yml",
    ROOT / "roles/monitoring/tasks/main.yml",
]


def leaf_tasks(tasks: list[dict]) -> list[dict]:
    """Every task, those inside blocks included (a block's own keys are not a task's)."""
    found = []
    for task in tasks:
        if "block" in task:
            found += leaf_tasks(task["block"] + task.get("rescue", []) + task.get("always", []))
        else:
            found.append(task)
    return found


@pytest.mark.security
@pytest.mark.parametrize("variant", ["static", "dns"])
def test_the_agents_are_scraped_with_the_scrapers_token_from_a_file(variant, request):
    """The agents give the per-job series (every job's id and user) only to a scrape that
    presents the token; Prometheus reads it from a file (never from its command line or
    this configuration), and sends it to the agents' privileged port only, not to the
    node exporter's 9100, which any user could listen on."""
    out = request.getfixturevalue(variant)
    assert scrape_job(out, "tacc_agent")["authorization"] == {
        "type": "Bearer",
        "credentials_file": str(out / "tacc-agent-token"),
    }
    assert "authorization" not in scrape_job(out, "node")
    assert "tacc-agent-token" not in " ".join(default_args(out / "prometheus.default"))


@pytest.mark.security
def test_every_task_that_touches_the_scrapers_token_is_no_log_and_no_command():
    """The token (the inventory's, the generated one, the one read back) is never shown by
    Ansible nor put on a command line: each task naming it has no_log, none runs a command."""
    touching = []
    for path in TOKEN_TASK_FILES:
        for task in leaf_tasks(yaml.safe_load(path.read_text())):
            if SECRET_NAMES.search(json.dumps(task)):
                touching.append(task["name"])
                assert task.get("no_log") is True, (path.name, task["name"])
                modules = {"ansible.builtin.command", "ansible.builtin.shell"}
                assert not modules & set(task), (path.name, task["name"])
    assert len(touching) >= 6, touching  # assert, generate, read, choose, and two installs


@pytest.mark.security
def test_the_token_files_are_root_only_on_nodes_and_prometheus_readable_on_its_host():
    tasks = {
        t["name"]: t
        for path in TOKEN_TASK_FILES
        for t in leaf_tasks(yaml.safe_load(path.read_text()))
    }
    node = tasks["Install the scrapers' token for the agent (root's only)"]["ansible.builtin.copy"]
    assert (node["owner"], node["group"], node["mode"]) == ("root", "root", "0600")
    kept = tasks["Generate the scrapers' token once"]["ansible.builtin.copy"]
    assert (kept["owner"], kept["group"], kept["mode"]) == ("root", "root", "0400")
    name = "Install the scrapers' token for Prometheus (readable by its group only)"
    prometheus = tasks[name]["ansible.builtin.copy"]
    assert prometheus["group"] == "{{ monitoring_group }}" and prometheus["mode"] == "0640"
    names = [t.get("name", "") for t in yaml.safe_load((ROLE / "tasks/main.yml").read_text())]
    # promtool's check of the configuration wants the credentials file in place.
    assert names.index(name) < names.index("Write Prometheus' configuration")
    spec = yaml.safe_load((ROOT / "roles/tacc_agent/meta/argument_specs.yml").read_text())
    assert spec["argument_specs"]["main"]["options"]["tacc_agent_metrics_job_token"]["no_log"]


def token_play(tmp: Path, *argv: str, **settings: object) -> subprocess.CompletedProcess:
    """roles/tacc_agent's metrics_token tasks for the lab's four hosts (all local), each
    host writing the token it got to <tmp>/got/<host>."""
    got = tmp / "got"
    got.mkdir(exist_ok=True)
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "tasks": [
                {
                    "ansible.builtin.include_role": {
                        "name": "tacc_agent",
                        "tasks_from": "metrics_token",
                    }
                },
                {
                    "name": "Write what it got",
                    "no_log": True,
                    "ansible.builtin.copy": {
                        "content": "{{ tacc_agent_metrics_job_token_value }}",
                        "dest": f"{got}/{{{{ inventory_hostname }}}}",
                        "mode": "0600",
                    },
                    "when": "tacc_agent_metrics_job_token_value | length > 0",
                },
            ],
        }
    ]
    extra = {"tacc_agent_metrics_job_token_file": str(tmp / "etc/metrics-job-token"), **settings}
    return ansible_playbook(tmp, inventory(tmp, dns=False), play, extra, *argv)


def recap_changed(proc: subprocess.CompletedProcess) -> int:
    return sum(int(n) for n in re.findall(r"changed=(\d+)", proc.stdout))


@pytest.mark.security
@pytest.mark.skipif(os.geteuid() != 0, reason="the tasks chown the files to root")
def test_the_token_is_generated_once_kept_and_the_same_in_limit_and_check_runs(tmp_path):
    """Generated once on the source host (the controller, n1), kept there; every later
    run, one limited to a compute node included, reads the same; a check run of a new
    cluster writes nothing and fails nothing; nothing of it reaches the output."""
    checked = token_play(tmp_path, "--check")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr
    assert not (tmp_path / "etc/metrics-job-token.cluster").exists()
    first = token_play(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    kept = (tmp_path / "etc/metrics-job-token.cluster").read_text()
    assert re.fullmatch(r"[A-Za-z0-9]{64}", kept)
    assert oct((tmp_path / "etc/metrics-job-token.cluster").stat().st_mode & 0o777) == "0o400"
    assert {p.read_text() for p in (tmp_path / "got").iterdir()} == {kept}
    assert len(list((tmp_path / "got").iterdir())) == 4
    for proc in (token_play(tmp_path), token_play(tmp_path, "--limit", "n2", "--check")):
        assert proc.returncode == 0 and recap_changed(proc) == 0, proc.stdout[-3000:]
    (tmp_path / "got/n2").unlink()
    limited = token_play(tmp_path, "--limit", "n2")
    assert limited.returncode == 0, limited.stdout[-3000:]
    assert (tmp_path / "got/n2").read_text() == kept
    for proc in (checked, first, limited):
        assert kept not in proc.stdout + proc.stderr


@pytest.mark.bad_input
def test_a_short_inventory_token_is_refused_without_showing_it(tmp_path):
    proc = token_play(tmp_path, tacc_agent_metrics_job_token="short-s3cret")  # noqa: S106
    assert proc.returncode != 0
    # no_log hides the message too: the task's name says what is wrong.
    assert "TASK [tacc_agent : Refuse a short or malformed scrapers' token]" in proc.stdout
    assert "short-s3cret" not in proc.stdout + proc.stderr


# --- alerts: promtool test rules ---


@dataclass(frozen=True)
class AlertCase:
    alert: str
    series: dict[str, str]  # series -> values (1m apart)
    eval_time: str
    fires: list[dict]  # expected alerts (labels, annotations); [] = quiet


AGENT = 'job="tacc_agent"'
NODE = 'job="node"'


def check_status(check: str, status: str, instance: str = "n2") -> str:
    labels = f'{AGENT},instance="{instance}",check="{check}",status="{status}"'
    return f"tacc_agent_check_status{{{labels}}}"


CASES = [
    AlertCase(
        "TaccNodeDrainedByCheck",
        {
            f'tacc_agent_slurm_drained_by_agent{{{AGENT},instance="n2"}}': "0 1x10",
            f'tacc_agent_check_status{{{AGENT},instance="n2",check="gpu",status="fail"}}': "0 1x10",
            f'tacc_agent_check_status{{{AGENT},instance="n2",check="gpu",status="ok"}}': "1 0x10",
            f'tacc_agent_slurm_drained_by_agent{{{AGENT},instance="n3"}}': "0x10",
            f'tacc_agent_slurm_node_drained{{{AGENT},instance="n1",node="n2",'
            'reason="tacc-agent: gpu: 3 GPUs, expected 4"}': "0 1x10",
        },
        "5m",
        [
            {
                "exp_labels": {"severity": "warning", "instance": "n2", "job": "tacc_agent"},
                "exp_annotations": {
                    "summary": "Node n2 drained by a failing health check",
                    "description": "The agent on n2 keeps it drained in Slurm. Failing checks: gpu "
                    "(fail). Slurm's reason: tacc-agent: gpu: 3 GPUs, expected 4",
                },
            }
        ],
    ),
    AlertCase(
        "TaccNodeDrainedByCheck",
        {
            f'tacc_agent_slurm_drained_by_agent{{{AGENT},instance="n2"}}': "0x10",
        },
        "5m",
        [],
    ),
    AlertCase(
        "TaccGpuCriticalXid",
        {
            f'tacc_agent_gpu_critical_xids{{{AGENT},instance="n3"}}': "0 0 2x10",
        },
        "3m",
        [
            {
                "exp_labels": {"severity": "critical", "instance": "n3", "job": "tacc_agent"},
                "exp_annotations": {
                    "summary": "Critical GPU Xid on n3",
                    "description": "2 critical Xid event(s) on n3 since boot "
                    "(the kernel log's NVRM "
                    "Xid lines). The node stays drained until it reboots.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccGpuCriticalXid",
        {
            f'tacc_agent_gpu_critical_xids{{{AGENT},instance="n3"}}': "0x10",
        },
        "5m",
        [],
    ),
    AlertCase(
        "TaccMountStuck",
        {
            check_status("mounts", "stuck"): "0 1x10",
            check_status("mounts", "ok"): "1 0x10",
        },
        "7m",
        [
            {
                "exp_labels": {
                    "severity": "critical",
                    "instance": "n2",
                    "job": "tacc_agent",
                    "check": "mounts",
                    "status": "stuck",
                },
                "exp_annotations": {
                    "summary": "Mount check stuck on n2",
                    "description": "The agent's mounts check on n2 reports stuck: a shared file "
                    'system is missing, has the wrong type or options ("fail"), or '
                    'does not answer statfs() in time ("stuck", e.g. a hung NFS '
                    "server).",
                },
            }
        ],
    ),
    AlertCase(
        "TaccMountStuck",
        {  # stuck for less than its `for:`
            check_status("mounts", "stuck"): "0 0 0 1 1 0x5",
            check_status("mounts", "ok"): "1x10",
        },
        "8m",
        [],
    ),
    AlertCase(
        "TaccDiskNearlyFull",
        {
            f'node_filesystem_avail_bytes{{{NODE},instance="n1",device="/dev/sda1",fstype="ext4",'
            'mountpoint="/var"}': "5x30",
            f'node_filesystem_size_bytes{{{NODE},instance="n1",device="/dev/sda1",fstype="ext4",'
            'mountpoint="/var"}': "100x30",
            # Shared NFS space is the NFS server's disk: not an alert on every client.
            f'node_filesystem_avail_bytes{{{NODE},instance="n2",device="n1:/srv",fstype="nfs4",'
            'mountpoint="/shared"}': "1x30",
            f'node_filesystem_size_bytes{{{NODE},instance="n2",device="n1:/srv",fstype="nfs4",'
            'mountpoint="/shared"}': "100x30",
            f'tacc_agent_disk_free_ratio{{{AGENT},instance="n3",path="/tmp"}}': "0.02x30",
            f'tacc_agent_disk_free_ratio{{{AGENT},instance="n2",path="/tmp"}}': "0.5x30",
        },
        "20m",
        [
            {
                "exp_labels": {
                    "severity": "warning",
                    "instance": "n1",
                    "job": "node",
                    "device": "/dev/sda1",
                    "fstype": "ext4",
                    "mountpoint": "/var",
                },
                "exp_annotations": {
                    "summary": "Disk nearly full on n1: /var",
                    "description": "/var on n1 has 5% free (from node).",
                },
            },
            {
                "exp_labels": {
                    "severity": "warning",
                    "instance": "n3",
                    "job": "tacc_agent",
                    "path": "/tmp",
                    "mountpoint": "/tmp",
                },
                "exp_annotations": {
                    "summary": "Disk nearly full on n3: /tmp",
                    "description": "/tmp on n3 has 2% free (from tacc_agent).",
                },
            },
        ],
    ),
    AlertCase(
        "TaccDiskNearlyFull",
        {
            f'node_filesystem_avail_bytes{{{NODE},instance="n1",device="/dev/sda1",fstype="ext4",'
            'mountpoint="/var"}': "50x30",
            f'node_filesystem_size_bytes{{{NODE},instance="n1",device="/dev/sda1",fstype="ext4",'
            'mountpoint="/var"}': "100x30",
            f'tacc_agent_disk_free_ratio{{{AGENT},instance="n3",path="/tmp"}}': "0.4x30",
        },
        "20m",
        [],
    ),
    AlertCase(
        "TaccSlurmctldDown",
        {
            f'tacc_agent_slurm_up{{{AGENT},instance="n1",daemon="slurmctld"}}': "1 0x10",
            f'node_systemd_unit_state{{{NODE},instance="n1",name="slurmctld.service",'
            'state="active",type="simple"}': "1x10",
        },
        "4m",
        [
            {
                "exp_labels": {
                    "severity": "critical",
                    "instance": "n1",
                    "job": "tacc_agent",
                    "daemon": "slurmctld",
                },
                "exp_annotations": {
                    "summary": "slurmctld is down on n1",
                    "description": "The controller's agent on n1 gets no answer from slurmctld. "
                    "Jobs are neither scheduled nor started.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccSlurmctldDown",
        {  # systemd says the unit is not active
            f'tacc_agent_slurm_up{{{AGENT},instance="n1",daemon="slurmctld"}}': "1x10",
            f'node_systemd_unit_state{{{NODE},instance="n1",name="slurmctld.service",'
            'state="active",type="simple"}': "1 0x10",
        },
        "4m",
        [
            {
                "exp_labels": {
                    "severity": "critical",
                    "instance": "n1",
                    "job": "node",
                    "name": "slurmctld.service",
                    "state": "active",
                    "type": "simple",
                },
                "exp_annotations": {
                    "summary": "slurmctld is down on n1",
                    "description": "systemd reports slurmctld.service not active on n1. Jobs are "
                    "neither scheduled nor started.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccSlurmctldDown",
        {  # no figure at all: the controller's agent is gone
            f'tacc_agent_healthy{{{AGENT},instance="n2"}}': "1x10",
        },
        "4m",
        [
            {
                "exp_labels": {"severity": "critical", "daemon": "slurmctld"},
                "exp_annotations": {
                    "summary": "slurmctld is down",
                    "description": "No figure of slurmctld at all: the controller's agent is not "
                    "scraped (see TaccScrapeTargetDown). Jobs are neither scheduled "
                    "nor started.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccSlurmctldDown",
        {
            f'tacc_agent_slurm_up{{{AGENT},instance="n1",daemon="slurmctld"}}': "1x10",
            f'node_systemd_unit_state{{{NODE},instance="n1",name="slurmctld.service",'
            'state="active",type="simple"}': "1x10",
        },
        "4m",
        [],
    ),
    AlertCase(
        "TaccSlurmdbdDown",
        {
            f'tacc_agent_slurm_up{{{AGENT},instance="n1",daemon="slurmdbd"}}': "1 1 0x10",
        },
        "8m",
        [
            {
                "exp_labels": {
                    "severity": "critical",
                    "instance": "n1",
                    "job": "tacc_agent",
                    "daemon": "slurmdbd",
                },
                "exp_annotations": {
                    "summary": "slurmdbd is down on n1",
                    "description": "The controller's agent on n1 gets no answer from slurmdbd. "
                    "Accounting records queue up in slurmctld; sacct, sshare and "
                    "fair-share priorities are stale.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccSlurmdbdDown",
        {
            f'tacc_agent_slurm_up{{{AGENT},instance="n1",daemon="slurmdbd"}}': "1x10",
        },
        "8m",
        [],
    ),
    AlertCase(
        "TaccGpusAllocatedIdle",
        {
            f'tacc_agent_job_gpu_utilization_ratio{{{AGENT},instance="n2",exported_job="42",'
            'user="alice",gpu="0"}': "0x70",
            f'tacc_agent_job_gpu_utilization_ratio{{{AGENT},instance="n2",exported_job="42",'
            'user="alice",gpu="1"}': "0.9x70",
        },
        "65m",
        [
            {
                "exp_labels": {
                    "severity": "info",
                    "instance": "n2",
                    "job": "tacc_agent",
                    "exported_job": "42",
                    "user": "alice",
                    "gpu": "0",
                },
                "exp_annotations": {
                    "summary": "Job 42 of alice leaves GPU 0 on n2 idle",
                    "description": "GPU 0 on n2, allocated to Slurm job 42 of user alice, has been "
                    "at or under 5.0% utilization for 1h.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccGpusAllocatedIdle",
        {  # idle for 50 minutes, then busy: quiet
            f'tacc_agent_job_gpu_utilization_ratio{{{AGENT},instance="n2",exported_job="42",'
            'user="alice",gpu="0"}': "0x50 0.6x20",
        },
        "65m",
        [],
    ),
    AlertCase(
        "TaccScrapeTargetDown",
        {
            f'up{{{AGENT},instance="n3"}}': "1 0x10",
            f'up{{{NODE},instance="n3"}}': "1x10",
        },
        "7m",
        [
            {
                "exp_labels": {"severity": "warning", "instance": "n3", "job": "tacc_agent"},
                "exp_annotations": {
                    "summary": "tacc_agent on n3 is not answering",
                    "description": "Prometheus cannot scrape the tacc_agent target of n3 "
                    "(the daemon "
                    "is down or the node unreachable): its alerts cannot fire.",
                },
            }
        ],
    ),
    AlertCase(
        "TaccScrapeTargetDown",
        {
            f'up{{{AGENT},instance="n3"}}': "1x10",
        },
        "7m",
        [],
    ),
]
ALERTS = sorted({case.alert for case in CASES})


def case_id(case: AlertCase) -> str:
    return f"{case.alert}-{'fires' if case.fires else 'quiet'}-{CASES.index(case)}"


def promtool_test(out: Path, name: str, tests: list[dict]) -> subprocess.CompletedProcess:
    path = out / f"{name}.test.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "rule_files": ["tacc-alerts.yml", "tacc-records.yml"],
                "evaluation_interval": "1m",
                "tests": tests,
            },
            sort_keys=False,
        )
    )
    return run(tool("promtool"), "test", "rules", path.name, cwd=out)


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_each_alert_fires_on_its_condition_and_stays_quiet_when_fine(static, case):
    test = {
        "interval": "1m",
        "input_series": [{"series": s, "values": v} for s, v in case.series.items()],
        "alert_rule_test": [
            {"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": case.fires}
        ],
    }
    proc = promtool_test(static, f"case-{CASES.index(case)}", [test])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_alert_has_a_firing_and_a_quiet_case():
    names = re.findall(r"- alert: (\w+)", (ROLE / "templates/tacc-alerts.yml.j2").read_text())
    assert sorted(names) == ALERTS
    for alert in ALERTS:
        kinds = {bool(c.fires) for c in CASES if c.alert == alert}
        assert kinds == {True, False}, alert


def test_alert_rules_carry_severity_summary_and_description(static):
    rules = yaml.safe_load((static / "tacc-alerts.yml").read_text())["groups"][0]["rules"]
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert {"summary", "description"} <= set(rule["annotations"]), rule["alert"]


def test_alert_durations_come_from_monitoring_alert_for(tmp_path):
    out = render(
        tmp_path, monitoring_alert_for={"node_drained_by_check": "10s", "gpus_allocated_idle": "2m"}
    )
    rules = yaml.safe_load((out / "tacc-alerts.yml").read_text())["groups"][0]["rules"]
    durations = {rule["alert"]: rule["for"] for rule in rules}
    assert durations["TaccNodeDrainedByCheck"] == "10s"
    assert durations["TaccGpusAllocatedIdle"] == "2m"
    assert durations["TaccMountStuck"] == "5m"  # the default kept


def test_slurmdbd_is_watched_only_where_the_inventory_runs_it(tmp_path):
    out = render(tmp_path, slurm_accounting_enabled=False)
    rules = yaml.safe_load((out / "tacc-alerts.yml").read_text())["groups"][0]["rules"]
    names = [rule["alert"] for rule in rules]
    assert "TaccSlurmdbdDown" not in names and "TaccSlurmctldDown" in names


def test_recording_rules_give_the_cluster_figures(static):
    test = {
        "interval": "1m",
        "input_series": [
            {
                "series": f'tacc_agent_slurm_gpus{{{AGENT},instance="n1",partition="gpu",'
                'state="allocated"}',
                "values": "3x5",
            },
            {
                "series": f'tacc_agent_slurm_gpus{{{AGENT},instance="n1",partition="gpu",'
                'state="total"}',
                "values": "4x5",
            },
            {
                "series": f'tacc_agent_slurm_gpus{{{AGENT},instance="n1",partition="debug",'
                'state="allocated"}',
                "values": "0x5",
            },
            {
                "series": f'tacc_agent_slurm_gpus{{{AGENT},instance="n1",partition="debug",'
                'state="total"}',
                "values": "0x5",
            },
            {
                "series": f'tacc_agent_slurm_jobs{{{AGENT},instance="n1",partition="gpu",'
                'state="pending"}',
                "values": "7x5",
            },
            {
                "series": f'tacc_agent_slurm_node_drained{{{AGENT},instance="n1",node="n2",'
                'reason="x"}',
                "values": "1x5",
            },
        ],
        "promql_expr_test": [
            {
                "expr": "partition:tacc_agent_slurm_gpus_allocated:ratio",
                "eval_time": "2m",
                "exp_samples": [
                    {
                        "labels": "partition:tacc_agent_slurm_gpus_allocated:ratio"
                        '{partition="gpu"}',
                        "value": 0.75,
                    }
                ],
            },
            {
                "expr": "cluster:tacc_agent_slurm_gpus_total:sum",
                "eval_time": "2m",
                "exp_samples": [{"labels": "cluster:tacc_agent_slurm_gpus_total:sum", "value": 4}],
            },
            {
                "expr": "partition:tacc_agent_slurm_jobs_pending:sum",
                "eval_time": "2m",
                "exp_samples": [
                    {
                        "labels": 'partition:tacc_agent_slurm_jobs_pending:sum{partition="gpu"}',
                        "value": 7,
                    }
                ],
            },
            {
                "expr": "cluster:tacc_agent_slurm_nodes_drained:count",
                "eval_time": "2m",
                "exp_samples": [
                    {"labels": "cluster:tacc_agent_slurm_nodes_drained:count", "value": 1}
                ],
            },
        ],
    }
    proc = promtool_test(static, "records", [test])
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- bad input: the role's own checks refuse it with the variable's name ---


def role_checks(tmp: Path, role: Path, settings: dict) -> subprocess.CompletedProcess:
    """The role's `Check ...` assert tasks alone, with its defaults and vars."""
    tasks = [
        t
        for t in yaml.safe_load((role / "tasks/main.yml").read_text())
        if t.get("name", "").startswith("Check ")
    ]
    play = [
        {
            "hosts": "monitoring",
            "gather_facts": False,
            "vars_files": role_vars_files(role),
            "tasks": tasks,
        }
    ]
    return ansible_playbook(tmp, inventory(tmp, dns=False), play, settings)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        (
            {"monitoring_alert_for": {"mount_stuck": "five minutes"}},
            "monitoring_alert_for: each key one of",
        ),
        ({"monitoring_alert_for": {"disk_full": "5m"}}, "monitoring_alert_for: each key one of"),
        (
            {"monitoring_prometheus_extra_args": ["--log.level=debug --web.enable-admin-api"]},
            "monitoring_prometheus_extra_args",
        ),
        (
            {"monitoring_alert_webhook_url": "ftp://hooks/" + "s3cret"},
            "monitoring_alert_webhook_url must be",
        ),
    ],
    ids=["duration", "unknown-key", "extra-arg-with-space", "webhook-scheme"],
)
def test_bad_monitoring_variables_are_refused_by_name(tmp_path, settings, expected):
    proc = role_checks(tmp_path, ROLE, settings)
    assert proc.returncode != 0
    assert expected in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr


def test_good_monitoring_variables_pass_the_checks(tmp_path):
    proc = role_checks(
        tmp_path,
        ROLE,
        {"monitoring_alert_for": {"mount_stuck": "1m30s"}, "monitoring_alert_webhook_url": WEBHOOK},
    )
    assert proc.returncode == 0, proc.stdout[-3000:]


# --- node exporter ---


def render_node_exporter(tmp: Path, **settings: object) -> list[str]:
    dest = tmp / "prometheus-node-exporter"
    play = [
        {
            "hosts": "all",
            "gather_facts": False,
            "vars_files": role_vars_files(NODE_ROLE),
            "tasks": [
                template_task(NODE_ROLE, "prometheus-node-exporter.default.j2", dest, run_once=True)
            ],
        }
    ]
    proc = ansible_playbook(tmp, inventory(tmp, dns=False), play, settings)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return default_args(dest)


def test_node_exporter_reports_the_cluster_units_through_the_systemd_collector(tmp_path):
    args = render_node_exporter(tmp_path)
    assert "--web.listen-address=:9100" in args
    assert "--collector.systemd" in args
    (include,) = [a for a in args if a.startswith("--collector.systemd.unit-include=")]
    pattern = include.split("=", 1)[1]
    assert "\\" not in pattern  # systemd's EnvironmentFile would eat it
    for unit in (
        "slurmctld",
        "slurmd",
        "slurmdbd",
        "munge",
        "tacc-agent",
        "prometheus",
        "prometheus-alertmanager",
    ):
        assert re.fullmatch(pattern, f"{unit}.service"), unit
    assert not re.fullmatch(pattern, "sshd.service")
    assert not re.fullmatch(pattern, "slurmdXservice")
    assert "--no-collector.rapl" in args


def test_node_exporter_listen_address_and_port(tmp_path):
    args = render_node_exporter(
        tmp_path, node_exporter_listen_address="fd00::12", node_exporter_port=9200
    )
    assert "--web.listen-address=[fd00::12]:9200" in args


@pytest.mark.bad_input
def test_a_node_exporter_unit_name_with_a_space_is_refused(tmp_path):
    proc = role_checks(tmp_path, NODE_ROLE, {"node_exporter_systemd_units": ["slurmd", "a b"]})
    assert proc.returncode != 0
    assert "node_exporter_systemd_units" in proc.stdout, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.security
@pytest.mark.parametrize("opt_in", [False, True])
def test_a_monitoring_host_researchers_log_in_to_is_refused_unless_opted_in(tmp_path, opt_in):
    """Prometheus answers any query on its host's loopback: on a login node, alice would
    read every job's figures and owner there. The role refuses such a host first thing,
    unless ops accept it (monitoring_on_user_hosts, the lab's choice)."""
    hosts = tmp_path / "hosts.yml"
    members = {"hosts": {"login1": None}}
    hosts.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {"login1": {"ansible_connection": "local"}},
                    "children": {"login": members, "monitoring": members},
                }
            }
        )
    )
    play = [
        {
            "name": "Monitoring on a login node",
            "hosts": "monitoring",
            "gather_facts": False,
            "tasks": [
                {
                    "name": "The role's first check",
                    "ansible.builtin.include_role": {"name": "monitoring"},
                }
            ],
        }
    ]
    proc = ansible_playbook(tmp_path, hosts, play, {"monitoring_on_user_hosts": opt_in})
    refused = "anyone with a shell there can query Prometheus" in proc.stdout
    assert refused is not opt_in, proc.stdout[-3000:]
    assert proc.returncode != 0  # opted in, the play goes on and fails later without facts
