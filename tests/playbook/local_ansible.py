"""The environment of an ansible-playbook run on this machine (no lab): the project's
ansible.cfg and roles, no colours, and make demo's strategy, mitogen_linear
(plugins/strategy; test_mitogen_strategy.py keeps it honest). Under it the local tasks
of a render (a template or copy per file and host) run in one Python per host instead
of one per task: the example inventory's render-cluster-files.yml took 30 s of CPU
instead of 180 s, and wrote the same bytes."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import BIN, ROOT

MITOGEN = "mitogen_linear"


def ansible_env(facts: Path | None = None, **extra: str) -> dict[str, str]:
    """os.environ for ansible-playbook; `facts`: a private fact cache (the labs that
    run beside this share none of it); `extra`: more variables, winning over these."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_STRATEGY": MITOGEN,
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
        "ANSIBLE_LOCALHOST_WARNING": "false",
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }
    if facts is not None:
        env["ANSIBLE_CACHE_PLUGIN_CONNECTION"] = str(facts)
    return {**env, **extra}
