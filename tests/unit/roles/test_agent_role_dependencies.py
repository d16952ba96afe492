"""The tacc_agent role installs the agent offline (`pip --no-deps`): every dependency of the
distributions it installs must come from the OS packages or the venv packages of each
OS family it names, or the agent fails on the node at its first import."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from tests.conftest import ROOT

ROLE_VARS = ROOT / "roles/tacc_agent/vars"
# Installed by the role (tasks/main.yml) from the bundle, with --no-deps.
DISTRIBUTIONS = ("contract", "plugins", "agent")
BUNDLED = {"tacc-contract", "tacc-plugins", "tacc-agent"}
# Installed by the role on its own (tacc_agent_uv_version), not from the package lists.
OWN_STEP = {"uv"}
# The Debian package of a PyPI distribution, where the name is not python3-<name>.
DEBIAN_NAMES = {"pyyaml": "python3-yaml"}
REDHAT_NAMES = {"pyyaml": "python3.11-pyyaml"}


def requirement_names() -> set[str]:
    names = set()
    for distribution in DISTRIBUTIONS:
        project = tomllib.loads((ROOT / "packages" / distribution / "pyproject.toml").read_text())
        for requirement in project["project"]["dependencies"]:
            names.add(re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0].lower())
    return names - BUNDLED - OWN_STEP


def pip_names(specs: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0].lower() for spec in specs}


@pytest.mark.parametrize(("family", "names"), [("Debian", DEBIAN_NAMES), ("RedHat", REDHAT_NAMES)])
def test_every_dependency_of_the_agent_is_installed_by_the_role(family, names):
    variables = yaml.safe_load((ROLE_VARS / f"{family}.yml").read_text())
    os_packages = set(variables["tacc_agent_packages"])
    from_pip = pip_names(variables["tacc_agent_venv_packages"])
    missing = []
    for name in sorted(requirement_names()):
        debian = names.get(name, f"python3-{name}")
        if family == "Debian" and (debian in os_packages or name in from_pip):
            continue
        if family == "RedHat" and (names.get(name) in os_packages or name in from_pip):
            continue
        missing.append(name)
    assert not missing, f"{family}: no package of the role installs {missing}"
