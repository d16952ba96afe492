"""The argument-validation runs of test_role_argument_specs.py (test_health_registry.py
runs one too): ansible-playbook in check mode with a tag no role task has, so only the
roles' validation tasks (tagged `always`) and the play's own tasks run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

NO_TASK_TAG = "tacc-bad-input-no-such-tag"
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}


def ansible_playbook(
    inventory: Path, play: Path, tmp: Path, *extra: str, env: dict | None = None
) -> subprocess.CompletedProcess:
    full_env = ansible_env(tmp / "facts", **(env or {}))
    return subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            str(play),
            "--check",
            "--tags",
            NO_TASK_TAG,
            *extra,
        ],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=ROOT,
        timeout=600,
        check=False,
    )


def failed_tasks(stdout: str) -> dict[str, str]:
    """host -> the TASK it failed in (default callback output)."""
    task, found = "", {}
    for line in stdout.splitlines():
        if line.startswith("TASK ["):
            task = line[len("TASK [") : line.rfind("]")]
        elif match := re.match(r"^fatal: \[([^\]]+)\]", line):
            found[match.group(1)] = task
    return found
