"""The Grafana dashboards roles/monitoring ships (files/grafana/dashboards/*.json) and its
rule files, linted without Grafana (which Debian does not package): valid JSON in the
shape Grafana provisions, unique ids and uids, every PromQL expression parsed by promtool
(as a recording rule: promtool has no parse-only command), and every metric name in them
one that something in the cluster exports (the agent's declared families, the node
exporter's, Prometheus' own) or a recording rule of the role defines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tacc_agent.health.catalog import CHECKS
from tacc_agent.health.job_usage import JOB_FAMILIES
from tacc_agent.health.metrics import AGENT_FAMILIES, PREFIX
from tests.conftest import ROOT
from tests.playbook.monitoring_render import render, run, tool

DASHBOARDS = sorted((ROOT / "roles/monitoring/files/grafana/dashboards").glob("*.json"))
# The cluster-wide Slurm figures the controller's agent exports (agent cluster_metrics).
CLUSTER_FAMILIES = ("slurm_up", "slurm_jobs", "slurm_gpus", "slurm_nodes", "slurm_node_drained")
# The node exporter's (Debian's prometheus-node-exporter 1.5) that the role uses, each
# seen in its output on Debian 12.
NODE_EXPORTER = (
    "node_cpu_seconds_total",
    "node_memory_MemAvailable_bytes",
    "node_memory_MemTotal_bytes",
    "node_load1",
    "node_network_receive_bytes_total",
    "node_network_transmit_bytes_total",
    "node_filesystem_avail_bytes",
    "node_filesystem_size_bytes",
    "node_systemd_unit_state",
)
# Prometheus' own series for every target and alert, and the standard process_ figures
# the agent's ProcessCollector exports.
PROMETHEUS = (
    "up",
    "scrape_duration_seconds",
    "scrape_samples_scraped",
    "ALERTS",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
)
KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "Inf",
    "NaN",
}
GRAFANA_VARIABLE = re.compile(r"\$(__\w+|\{\w+\}|\w+)")


def agent_families() -> set[str]:
    declared = list(AGENT_FAMILIES) + list(JOB_FAMILIES)
    for check in CHECKS:
        declared += list(check.families)
    return {PREFIX + f.name for f in declared} | {PREFIX + name for name in CLUSTER_FAMILIES}


@pytest.fixture(scope="module")
def rules(tmp_path_factory) -> Path:
    return render(tmp_path_factory.mktemp("rules"))


def recorded(rules: Path) -> set[str]:
    groups = yaml.safe_load((rules / "tacc-records.yml").read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"]}


def known_metrics(rules: Path) -> set[str]:
    return agent_families() | set(NODE_EXPORTER) | set(PROMETHEUS) | recorded(rules)


def without_grafana_variables(expr: str) -> str:
    """$__rate_interval and friends stand in a range; $var in a label matcher's string."""
    return GRAFANA_VARIABLE.sub(lambda m: "5m" if m.group(1).startswith("__") else "x", expr)


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression: identifiers that are not in a string, a
    label matcher, a range or a grouping clause, not a function and not a keyword."""
    text = re.sub(r'"(\\.|[^"\\])*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = re.findall(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?!\s*\(|[\w:])", text)
    return {name for name in names if name not in KEYWORDS}


def dashboard_exprs() -> list[tuple[str, str]]:
    return [
        (f"{path.name} panel {panel['id']} {target['refId']}", target["expr"])
        for path in DASHBOARDS
        for panel in json.loads(path.read_text())["panels"]
        for target in panel.get("targets", [])
    ]


def rule_exprs(rules: Path) -> list[tuple[str, str]]:
    found = []
    for name in ("tacc-alerts.yml", "tacc-records.yml"):
        for group in yaml.safe_load((rules / name).read_text())["groups"]:
            found += [
                (f"{name} {r.get('alert') or r.get('record')}", r["expr"]) for r in group["rules"]
            ]
    return found


def test_the_metric_name_reader_finds_names_not_functions_labels_or_keywords():
    expr = (
        'sum by (slurm_job, user) (rate(tacc_agent_job_cpu_seconds_total{user=~"a|b"}[5m]))'
        " / on (instance) group_left (reason) up == bool 0 or vector(1) and x:y:z offset 5m"
    )
    assert metric_names(expr) == {"tacc_agent_job_cpu_seconds_total", "up", "x:y:z"}


def test_there_are_three_dashboards():
    assert [p.name for p in DASHBOARDS] == ["tacc-cluster.json", "tacc-jobs.json", "tacc-node.json"]


def test_dashboards_are_valid_grafana_json_with_unique_ids():
    uids = set()
    for path in DASHBOARDS:
        board = json.loads(path.read_text())
        for key in ("uid", "title", "schemaVersion", "panels", "templating", "time"):
            assert key in board, (path.name, key)
        assert board["uid"] not in uids, path.name
        uids.add(board["uid"])
        assert len(board["uid"]) <= 40  # Grafana's limit
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids)), path.name
        variables = {v["name"] for v in board["templating"]["list"]}
        assert "datasource" in variables, path.name  # no site's datasource uid baked in
        for panel in board["panels"]:
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, (path.name, panel["id"])
            refs = [target["refId"] for target in panel["targets"]]
            assert refs and len(refs) == len(set(refs)), (path.name, panel["id"])
            for name in GRAFANA_VARIABLE.findall(json.dumps(panel["targets"])):
                assert name.startswith("__") or name.strip("{}") in variables, (path.name, name)


def test_every_dashboard_expression_parses(rules, tmp_path):
    """promtool parses each expression as a recording rule's."""
    exprs = dashboard_exprs()
    rules_file = tmp_path / "dashboards.rules.yml"
    rules_file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "dashboards",
                        "rules": [
                            {
                                "record": f"dashboard:expr:{index}",
                                "expr": without_grafana_variables(expr),
                            }
                            for index, (_, expr) in enumerate(exprs)
                        ],
                    }
                ]
            }
        )
    )
    proc = run(tool("promtool"), "check", "rules", str(rules_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in proc.stdout


@pytest.mark.parametrize("source", ["dashboards", "rules"])
def test_every_metric_name_is_exported_or_recorded(rules, source):
    exprs = dashboard_exprs() if source == "dashboards" else rule_exprs(rules)
    known = known_metrics(rules)
    unknown = {
        where: sorted(metric_names(without_grafana_variables(expr)) - known)
        for where, expr in exprs
        if metric_names(without_grafana_variables(expr)) - known
    }
    assert unknown == {}


def test_the_agent_families_the_rules_rely_on_are_declared_by_the_agent():
    """The node-level figures the alerts read exist in the agent's registries (the
    cluster families come from the controller's agent, CLUSTER_FAMILIES)."""
    families = agent_families()
    names = (
        "healthy",
        "check_status",
        "slurm_drained_by_agent",
        "gpu_critical_xids",
        "disk_free_ratio",
        "job_gpu_utilization_ratio",
        "job_cpu_seconds_total",
    )
    for name in names:
        assert PREFIX + name in families, name


def test_the_grafana_provider_points_at_the_dashboards_dir(tmp_path):
    out = tmp_path / "provider.yaml"
    text = (ROOT / "roles/monitoring/templates/grafana-provider.yaml.j2").read_text()
    rendered = text.replace("{{ ansible_managed }}", "managed").replace(
        "{{ monitoring_grafana_dashboards_dir | to_json }}", '"/var/lib/grafana/dashboards/tacc"'
    )
    assert "{{" not in rendered
    out.write_text(rendered)
    provider = yaml.safe_load(out.read_text())
    assert provider["apiVersion"] == 1
    (entry,) = provider["providers"]
    assert entry["type"] == "file"
    assert entry["options"]["path"] == "/var/lib/grafana/dashboards/tacc"
