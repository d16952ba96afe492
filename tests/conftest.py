"""Shared fixtures: the project root and a runner for the installed console scripts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests.integration.labs import scope_of_nodeid

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# A hung test must end in a failure with its stack, not in CI's kill at 90 minutes with
# nothing said: past this many minutes from the start of the run, the test in progress
# fails (pytest-timeout, its SIGALRM method: the fixtures' teardowns still run, so no lab
# is left behind) and every one after it has a second. `make test` must finish in 35.
DEADLINE_ENV = "TACC_TEST_DEADLINE"  # epoch seconds, set here unless set; workers inherit
DEADLINE_MINUTES = 65


def role_module(role: str, name: str):
    """roles/<role>/library/<name>.py as a Python module, with the role's module_utils
    importable the way Ansible ships them (ansible.module_utils.<file>)."""
    import ansible.module_utils

    utils = str(ROOT / "roles" / role / "module_utils")
    if Path(utils).is_dir() and utils not in ansible.module_utils.__path__:
        ansible.module_utils.__path__.append(utils)
    spec = importlib.util.spec_from_file_location(name, ROOT / f"roles/{role}/library/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def project_root() -> Path:
    return ROOT


def run_cli(
    *argv: str,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    timeout=600,
    stdin: str | None = None,
):
    """Run an installed console script (tacc-lab, tcloud, ...) and capture its output
    (`stdin`: written to its stdin, a pipe; else none)."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=timeout,
        check=False,
        input=stdin,
    )


SUITES = {
    "bad_input": "bad-input",
    "fault": "fault",
    "security": "security",
}  # marker -> name in the summary
FAILED = ("failed", "error", "xpassed")


def pytest_terminal_summary(terminalreporter) -> None:
    """One line per suite that ran: "bad-input suite: N cases ran, P passed, F failed".
    Counted from the reports' keywords, so it works with xdist workers too."""
    for marker, suite in SUITES.items():
        outcomes: dict[str, str] = {}
        for category in ("passed", "xfailed", "skipped", *FAILED):
            for report in terminalreporter.stats.get(category, []):
                if marker not in getattr(report, "keywords", {}):
                    continue
                if category in FAILED:
                    outcomes[report.nodeid] = "failed"  # any failing phase fails the case
                elif category == "skipped":
                    outcomes.setdefault(report.nodeid, "skipped")
                elif outcomes.get(report.nodeid) != "failed":
                    outcomes[report.nodeid] = "passed"
        if not outcomes:
            continue
        counts = {k: list(outcomes.values()).count(k) for k in ("passed", "failed", "skipped")}
        ran = counts["passed"] + counts["failed"]
        line = (
            f"{suite} suite: {ran} cases ran, {counts['passed']} passed, {counts['failed']} failed"
        )
        if counts["skipped"]:
            line += f", {counts['skipped']} skipped"
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def process_umask_is_kept():
    """A test that runs code which sets the process umask (the agent's main sets 077)
    fails here rather than leaving it to later tests of the same worker: a lab booted
    under 077 has node roots its services cannot enter."""
    before = os.umask(0o022)
    os.umask(before)
    yield
    after = os.umask(before)
    assert after == before, f"the test left the process umask {after:o} (was {before:o})"


def pytest_configure(config) -> None:
    """The controller (or a run without xdist) fixes the deadline for every worker."""
    os.environ.setdefault(DEADLINE_ENV, str(int(time.time()) + DEADLINE_MINUTES * 60))


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item):
    """Bound the test, its setup and teardown included, by the run's deadline (before
    pytest-timeout's own wrapper reads the `timeout` marker)."""
    left = int(os.environ[DEADLINE_ENV]) - time.time()
    marker = item.get_closest_marker("timeout")
    own = marker.args[0] if marker and marker.args else None
    if own is None or own > left:
        item.add_marker(pytest.mark.timeout(max(left, 1), method="signal", func_only=False))
    yield


class LabScopeScheduling(LoadScopeScheduling):
    """--dist loadfile, except that every module of one lab shape is one unit of work
    (tests/integration/labs.py), so one worker boots each shape; units start heaviest
    first (the labs, by their expected minutes), so the longest ones do not end the run."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of_nodeid(nodeid)[0]

    def _assign_work_unit(self, node) -> None:
        weights = {
            scope: scope_of_nodeid(next(iter(unit)))[1] for scope, unit in self.workqueue.items()
        }
        ordered = sorted(self.workqueue.items(), key=lambda item: -weights[item[0]])
        self.workqueue.clear()
        self.workqueue.update(ordered)
        super()._assign_work_unit(node)


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") == "loadfile":
        return LabScopeScheduling(config, log)
    return None
