"""The bundle the tacc_agent role installs on every node (roles/tacc_agent/files/
make_bundle.py) holds the node side only: tacc-contract, tacc-plugins and tacc-agent,
no tcloud, no lab code, no FAKE hardware tool. And it installs the way the role does
it: offline, `pip install --no-index --no-deps --no-build-isolation` of its three
directories into a venv with the OS's Python packages (--system-site-packages), after
which `tacc-agent --help` runs."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAKE_BUNDLE = ROOT / "roles" / "tacc_agent" / "files" / "make_bundle.py"
NODE_SIDE = {"contract": "tacc_contract", "plugins": "tacc_plugins", "agent": "tacc_agent"}
FAKES = ROOT / "packages" / "ops" / "tacc_lab" / "fakes"
NOT_ON_A_NODE = ("tcloud", "tacc_lab", "paramiko")
# The role's interpreter on Debian (roles/tacc_agent/vars/Debian.yml: tacc_agent_python)
# with the OS packages the role installs (python3-yaml, python3-setuptools).
NODE_PYTHON = Path("/usr/bin/python3")


def build_bundle(dest: Path) -> tarfile.TarFile:
    proc = subprocess.run(
        [sys.executable, str(MAKE_BUNDLE), str(ROOT), str(dest)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return tarfile.open(dest)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> tarfile.TarFile:
    return build_bundle(tmp_path_factory.mktemp("bundle") / "tacc-stack-src.tar.gz")


def fake_tool_names() -> set[str]:
    return {p.stem for p in FAKES.glob("*.py") if p.stem != "__init__"}


def test_the_bundle_holds_the_three_node_distributions_only(bundle):
    names = bundle.getnames()
    tops = {tuple(name.split("/")[:3]) for name in names}
    expected = {("src", dist, package) for dist, package in NODE_SIDE.items()}
    expected |= {("src", dist, "pyproject.toml") for dist in NODE_SIDE}
    assert tops == expected


def test_the_bundle_has_no_client_no_lab_and_no_fake_tool(bundle):
    fakes = fake_tool_names()
    assert fakes, f"no FAKE tools found in {FAKES}: the check below would prove nothing"
    for member in bundle.getmembers():
        parts = member.name.split("/")
        assert not set(parts) & {"tcloud", "tacc_lab", "fakes"}, member.name
        assert Path(member.name).stem not in fakes, f"{member.name}: a FAKE tool's name"
        if member.isfile():
            text = bundle.extractfile(member).read().decode()
            assert not text.lstrip('"').startswith("FAKE"), f"{member.name} is a FAKE tool"


def absolute_imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_nothing_in_the_bundle_imports_the_client_or_the_lab(bundle):
    problems = [
        f"{member.name} imports {', '.join(sorted(hits))}"
        for member in bundle.getmembers()
        if member.isfile() and member.name.endswith(".py")
        for hits in [
            absolute_imports(bundle.extractfile(member).read().decode()) & set(NOT_ON_A_NODE)
        ]
        if hits
    ]
    assert not problems, "\n".join(problems)


def test_the_bundle_declares_no_client_or_lab_command(bundle):
    for dist in NODE_SIDE:
        pyproject = bundle.extractfile(f"src/{dist}/pyproject.toml").read().decode()
        for script in ("tcloud =", "tacc-lab ="):
            assert script not in pyproject, f"src/{dist}/pyproject.toml declares {script}"


def test_the_same_source_gives_the_same_bytes(tmp_path):
    first, second = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz"
    build_bundle(first).close()
    build_bundle(second).close()
    assert first.read_bytes() == second.read_bytes()


def node_python_or_skip() -> Path:
    check = (
        subprocess.run(
            [str(NODE_PYTHON), "-c", "import yaml, setuptools, venv"],
            capture_output=True,
            check=False,
        )
        if NODE_PYTHON.exists()
        else None
    )
    if check is None or check.returncode != 0:
        pytest.skip(f"{NODE_PYTHON} with python3-yaml and python3-setuptools (as on nodes)")
    return NODE_PYTHON


def test_the_bundle_installs_offline_as_the_role_does_and_the_agent_runs(bundle, tmp_path):
    python = node_python_or_skip()
    prefix = tmp_path / "opt-tacc-agent"
    bundle.extractall(prefix, filter="data")
    venv = prefix / "venv"
    made = subprocess.run(
        [str(python), "-m", "venv", "--system-site-packages", str(venv)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PIP_FIND_LINKS"] = ""  # offline: nothing but the three directories
    installed = subprocess.run(
        [
            str(venv / "bin" / "pip"),
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            *(str(prefix / "src" / dist) for dist in NODE_SIDE),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    helped = subprocess.run(
        [str(venv / "bin" / "tacc-agent"), "--help"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert helped.returncode == 0, helped.stderr
    assert "tacc-agent" in helped.stdout
    for package in NOT_ON_A_NODE[:2]:
        absent = subprocess.run(
            [str(venv / "bin" / "python"), "-c", f"import {package}"],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        assert absent.returncode != 0, f"{package} is importable in the agent's venv"
