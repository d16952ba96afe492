"""The agent's health checks in node_exporter's collector model (issue [11], point 5): one
registry of checks with one signature, each default-on or not and declaring its metric
families; the exposition comes from those declarations only; the agent config (and the
tacc_agent role that writes it) turns a check on or off per node."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig, load_config
from tacc_agent.errors import AgentError
from tacc_agent.health import cycle as health
from tacc_agent.health import metrics
from tacc_agent.health.catalog import CHECKS
from tacc_agent.health.checks.base import FAIL, OK, Result, Sample
from tacc_agent.health.registry import Check, CheckContext, Family, Registry
from tacc_agent.serve import Daemon
from tests.conftest import ROOT
from tests.playbook.argument_spec_runs import LOCAL, ansible_playbook, failed_tasks
from tests.unit.agent_fixtures import daemon_settings, fixture_config, parse_exposition
from tests.unit.fake_slurm import FakeSlurm

BUILT_IN = ["gpu", "rdma", "mounts", "services", "disk", "memory"]
AGENT = ROOT / "packages/agent/tacc_agent"


def passing(name: str, *families: Family, default_on: bool = True) -> Check:
    def run(ctx: CheckContext) -> Result:
        return Result(name, OK, "fine")

    return Check(name, run, families, default_on)


def emitting(*samples: Sample, families: tuple[Family, ...] = ()) -> Check:
    def run(ctx: CheckContext) -> Result:
        return Result("liar", OK, "fine", samples=list(samples))

    return Check("liar", run, families)


# ------------------------------------------------------------------- the registry
def test_the_registry_holds_every_check_in_run_order_each_on_by_default():
    assert CHECKS.names == BUILT_IN
    assert all(check.default_on for check in CHECKS)
    # A family belongs to one check (or the agent): no two declare the same name.
    names = [f.name for f in metrics.AGENT_FAMILIES] + [
        f.name for check in CHECKS for f in check.families
    ]
    assert len(names) == len(set(names)), names


def test_every_check_has_the_one_signature_and_answers_under_its_own_name(tmp_path):
    config = replace(fixture_config(tmp_path), services=())
    ctx = health.context(config)
    assert ctx == CheckContext(config, Path(config.state_dir), 5.0, "b00t")
    results = health.run_checks(config)  # what `check` and `serve` run: the registry
    assert [r.check for r in results] == BUILT_IN
    assert not any(r.failed for r in results), results  # nothing undeclared either


def test_a_check_name_is_registered_once_and_a_family_is_well_formed():
    with pytest.raises(ValueError, match="registered twice"):
        Registry([passing("a"), passing("a")])
    with pytest.raises(ValueError, match="type 'histogram'"):
        Family("latency_seconds", "histogram", "no")
    with pytest.raises(ValueError, match="_total"):
        Family("errors", "counter", "a counter without _total")
    with pytest.raises(ValueError, match="_total"):
        Family("errors_total", "gauge", "a gauge named like a counter")


def test_default_on_and_what_the_config_turns_on_or_off():
    registry = Registry([passing("base"), passing("extra", default_on=False)])
    assert [c.name for c in registry.selected(None)] == ["base"]
    assert [c.name for c in registry.selected({})] == ["base"]
    assert [c.name for c in registry.selected({"extra": True})] == ["base", "extra"]
    assert [c.name for c in registry.selected({"base": False})] == []
    config = replace(AgentConfig(), checks={"extra": True, "base": False})
    assert [r.check for r in health.run_checks(config, registry)] == ["extra"]


# ------------------------------------------------------------ declared families only
def test_a_check_cannot_emit_a_family_it_did_not_declare(tmp_path):
    ctx = health.context(AgentConfig(proc_root=str(tmp_path)))
    undeclared = emitting(Sample("gpus", {}, 8))(ctx)
    assert undeclared.status == FAIL and undeclared.samples == []
    assert undeclared.detail == "check emitted metric family gpus, which it does not declare"
    per_gpu = Family("widgets", "gauge", "Widgets", ("gpu",))
    mislabelled = emitting(Sample("widgets", {"card": "0"}, 1), families=(per_gpu,))(ctx)
    assert mislabelled.status == FAIL and mislabelled.samples == []
    assert "widgets labelled ['card'], not ('gpu',)" in mislabelled.detail
    honest = emitting(Sample("widgets", {"gpu": "0"}, 1), families=(per_gpu,))(ctx)
    assert honest.status == OK and honest.samples == [Sample("widgets", {"gpu": "0"}, 1)]
    # and the exposition has no family that was not declared, whoever hands it a sample
    built = metrics.families(
        [Sample("widgets", {"gpu": "0"}, 1), Sample("stray", {}, 1)], {"widgets": per_gpu}
    )
    assert [family.name for family in built] == ["tacc_agent_widgets"]


def test_the_exposition_comes_from_the_declarations(tmp_path):
    daemon = Daemon(fixture_config(tmp_path))
    daemon.cycle()
    text = daemon.exposition().decode()
    declared = {metrics.PREFIX + f.name: f for f in metrics.AGENT_FAMILIES} | {
        metrics.PREFIX + f.name: f for check in CHECKS for f in check.families
    }
    exposed = {name for name in parse_exposition(text) if name.startswith(metrics.PREFIX)}
    assert exposed <= set(declared), exposed - set(declared)
    assert {
        "tacc_agent_gpus",
        "tacc_agent_rdma_port_errors_total",
        "tacc_agent_memory_total_bytes",
        "tacc_agent_disk_free_ratio",
    } <= exposed
    for name in exposed:  # HELP and TYPE as declared
        family = declared[name]
        assert f"# HELP {name} {family.help}\n" in text
        assert f"# TYPE {name} {family.kind}\n" in text


# ------------------------------------------------------------ per node, off in the file
def test_a_check_turned_off_in_the_config_file_neither_runs_nor_drains(tmp_path, monkeypatch):
    config = fixture_config(tmp_path)
    settings = daemon_settings(config) | {
        "services": [],
        "proc_root": config.proc_root,
        "expected_gpus": 4,  # it would fail
        "checks": {"gpu": False, "rdma": False},
    }
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    node = load_config(tmp_path / "agent.yaml")
    assert node.checks == {"gpu": False, "rdma": False}
    results = health.run_checks(node)
    assert [r.check for r in results] == ["mounts", "services", "disk", "memory"]
    assert not any(r.failed for r in results)
    assert not (Path(node.state_dir) / "xid.json").exists()  # the GPU check never ran
    # the node the agent drained for its GPUs is resumed: that check no longer holds it
    fake = FakeSlurm().install(monkeypatch)
    fake.add_node("n2", "IDLE+DRAIN", "tacc: gpu: 2 GPU(s), expected 4")
    assert "resumed n2" in health.apply_to_slurm(results, "n2", 5).said
    # the daemon: no family of the checks turned off, no status line of theirs, and no
    # facts of theirs (the execution layer then reads RDMA ports from sysfs itself)
    daemon = Daemon(node)
    daemon.cycle()
    families = parse_exposition(daemon.exposition().decode())
    assert families["tacc_agent_healthy"] == ["tacc_agent_healthy 1.0"]
    assert not [name for name in families if name.startswith(("tacc_agent_gpu", "tacc_agent_rdma"))]
    statuses = "\n".join(families["tacc_agent_check_status"])
    assert 'check="gpu"' not in statuses and 'check="memory",status="ok"} 1.0' in statuses
    facts = json.loads(Path(node.facts_file).read_text())
    assert "gpu" not in facts["checks"] and "gpu" not in facts and "rdma" not in facts
    # turned back on, the same node fails on its GPUs again
    again = replace(node, checks={"rdma": False})
    assert [r.check for r in health.run_checks(again) if r.failed] == ["gpu"]


def test_with_every_check_off_the_node_is_healthy_after_a_run(tmp_path):
    config = replace(fixture_config(tmp_path), checks=dict.fromkeys(BUILT_IN, False))
    daemon = Daemon(config)
    assert "tacc_agent_healthy 0.0" in daemon.exposition().decode()  # no run yet
    daemon.cycle()
    assert "tacc_agent_healthy 1.0" in daemon.exposition().decode()


def agent(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tacc_agent", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.bad_input
@pytest.mark.parametrize("verb", [["check", "--no-slurm"], ["serve", "--port", "0"]])
def test_an_unknown_check_name_is_a_clear_error_naming_the_known_ones(tmp_path, verb):
    config = fixture_config(tmp_path)
    settings = daemon_settings(config) | {"services": [], "checks": {"gpu": False, "gpuu": True}}
    (tmp_path / "agent.yaml").write_text(yaml.safe_dump(settings))
    proc = agent(*verb, "--config", str(tmp_path / "agent.yaml"))
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    error = json.loads(proc.stdout.strip().splitlines()[-1])["error"]
    assert error == (
        "agent config: checks: unknown check(s) gpuu; expected some of "
        "gpu, rdma, mounts, services, disk, memory (each true or false)"
    )
    assert not Path(config.state_dir).exists()  # no check ran


@pytest.mark.bad_input
@pytest.mark.parametrize("value", [["gpu"], {"gpu": "no"}, "gpu", {1: False}])
def test_checks_that_are_not_a_mapping_of_names_to_booleans_are_refused(tmp_path, value):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"checks": value}))
    with pytest.raises(
        AgentError,
        match=rf"^{path}: checks: expected a mapping of check name "
        r"to true or false \(e\.g\. \{gpu: false\}\), not ",
    ):
        load_config(path)


# ------------------------------------------------------------------ the role writes it
def test_the_roles_argument_specs_know_exactly_the_registered_checks():
    spec = yaml.safe_load((ROOT / "roles/tacc_agent/meta/argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    for where in (
        options["tacc_agent_checks"]["options"],
        options["tacc_agent_settings"]["options"]["checks"]["options"],
    ):
        assert list(where) == CHECKS.names
        assert {option["type"] for option in where.values()} == {"bool"}
    defaults = yaml.safe_load((ROOT / "roles/tacc_agent/defaults/main.yml").read_text())
    assert defaults["tacc_agent_checks"] == {}
    assert "tacc_agent_checks" in (ROOT / "roles/tacc_agent/templates/config.yaml.j2").read_text()


@pytest.mark.bad_input
def test_the_role_refuses_an_unknown_check_name_before_any_task(tmp_path):
    hosts = {
        "bad": {**LOCAL, "tacc_agent_checks": {"gpuu": False}},
        "good": {**LOCAL, "tacc_agent_checks": {"gpu": False}},
    }
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [{"hosts": "all", "gather_facts": False, "roles": [{"role": "tacc_agent"}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    proc = ansible_playbook(tmp_path / "hosts.yml", tmp_path / "play.yml", tmp_path)
    assert failed_tasks(proc.stdout) == {
        "bad": "tacc_agent : Validating arguments against arg spec 'main' - The node agent "
        "(tacc-agent) in a venv, its daemon, settings, users' workspaces"
    }
    assert "tacc_agent_checks.gpuu" in proc.stdout and "Traceback" not in proc.stdout


# ------------------------------------------------------------------ no hidden imports
@pytest.mark.parametrize(
    "module",
    [AGENT / "serve.py", *sorted((AGENT / "health").rglob("*.py"))],
    ids=lambda p: str(p.relative_to(AGENT)),
)
def test_health_and_the_daemon_import_at_the_top_only(module):
    """serve.py composes health and the task backend's queue ticks: no cycle to dodge."""
    tree = ast.parse(module.read_text())
    inner = [
        f"{module.name}:{node.lineno}"
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert inner == []
