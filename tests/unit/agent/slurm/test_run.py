"""The one runner of Slurm's commands (tacc_agent/slurm/run.py): argv only, bounded, each
failure an AgentError (exit 3) that says what went wrong, with the caller's hint."""

from __future__ import annotations

import os
import sys

import pytest

from tacc_agent.errors import AGENT_CLUSTER, AgentError
from tacc_agent.slurm import run


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_stdout_of_a_command_that_succeeds():
    assert run.output(python("print('JobId=7')")) == "JobId=7\n"


def test_a_command_that_fails_says_its_own_words_then_the_hint():
    argv = python("import sys; sys.exit('slurm_load_jobs error: Invalid job id specified')")
    with pytest.raises(AgentError) as failed:
        run.output(argv)
    assert str(failed.value) == (
        f"{sys.executable} failed: slurm_load_jobs error: Invalid job id specified"
    )
    assert failed.value.exit_code == AGENT_CLUSTER
    with pytest.raises(AgentError, match=r"failed: exit status 3 \(usage reports need it\)$"):
        run.output(python("import sys; sys.exit(3)"), hint="usage reports need it")


def test_without_check_a_failure_is_its_stdout():
    assert run.output(python("import sys; print('half'); sys.exit(1)"), check=False) == "half\n"


def test_the_finished_command_keeps_status_and_both_outputs():
    done = run.command(python("import sys; print('out'); print('err', file=sys.stderr); exit(2)"))
    assert done == run.Finished(2, "out\n", "err\n")


@pytest.mark.fault
def test_a_missing_command_says_so_with_the_hint():
    with pytest.raises(run.NotFound, match=r"^no-such-squeue not found: is this a Slurm node\?$"):
        run.output(["no-such-squeue"])
    with pytest.raises(run.NotFound, match=r"^no-such-sacct not found: usage needs accounting$"):
        run.output(["no-such-sacct"], hint="usage needs accounting")


@pytest.mark.fault
def test_a_command_that_hangs_is_killed_at_its_timeout():
    with pytest.raises(run.NoAnswer, match=r"did not answer within 0.2 s$") as hung:
        run.output(python("import time; time.sleep(30)"), timeout=0.2)
    assert hung.value.exit_code == AGENT_CLUSTER


def test_env_is_added_and_environment_replaces_it(monkeypatch, tmp_path):
    monkeypatch.setenv("TACC_AGENT_CONFIG", "/root/agent.yaml")
    show = python("import os; print(os.environ.get('TACC_AGENT_CONFIG'), os.getcwd())")
    added = run.output(show, env=run.EPOCH_TIMES)
    assert added.split()[0] == "/root/agent.yaml"
    plain = run.command(show, environment={"PATH": os.environ["PATH"]}, cwd=str(tmp_path))
    assert plain.stdout.split() == ["None", str(tmp_path)]


@pytest.mark.security
def test_a_job_name_of_bytes_that_are_no_utf8_reads_as_replacement_characters():
    script = "import sys; sys.stdout.buffer.write(b'name \\xff\\n')"
    assert run.output([sys.executable, "-c", script]) == "name \ufffd\n"
