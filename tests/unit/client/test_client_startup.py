"""`tcloud --help`, init, validate and `submit --dry-run` need no cluster, so they start
without the SSH stack (paramiko): the cluster commands load it (tcloud.cli.open_cluster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PROBE = """
import contextlib, io, sys
from tcloud import cli
with contextlib.redirect_stdout(io.StringIO()):
    try:
        code = cli.main(sys.argv[1:])
    except SystemExit as exc:  # --help
        code = exc.code
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("paramiko", "tacc_agent"))
print(code, loaded)
"""


def run_probe(code: str, *argv: str) -> str:
    """What a fresh Python running `code` (with argv) in the repository prints."""
    command = [sys.executable, "-c", code, *argv]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


LOCAL_COMMANDS = [
    ["--help"],
    ["validate", "examples/hello"],
    ["submit", "--dry-run", "examples/hello"],
    ["plugins"],
]


@pytest.mark.parametrize("argv", LOCAL_COMMANDS)
def test_local_commands_do_not_load_the_ssh_stack(argv):
    out = run_probe(PROBE, *argv)
    assert out.strip() == "0 []", out


CLUSTER_PROBE = """
import sys
import tcloud.cli, tcloud.core
unused = ("importlib.metadata", "tacc_contract.schema", "tacc_contract.plugins",
          "tcloud.compile.tasks", "tcloud.compile.compiler", "tacc_contract.buildfile")
print(sorted(m for m in unused if m in sys.modules))
"""


def test_commands_that_compile_nothing_load_no_compiler():
    """ps, exec, shell, forward and logs (tcloud.cli, then tcloud.core) load neither the task
    compiler (schema, plug-ins' fields, build file parser: about 50 ms of every start) nor
    importlib.metadata (20-40 ms; `--version` and a plug-in selection only)."""
    out = run_probe(CLUSTER_PROBE)
    assert out.strip() == "[]", out
