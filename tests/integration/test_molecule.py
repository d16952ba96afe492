"""molecule's scenarios, run by `make test` inside pytest, so they run beside the other
labs instead of after them. Each boots and removes its own lab with the delegated
driver's create and destroy playbooks (molecule/resources): that pattern is what the
`default` scenario proves for role authors, and the one `make test` runs. `cluster`
converges site.yml with Slurm accounting, QoS, accounts and partitions from its inventory
on a 3-node lab of its own, re-runs it (idempotence) and verifies the cluster with
testinfra: `make molecule` runs it (with `default`), `make test` does not, because what it
proves is proven on the shared labs (tests/integration/labs.py: `slurm` converges site.yml
with accounting, QoS and accounts and runs researchers' jobs on them, `hw` re-runs and
--check --diff from the bare image, `bw` re-runs on Debian 12), and a lab that boots and
converges its own three nodes cost 14 of the suite's 50 minutes of one worker.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import BIN, ROOT

pytestmark = pytest.mark.lab

ANSI = re.compile(r"\x1b\[[0-9;]*m")
ALL_SCENARIOS = sorted(path.parent.name for path in (ROOT / "molecule").glob("*/molecule.yml"))
SCENARIOS = ["default"]  # make molecule runs ALL_SCENARIOS (see the docstring)


def test_every_scenario_is_known():
    """A new scenario is a choice: make test's (SCENARIOS) or make molecule's alone."""
    assert set(ALL_SCENARIOS) == {"default", "cluster"}, ALL_SCENARIOS


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario_converges_idempotently_and_verifies(scenario):
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
        "NO_COLOR": "1",
    }
    proc = subprocess.run(
        [str(BIN / "molecule"), "test", "--scenario-name", scenario],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=2400,
        check=False,
    )
    output = ANSI.sub("", proc.stdout + proc.stderr)
    assert proc.returncode == 0, output[-6000:]
    # molecule's log lines when its output is not a terminal (as here)
    for action in ("converge", "idempotence", "verify"):
        assert f"[{scenario} > {action}] Executed: Successful" in output, output[-3000:]
