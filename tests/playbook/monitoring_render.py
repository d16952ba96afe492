"""roles/monitoring and roles/node_exporter rendered by Ansible itself for a small
inventory (the lab's shape), with the tools Prometheus and Alertmanager ship:
test_monitoring_role.py, test_monitoring_dashboards.py and test_monitoring_pipeline.py
share these."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

ROLE = ROOT / "roles/monitoring"
NODE_ROLE = ROOT / "roles/node_exporter"
RENDERED = ("prometheus.yml", "tacc-alerts.yml", "tacc-records.yml", "alertmanager.yml")
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# The lab's shape: login1, n1 = controller + slurmdbd + monitoring, n2 and n3 compute.
ADDRESSES = {"login1": "10.77.6.10", "n1": "10.77.6.11", "n2": "10.77.6.12", "n3": "10.77.6.13"}


def tool(name: str) -> str:
    found = shutil.which(name)
    assert found, (
        f"{name} is not installed: apt-get install --no-install-recommends prometheus "
        "prometheus-alertmanager (make deps installs them)"
    )
    return found


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv), capture_output=True, text=True, cwd=cwd, timeout=120, check=False
    )


def inventory(tmp: Path, *, dns: bool) -> Path:
    hosts = {name: {"ansible_host": address} for name, address in ADDRESSES.items()}
    hosts["n2"]["tacc_agent_metrics_port"] = 9771  # a host's own port is scraped
    children = {
        "monitoring": {"hosts": {"n1": None}},
        "slurm_controller": {"hosts": {"n1": None}},
        "slurm_dbd": {"hosts": {"n1": None}},
        "slurm_compute": {"hosts": {"n2": None, "n3": None}},
        "login": {"hosts": {"login1": None}},
    }
    if dns:
        children["cluster_dns"] = {"hosts": {"n1": None}}
    path = tmp / "hosts.yml"
    all_vars = {**LOCAL, "slurm_accounting_enabled": True}
    path.write_text(
        yaml.safe_dump({"all": {"hosts": hosts, "children": children, "vars": all_vars}})
    )
    return path


def ansible_playbook(tmp: Path, inventory_path: Path, play: list[dict], extra: dict, *argv: str):
    path = tmp / "play.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    env = ansible_env(tmp / "facts")
    argv = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory_path),
        str(path),
        "-e",
        json.dumps(extra),
        *argv,
    ]
    return subprocess.run(
        argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
    )


def role_vars_files(role: Path) -> list[str]:
    return [
        str(role / "defaults/main.yml"),
        str(role / "vars/main.yml"),
        str(role / "vars/Debian.yml"),
    ]


def template_task(role: Path, template: str, dest: Path, **task: object) -> dict:
    source = str(role / "templates" / template)
    return {
        "name": f"Render {template}",
        "ansible.builtin.template": {"src": source, "dest": str(dest), "mode": "0600"},
        **task,
    }


def render(tmp: Path, *, dns: bool = False, **settings: object) -> Path:
    """The monitoring host's files as the role writes them, into tmp/out (which stands
    for /etc/prometheus: the rule files are named there)."""
    out = tmp / "out"
    out.mkdir(exist_ok=True)
    tasks = [template_task(ROLE, f"{name}.j2", out / name) for name in RENDERED]
    tasks += [
        template_task(
            ROLE,
            "daemon.default.j2",
            out / "prometheus.default",
            vars={
                "monitoring_daemon_name": "prometheus",
                "monitoring_daemon_args": "{{ monitoring_prometheus_args }}",
            },
        ),
        template_task(
            ROLE,
            "daemon.default.j2",
            out / "alertmanager.default",
            vars={
                "monitoring_daemon_name": "alertmanager",
                "monitoring_daemon_args": "{{ monitoring_alertmanager_args }}",
            },
        ),
    ]
    play = [
        {
            "hosts": "monitoring",
            "gather_facts": False,
            "vars_files": role_vars_files(ROLE),
            "tasks": tasks,
        }
    ]
    proc = ansible_playbook(
        tmp, inventory(tmp, dns=dns), play, {"monitoring_config_dir": str(out), **settings}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    return out


def default_args(path: Path) -> list[str]:
    """The words of ARGS="..." in an /etc/default file, as the unit's $ARGS splits them."""
    (line,) = [x for x in path.read_text().splitlines() if x.startswith("ARGS=")]
    return line.removeprefix('ARGS="').removesuffix('"').split()
