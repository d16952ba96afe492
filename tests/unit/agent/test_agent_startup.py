"""The agent's start on a submit's path (`session`, `hello`, `batch JOBDIR`, `exec JOBDIR`):
those words are read without building the whole parser, with the parser's own result;
importing the CLI loads neither the task schema nor the plug-in registry; and a process
scans the installed plug-ins' entry points once, however often it selects plug-ins."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tacc_agent import cli, serve
from tacc_agent.config import AgentConfig
from tacc_agent.tasks.schedule import queue_ticks
from tacc_contract import job_defaults, registry, sbatch

QUICK = [
    ["hello"],
    ["session"],
    ["batch", "/shared/tcloud/u/jobs/abc-1"],
    ["exec", "/shared/tcloud/u/jobs/abc-1"],
    ["exec", "relative/dir"],
    ["exec", ""],
]
UNUSUAL = [
    [],
    ["exec"],
    ["batch"],
    ["exec", "-h"],
    ["exec", "--config", "f"],
    ["exec", "a", "b"],
    ["--config", "f", "exec", "/j"],
    ["--userdir", "/u", "session"],
    ["session", "extra"],
    ["hello", "--version"],
    ["--version"],
    ["job", "ps"],
    ["check", "--json"],
]


@pytest.mark.parametrize("argv", QUICK)
def test_the_quick_words_parse_as_the_parser_parses_them(argv):
    assert cli.quick_args(argv) == cli.build_parser().parse_args(argv)


@pytest.mark.parametrize("argv", UNUSUAL)
def test_anything_else_goes_to_the_parser(argv):
    assert cli.quick_args(argv) is None


@pytest.mark.bad_input
@pytest.mark.parametrize("argv", [["exec"], ["exec", "a", "b"], ["batch", "--bogus", "/j"]])
def test_bad_words_still_get_the_parsers_usage_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: tacc-agent") and "error:" in err


@pytest.mark.bad_input
def test_no_verb_prints_the_help_and_exits_2(capsys):
    assert cli.main([]) == 2
    assert capsys.readouterr().out.startswith("usage: tacc-agent")


def probe(code: str, *argv: str) -> str:
    """What a fresh Python running `code` (with argv) prints."""
    command = [sys.executable, "-c", code, *argv]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=60).stdout


PROBE = """
import sys
import tacc_agent.cli
heavy = ("tacc_contract.schema", "tacc_contract.sbatch", "tacc_contract.registry",
         "importlib.metadata")
print(sorted(m for m in heavy if m in sys.modules))
"""


def test_importing_the_cli_loads_neither_schema_nor_registry():
    """A verb that needs neither (check, whoami, hello's first line) does not pay for them;
    the verbs that do import them themselves."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.strip() == "[]", out


JOB_STEP_PROBE = """
import sys
import tacc_agent.cli
import tacc_agent.tasks.execute.launch
import tacc_agent.tasks.interactive.connect
unused = ("urllib.request", "http.client", "dockerfile_parse", "importlib.metadata",
          "tacc_agent.tasks.images.build", "tacc_agent.slurm.accounting",
          "tacc_agent.slurm.reservations", "tacc_agent.slurm.controller")
print(sorted(m for m in unused if m in sys.modules))
"""


def test_a_job_step_loads_only_what_every_step_uses():
    """The batch step, each rank's wrapper, `enter` and `job connect` start a Python each
    on a user's wait (submit -> RUNNING, exec, shell, forward): the build file's parser,
    urllib, package metadata and the Slurm readers they never call are not imported."""
    out = probe(JOB_STEP_PROBE)
    assert out.strip() == "[]", out


DAEMON_PROBE = """
import sys
from pathlib import Path
import tacc_agent.serve
from tacc_agent import cli
tacc_agent.serve.serve = lambda *args: 0  # the daemon's settings read, nothing started
settings = Path(sys.argv[1])
settings.write_text("plugins: [las]\\n")  # set on every node by the tacc_agent role
assert cli.main(["--config", str(settings), "serve", "--port", "0"]) == 0
backend = ("tacc_agent.tasks", "tacc_contract.schema", "tacc_contract.sbatch",
           "tacc_contract.registry")
print(sorted(m for m in sys.modules if m.startswith(backend)))
"""


def test_a_compute_nodes_daemon_loads_no_scheduling_backend(tmp_path):
    """`tacc-agent serve` off the controller, plug-ins named in its settings: the health
    half only (the queue ticks and the task schema cost the daemon about 1.2 MiB of its
    30 MiB budget; only the controller's daemon pays)."""
    out = probe(DAEMON_PROBE, str(tmp_path / "agent.yaml"))
    assert out.strip() == "[]", out


def test_only_the_controllers_daemon_gets_queue_rounds(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(serve, "serve", lambda *args: started.append(args) or 0)
    ticks = []
    monkeypatch.setattr(queue_ticks, "tick", lambda config, allowed: ticks.append(allowed) or [])
    node, controller = tmp_path / "node.yaml", tmp_path / "controller.yaml"
    node.write_text("queue_tick_seconds: 0\n")
    controller.write_text("queue_tick_seconds: 2\n")
    umask = os.umask(0o022)  # the agent's main sets 077: put back afterwards
    os.umask(umask)
    try:
        for settings in (node, controller):
            assert cli.main(["--config", str(settings), "serve", "--port", "0"]) == 0
    finally:
        os.umask(umask)
    assert started[0][3] is None
    rounds = started[1][3]
    assert rounds() == [] and rounds() == []
    assert ticks[0] is ticks[1]  # one memory of the running jobs' opt-ins for all rounds


def test_the_tick_loop_runs_the_round_it_was_given():
    stop, rounds = threading.Event(), []

    def one_round() -> list[str]:
        rounds.append(1)
        stop.set()
        return ["narrowed job 7"]

    serve.tick_loop(AgentConfig(queue_tick_seconds=0.01), one_round, stop)
    assert rounds == [1]


def test_the_settings_defaults_are_the_sbatch_defaults():
    """tacc_contract.job_defaults holds what tacc_contract.sbatch defaults to."""
    assert job_defaults.DEFAULT_TIME_LIMIT == sbatch.DEFAULT_TIME_LIMIT
    assert job_defaults.CHECKPOINT_SIGNAL_SECONDS == sbatch.CHECKPOINT_SIGNAL_SECONDS
    assert sbatch.ClusterDefaults() == sbatch.ClusterDefaults(
        job_defaults.DEFAULT_TIME_LIMIT, job_defaults.CHECKPOINT_SIGNAL_SECONDS
    )


@pytest.fixture
def fresh_entry_points():
    registry.installed_entry_point_modules.cache_clear()
    yield
    registry.installed_entry_point_modules.cache_clear()


def test_a_process_scans_the_entry_points_once(monkeypatch, fresh_entry_points):
    scans = []
    real = importlib.metadata.entry_points

    def counted(**kwargs):
        scans.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(importlib.metadata, "entry_points", counted)
    first = registry.entry_point_modules()
    first.append("changed.by.a.caller")
    assert registry.entry_point_modules() == first[:-1]
    registry.select([])
    registry.select(["-duration"])
    assert scans == [{"group": registry.ENTRY_POINT_GROUP}]


def test_the_cli_module_runs_as_the_console_script(tmp_path):
    """`python -m tacc_agent` and the console script reach the same main."""
    done = subprocess.run(
        [sys.executable, "-m", "tacc_agent", "exec"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
        cwd=Path(tmp_path),
    )
    assert done.returncode == 2 and "the following arguments are required: jobdir" in done.stderr


WARM_PROBE = """
import sys
from tacc_agent import session
before = [m for m in session.WARM_MODULES if m in sys.modules]
session.warm_up().join(60)
print(before, all(m in sys.modules for m in session.WARM_MODULES))
"""


def test_a_session_loads_the_waited_on_verbs_modules_before_its_first_request():
    """Issue [23]: a spare session (tcloud's master starts them ahead) has `job target`'s,
    `store`'s and ps' modules loaded by the time a command asks (on its own thread)."""
    out = probe(WARM_PROBE)
    assert out.strip() == "[] True", out
