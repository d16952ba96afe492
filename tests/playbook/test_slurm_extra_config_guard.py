"""slurm_extra_config cannot give slurm.conf a second line for a key the template writes.

The guard's key list is the slurm role's `slurm_conf_template_keys` (vars/main.yml); these
tests fail when it differs, case-insensitively as Slurm reads keys, from the keys that
roles/slurm/templates/slurm.conf.j2 writes: read from the template's text, and from a
rendering with every optional line on. The role's validate step refuses a clashing key
with a message naming it and the role variable to set instead."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env
from tests.playbook.slurm_render import SLURM_ONLY, render

ROLE = ROOT / "roles/slurm"
TEMPLATE = ROLE / "templates/slurm.conf.j2"
GUARD_KEYS: dict[str, str | None] = yaml.safe_load((ROLE / "vars/main.yml").read_text())[
    "slurm_conf_template_keys"
]
PRIORITY_FACTORS = sorted(
    yaml.safe_load((ROLE / "meta/argument_specs.yml").read_text())["argument_specs"]["main"][
        "options"
    ]["slurm_priority_weights"]["options"]
)
# A line's key: a name, maybe ending in one Jinja expression (PriorityWeight{{ factor }}).
LINE_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(\{\{\s*(\w+)\s*\}\})?=")
EXTRA_CONFIG_LINE = "{{ key }}={{ value }}"  # the slurm_extra_config loop's line


def conf_keys() -> ModuleType:
    spec = importlib.util.spec_from_file_location("conf_keys", ROLE / "filter_plugins/conf_keys.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def folded(keys) -> set[str]:
    return {key.lower() for key in keys}


def template_keys(text: str) -> set[str]:
    """The first key of every line the template can write (Jinja statements and
    comments dropped, slurm.conf comments skipped, a PriorityWeight line once per factor
    of slurm_priority_weights), except slurm_extra_config's own line."""
    text = re.sub(r"\{#.*?#\}|\{%.*?%\}", "", text, flags=re.S)
    keys: set[str] = set()
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        if line == EXTRA_CONFIG_LINE:
            continue
        match = LINE_KEY.match(line)
        assert match, f"slurm.conf.j2: a line this test cannot read a key from: {line!r}"
        name, expression, variable = match.groups()
        if expression:
            assert (name, variable) == ("PriorityWeight", "factor"), line
            keys |= {f"{name}{factor}" for factor in PRIORITY_FACTORS}
        else:
            keys.add(name)
    return keys


def test_the_template_writes_extra_config_on_one_line():
    assert TEMPLATE.read_text().splitlines().count(EXTRA_CONFIG_LINE) == 1


def test_guard_keys_are_the_keys_the_template_writes():
    written = folded(template_keys(TEMPLATE.read_text()))
    guarded = folded(GUARD_KEYS)
    assert len(guarded) == len(GUARD_KEYS), "slurm_conf_template_keys names a key twice"
    assert sorted(written - guarded) == [], "slurm.conf.j2 writes keys the guard lacks"
    assert sorted(guarded - written) == [], "the guard lists keys slurm.conf.j2 no longer writes"


def test_guard_names_a_role_variable_that_exists():
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    named = {v for v in GUARD_KEYS.values() if v and v.startswith("slurm_")}
    assert sorted(named - set(defaults)) == []


def test_rendered_conf_has_exactly_the_guarded_keys(tmp_path):
    """Every optional line on (accounting, Gres, health check, every priority factor, a
    backup controller): the rendered slurm.conf's keys are the guard's, not one more or
    less."""
    weights = {factor: 1 for factor in PRIORITY_FACTORS} | {"TRES": "CPU=1"}
    extra = {
        "slurm_priority_weights": weights,
        "slurm_extra_config": {},
        "slurm_controller_hosts": ["ctl1", "login1"],
        "slurm_state_save_location": "/srv/ha/slurm-state",
    }
    render(tmp_path, "--limit", "ctl1", "-e", json.dumps(extra), *SLURM_ONLY)
    lines = (tmp_path / "ctl1/slurm.conf").read_text().splitlines()
    rendered = {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}
    assert folded(rendered) == folded(GUARD_KEYS)


@pytest.mark.parametrize(
    ("extra", "clashes"),
    [
        ({}, []),
        ({"AuthInfo": "cred_expire=20", "SlurmdTimeout": 30}, []),
        (
            {"SelectTypeParameters": "CR_Core"},
            [
                "SelectTypeParameters (the template writes SelectTypeParameters: "
                "the role writes it fixed)"
            ],
        ),
        (
            {"priorityweightage": 5, "AuthInfo": "x", "GRESTYPES": "gpu"},
            [
                "priorityweightage (the template writes PriorityWeightAge: "
                "set slurm_priority_weights instead)",
                "GRESTYPES (the template writes GresTypes: set slurm_node_gres instead)",
            ],
        ),
        (
            {"SlurmdTimeout": 30, "slurmdtimeout": 60},
            ["slurmdtimeout (the same key as SlurmdTimeout: keep one)"],
        ),
    ],
)
def test_clashes_name_each_key_and_what_to_set_instead(extra, clashes):
    assert conf_keys().tacc_slurm_extra_config_clashes(extra, GUARD_KEYS) == clashes


# The role's validate step for real: one host per case (connection local, check mode).
CASES = {
    "lab_extra": ({"AuthInfo": "cred_expire=20", "SlurmdParameters": "config_overrides"}, None),
    "select": ({"SelectTypeParameters": "CR_Core"}, "SelectTypeParameters (the template writes"),
    "lower": ({"selecttypeparameters": "CR_CPU"}, "selecttypeparameters (the template writes"),
    "weight": ({"PriorityWeightQOS": 1}, "set slurm_priority_weights instead"),
}


@pytest.fixture(scope="module")
def validate_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    tmp = tmp_path_factory.mktemp("guard")
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        name: {**local, "slurm_controller_host": name, "slurm_extra_config": extra}
        for name, (extra, _) in CASES.items()
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    play = [
        {
            "name": "Run the slurm role's validate step",
            "hosts": "all",
            "gather_facts": True,
            "gather_subset": ["!all", "min"],
            "tasks": [
                {
                    "name": "Validate",
                    "ansible.builtin.include_role": {"name": "slurm", "tasks_from": "validate"},
                }
            ],
        }
    ]
    (tmp / "play.yml").write_text(yaml.safe_dump(play, sort_keys=False))
    env = ansible_env(
        tmp / "facts",
        ANSIBLE_CALLBACKS_ENABLED="ansible.builtin.tree",
        ANSIBLE_CALLBACK_TREE_DIR=str(tmp / "results"),
    )
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(tmp / "hosts.yml"),
            str(tmp / "play.yml"),
            "--check",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    return proc, tmp / "results"


@pytest.mark.bad_input
@pytest.mark.parametrize("host", sorted(CASES))
def test_validate_step_refuses_a_key_the_template_writes(validate_run, host):
    proc, results = validate_run
    expected = CASES[host][1]
    result = json.loads((results / host).read_text())  # the host's last result
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output
    failed = re.search(rf"^fatal: \[{host}\]", proc.stdout, re.M) is not None
    if expected is None:
        assert not failed, result
        return
    assert failed and result.get("evaluated_to") is False, result
    assert "TASK [slurm : Refuse slurm_extra_config keys that slurm.conf.j2 writes" in proc.stdout
    assert expected in result["msg"], result["msg"]
    assert "use the role variable named instead of slurm_extra_config" in result["msg"]
