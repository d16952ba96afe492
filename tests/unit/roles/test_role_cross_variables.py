"""Every variable a role reads and does not set itself is declared in its
meta/argument_specs.yml: what another role or the inventory must give it is written down,
typed and checked before the role's first task.

"Reads": a free variable of any Jinja expression in the role's tasks, handlers, templates,
defaults and vars (`{{ var }}` anywhere, and the raw expressions of when, changed_when,
failed_when, until and assert's that). "Sets itself": its defaults and vars files, the
tasks' register, set_fact, vars: and loop variables, a template's own {% set %}/for.
Ansible's own names (magic variables, ansible_*, Jinja globals) are neither.

Run `python -m tests.unit.roles.test_role_cross_variables` for the list per role.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from jinja2 import Environment, meta, nodes
from jinja2.exceptions import TemplateSyntaxError

from tests.conftest import ROOT

ROLES_DIR = ROOT / "roles"
ROLES = sorted(p.name for p in ROLES_DIR.iterdir() if (p / "tasks").is_dir())
# Ansible's magic variables and Jinja globals a role may read without declaring them
# (https://docs.ansible.com/ansible/latest/reference_appendices/special_variables.html).
ANSIBLE_NAMES = frozenset(
    {
        "hostvars",
        "groups",
        "group_names",
        "inventory_hostname",
        "inventory_hostname_short",
        "inventory_dir",
        "inventory_file",
        "play_hosts",
        "playbook_dir",
        "role_name",
        "role_path",
        "role_names",
        "omit",
        "environment",
        "lookup",
        "query",
        "q",
        "now",
        "undef",
        "range",
        "dict",
        "lipsum",
        "cycler",
        "joiner",
        "namespace",
        "true",
        "false",
        "none",
        "True",
        "False",
        "None",
    }
)
# Task keys whose value is a bare Jinja expression (no braces).
CONDITIONAL_KEYS = ("when", "changed_when", "failed_when", "until")
ASSERT_ACTIONS = ("assert", "ansible.builtin.assert")
SET_FACT_ACTIONS = ("set_fact", "ansible.builtin.set_fact")
BLOCK_KEYS = ("block", "rescue", "always")


class _AnyName(dict):
    """Every filter and test name exists: only variables matter here."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str):
        return super().get(key, _ignore)

    def get(self, key, default=None):
        return super().get(key, _ignore)


def _ignore(*args, **kwargs) -> None:
    return None


# Only parsed, never rendered: autoescape does not matter.
JINJA = Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])  # noqa: S701
JINJA.filters = _AnyName(JINJA.filters)
JINJA.tests = _AnyName(JINJA.tests)


def free_names(source: str, where: str) -> set[str]:
    """The variables a Jinja template (or expression wrapped in braces) reads: less the
    ones it sets itself anywhere ({% set %} in a branch, for targets, macro arguments),
    which Jinja counts as read where the branch may not have run."""
    try:
        tree = JINJA.parse(source)
    except TemplateSyntaxError as exc:
        raise AssertionError(f"{where}: cannot parse {source!r}: {exc}") from exc
    own = {name.name for name in tree.find_all(nodes.Name) if name.ctx in ("store", "param")}
    return set(meta.find_undeclared_variables(tree)) - own


@dataclass
class RoleVariables:
    """What one role reads and what it sets itself, with where each read is."""

    sets: set[str] = field(default_factory=set)
    reads: dict[str, str] = field(default_factory=dict)  # name -> first place read

    def read(self, source: str, where: str) -> None:
        for name in sorted(free_names(source, where)):
            self.reads.setdefault(name, where)

    def read_values(self, value: object, where: str) -> None:
        """Every templated string in a YAML value."""
        for text in strings(value):
            if "{{" in text or "{%" in text:
                self.read(text, where)

    def read_expressions(self, value: object, where: str) -> None:
        """Bare expressions (when:, that:), a string or a list of them."""
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str):
                self.read("{{ " + text + " }}", where)
            elif text is not None and not isinstance(text, bool):
                self.read_values(text, where)


def strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


def task_action(task: dict) -> tuple[str, object]:
    """The module (or action) key of a task and its arguments."""
    meta_keys = {
        "name",
        "vars",
        "when",
        "register",
        "loop",
        "loop_control",
        "tags",
        "notify",
        "listen",
        "changed_when",
        "failed_when",
        "until",
        "retries",
        "delay",
        "become",
        "become_user",
        "check_mode",
        "diff",
        "no_log",
        "ignore_errors",
        "delegate_to",
        "run_once",
        "environment",
        "args",
        "throttle",
        "timeout",
        "any_errors_fatal",
    }
    for key, value in task.items():
        if key not in meta_keys and not key.startswith("with_") and key not in BLOCK_KEYS:
            return key, value
    return "", None


def walk_tasks(tasks: list | None, found: RoleVariables, where: str) -> None:
    for index, task in enumerate(tasks or []):
        here = f"{where}[{task.get('name', index)}]"
        for key in BLOCK_KEYS:
            walk_tasks(task.get(key), found, where)
        found.sets |= set(task.get("vars") or {})
        if "register" in task:
            found.sets.add(task["register"])
        loop_control = task.get("loop_control") or {}
        if "loop" in task or any(k.startswith("with_") for k in task):
            found.sets.add(loop_control.get("loop_var", "item"))
        for name_key in ("index_var", "extended_var"):
            if name_key in loop_control:
                found.sets.add(loop_control[name_key])
        action, args = task_action(task)
        if action in SET_FACT_ACTIONS and isinstance(args, dict):
            found.sets |= {k for k in args if k != "cacheable"}
        for key in CONDITIONAL_KEYS:
            if key in task:
                found.read_expressions(task[key], f"{here} {key}")
        if action in ASSERT_ACTIONS and isinstance(args, dict):
            found.read_expressions(args.get("that"), f"{here} that")
            found.read_values({k: v for k, v in args.items() if k != "that"}, here)
        else:
            found.read_values(args, here)
        rest = {k: v for k, v in task.items() if k not in (*CONDITIONAL_KEYS, *BLOCK_KEYS, action)}
        found.read_values(rest, here)


def yaml_file(path: Path) -> object:
    return yaml.safe_load(path.read_text()) if path.exists() else None


def role_variables(role: str) -> RoleVariables:
    base = ROLES_DIR / role
    found = RoleVariables()
    for directory in ("defaults", "vars"):
        for path in sorted((base / directory).glob("*.yml")):
            values = yaml_file(path) or {}
            found.sets |= set(values)
            found.read_values(values, str(path.relative_to(ROOT)))
    for directory in ("tasks", "handlers"):
        for path in sorted((base / directory).glob("*.yml")):
            walk_tasks(yaml_file(path), found, str(path.relative_to(ROOT)))
    for path in sorted((base / "templates").rglob("*.j2")):
        found.read(path.read_text(), str(path.relative_to(ROOT)))
    return found


def declared(role: str) -> set[str]:
    """Options of every entry point of the role's argument spec."""
    spec = yaml_file(ROLES_DIR / role / "meta/argument_specs.yml") or {}
    return {
        option
        for entry in (spec.get("argument_specs") or {}).values()
        for option in (entry.get("options") or {})
    }


def is_ansible_name(name: str) -> bool:
    return name in ANSIBLE_NAMES or name.startswith("ansible_")


def undeclared_reads(role: str) -> dict[str, str]:
    """Variables `role` reads, neither sets nor declares: name -> where it is read."""
    found = role_variables(role)
    known = found.sets | declared(role)
    return {
        name: where
        for name, where in sorted(found.reads.items())
        if name not in known and not is_ansible_name(name)
    }


def cross_reads(role: str) -> dict[str, str]:
    """Variables `role` reads and does not set itself (declared or not)."""
    found = role_variables(role)
    return {
        name: where
        for name, where in sorted(found.reads.items())
        if name not in found.sets and not is_ansible_name(name)
    }


# tacc_agent is another session's (roles/tacc_agent/**): the names it reads undeclared
# are listed in that session's report to add to its argument_specs.yml.
PENDING: set[str] = set()


@pytest.mark.parametrize(
    "role",
    [
        pytest.param(
            role,
            marks=pytest.mark.xfail(
                reason="tacc_agent's argument_specs.yml still lacks the variables it reads "
                "from other roles (to be added by the role's owner)",
                strict=False,
            ),
        )
        if role in PENDING
        else role
        for role in ROLES
    ],
)
def test_every_variable_a_role_reads_from_elsewhere_is_declared(role):
    missing = undeclared_reads(role)
    assert missing == {}, (
        f"roles/{role} reads variables it neither sets nor declares in "
        "meta/argument_specs.yml (add each with its type and a description naming the "
        f"role or inventory that sets it): {missing}"
    )


def option_types(role: str) -> dict[str, tuple[str, str | None]]:
    spec = yaml_file(ROLES_DIR / role / "meta/argument_specs.yml") or {}
    return {
        name: (option.get("type", "str"), option.get("elements"))
        for entry in (spec.get("argument_specs") or {}).values()
        for name, option in (entry.get("options") or {}).items()
    }


def test_a_variable_declared_by_several_roles_has_one_type():
    """A role declaring another role's variable checks it as its owner does."""
    by_name: dict[str, dict[str, tuple[str, str | None]]] = {}
    for role in ROLES:
        for name, kind in option_types(role).items():
            by_name.setdefault(name, {})[role] = kind
    differing = {name: kinds for name, kinds in by_name.items() if len(set(kinds.values())) > 1}
    assert differing == {}


def test_the_analysis_sees_reads_from_other_roles():
    """The guard of the test above: known cross-role reads are found, and a role's own
    registers, facts and loop variables are not counted."""
    slurm = cross_reads("slurm")
    assert "slurm_qos_result" not in slurm  # registered in accounting.yml, read by handlers
    assert "slurm_is_controller" not in slurm and "item" not in slurm
    pam = cross_reads("slurm_pam_adopt")
    assert {"slurm_prolog_flags"} <= set(pam), pam


def test_free_names_ignore_a_templates_own_variables():
    text = (
        "{% set nodes = groups['x'] | f(hostvars) %}{% for n in nodes %}{{ n }}{{ y }}{% endfor %}"
    )
    assert free_names(text, "t") == {"groups", "hostvars", "y"}
    branch = "{% if a %}{% set t = b | x %}{% if t %}{{ t }}{% endif %}{% endif %}"
    assert free_names(branch, "t") == {"a", "b"}


def main() -> int:
    for role in ROLES:
        reads = cross_reads(role)
        missing = undeclared_reads(role)
        print(f"{role}:")
        for name, where in reads.items():
            mark = "UNDECLARED" if name in missing else "declared"
            print(f"  {name:<40} {mark:<10} {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
