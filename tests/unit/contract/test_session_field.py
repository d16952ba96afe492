"""The task's `session:` field (issue [14]): an interactive session's forwarded ports,
idle timeout and stop-on-disconnect, positioned errors for every bad value, and the
round trip task file -> compile -> instruction -> the agent's parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tacc_contract.errors import TaskFileError
from tacc_contract.instruction import FORMAT, InvalidInstruction, parse
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task

DEFAULTS = {"ports": [], "idle_timeout": "30", "stop_on_disconnect": False}


def task_file(tmp_path: Path, session_lines: str) -> Path:
    path = tmp_path / "tcloud.yaml"
    path.write_text(f"name: lab\nrun:\n  - sleep infinity\n{session_lines}")
    return path


def test_a_task_without_session_is_an_ordinary_job(tmp_path):
    assert load_task(task_file(tmp_path, ""), selection=[]).session is None


def test_an_empty_session_takes_every_default(tmp_path):
    spec = load_task(task_file(tmp_path, "session:\n"), selection=[])
    assert spec.session == DEFAULTS


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("session:\n  ports: [8888, 6006]\n", {**DEFAULTS, "ports": [8888, 6006]}),
        ("session:\n  idle_timeout: 0:20\n", {**DEFAULTS, "idle_timeout": "0:20"}),
        ("session:\n  idle_timeout: 1:00:00\n", {**DEFAULTS, "idle_timeout": "1:00:00"}),
        ("session:\n  idle_timeout: 0\n", {**DEFAULTS, "idle_timeout": "0"}),
        ("session:\n  idle_timeout: '45'\n", {**DEFAULTS, "idle_timeout": "45"}),
        ("session:\n  stop_on_disconnect: true\n", {**DEFAULTS, "stop_on_disconnect": True}),
        ("session:\n  ports: [1, 65535]\n", {**DEFAULTS, "ports": [1, 65535]}),
        ("session:\n  ports:\n", DEFAULTS),
    ],
)
def test_valid_sessions_are_read_with_defaults_filled(tmp_path, lines, expected):
    assert load_task(task_file(tmp_path, lines), selection=[]).session == expected


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("lines", "line", "field", "words"),
    [
        ("session: yes\n", 4, "session", "expected a mapping"),
        ("session: [8888]\n", 4, "session", "expected a mapping"),
        ("session:\n  ports: 8888\n", 5, "session.ports", "port numbers"),
        ("session:\n  ports: [0]\n", 5, "session.ports", "entry 0 is 0"),
        ("session:\n  ports: [22, 65536]\n", 5, "session.ports", "entry 1 is 65536"),
        ("session:\n  ports: [http]\n", 5, "session.ports", "entry 0 is 'http'"),
        ("session:\n  ports: [8.5]\n", 5, "session.ports", "entry 0 is 8.5"),
        ("session:\n  ports: [true]\n", 5, "session.ports", "entry 0 is True"),
        ("session:\n  ports: [8888, 8888]\n", 5, "session.ports", "8888 appears twice"),
        ("session:\n  ports: [1,2,3,4,5,6,7,8,9]\n", 5, "session.ports", "9 given"),
        ("session:\n  idle_timeout: soon\n", 5, "session.idle_timeout", "0 for never"),
        ("session:\n  idle_timeout: 1:99\n", 5, "session.idle_timeout", "0 for never"),
        ("session:\n  idle_timeout: -5\n", 5, "session.idle_timeout", "0 for never"),
        ("session:\n  stop_on_disconnect: maybe\n", 5, "session.stop_on_disconnect", "true or"),
        ("session:\n  idel_timeout: 30\n", 5, "session.idel_timeout", "did you mean"),
    ],
)
def test_a_bad_session_value_names_its_line_field_and_what_is_expected(
    tmp_path, lines, line, field, words
):
    path = task_file(tmp_path, lines)
    with pytest.raises(TaskFileError) as caught:
        load_task(path, selection=[])
    message = str(caught.value)
    assert f"{path}:{line}:" in message and field in message and words in message, message
    assert "Traceback" not in message


def instruction(session: object) -> str:
    task = {"name": "t", "run": ["true"], "session": session}
    return json.dumps({"format": FORMAT, "task": task, "manifest": {}})


def test_the_agent_reads_an_instructions_session():
    spec = parse(instruction({"ports": [8888], "idle_timeout": "0:20"}), "instruction.json")
    assert spec.session == {**DEFAULTS, "ports": [8888], "idle_timeout": "0:20"}


def test_an_instruction_without_session_is_an_ordinary_job():
    text = json.dumps({"format": FORMAT, "task": {"name": "t", "run": ["true"]}, "manifest": {}})
    assert parse(text, "instruction.json").session is None


@pytest.mark.bad_input
@pytest.mark.security
@pytest.mark.parametrize(
    ("session", "field"),
    [
        ({"ports": [70000]}, "task.session.ports"),
        ({"ports": ["22; rm -rf /"]}, "task.session.ports"),
        ({"idle_timeout": "$(reboot)"}, "task.session.idle_timeout"),
        ({"stop_on_disconnect": "yes"}, "task.session.stop_on_disconnect"),
        ({"shell": "/bin/sh"}, "task.session.shell"),
    ],
)
def test_the_cluster_re_validates_a_session_it_is_sent(session, field):
    """Never trust the laptop: a hand-written instruction gets the task file's checks."""
    with pytest.raises(InvalidInstruction) as caught:
        parse(instruction(session), "instruction.json")
    assert "instruction.json:1:" in str(caught.value) and field in str(caught.value)


def test_a_session_round_trips_task_file_compile_instruction_agent(tmp_path):
    lines = "session:\n  ports: [8888]\n  idle_timeout: 1:00:00\n  stop_on_disconnect: true\n"
    spec = load_task(task_file(tmp_path, lines), selection=[])
    compiled = compile_task(spec, plugins=[])
    assert compiled.document["task"]["session"] == spec.session
    text = json.dumps(compiled.document)
    assert parse(text, "instruction.json").session == spec.session


def test_a_job_without_session_compiles_to_the_same_document_as_before(tmp_path):
    """Ordinary jobs keep their digests: no `session` key in their instruction."""
    compiled = compile_task(load_task(task_file(tmp_path, ""), selection=[]), plugins=[])
    assert "session" not in compiled.document["task"]


# --- a session always has a time limit --------------------------------------------------


@pytest.mark.bad_input
@pytest.mark.parametrize("limit", ["UNLIMITED", "unlimited", "INFINITE"])
def test_a_session_with_no_time_limit_is_refused_at_resources_time(tmp_path, limit):
    path = tmp_path / "tcloud.yaml"
    path.write_text(f"name: lab\nrun:\n  - sleep infinity\nresources:\n  time: {limit}\nsession:\n")
    with pytest.raises(TaskFileError) as caught:
        load_task(path, selection=[])
    message = str(caught.value)
    assert f"{path}:5:" in message and "resources.time" in message, message
    assert "a session needs a time limit (UNLIMITED is refused)" in message


@pytest.mark.parametrize("resources", ["", "resources:\n  time: '8:00:00'\n"])
def test_a_session_without_a_time_or_with_one_loads(tmp_path, resources):
    path = tmp_path / "tcloud.yaml"
    path.write_text(f"name: lab\nrun:\n  - sleep infinity\n{resources}session:\n")
    assert load_task(path, selection=[]).session == DEFAULTS


def test_a_job_without_a_session_may_still_ask_for_no_time_limit(tmp_path):
    path = tmp_path / "tcloud.yaml"
    path.write_text("name: lab\nrun:\n  - sleep infinity\nresources:\n  time: UNLIMITED\n")
    assert load_task(path, selection=[]).resources["time"] == "UNLIMITED"


@pytest.mark.bad_input
@pytest.mark.security
def test_the_cluster_refuses_a_session_instruction_with_no_time_limit():
    task = {"name": "t", "run": ["true"], "resources": {"time": "UNLIMITED"}, "session": {}}
    text = json.dumps({"format": FORMAT, "task": task, "manifest": {}})
    with pytest.raises(InvalidInstruction) as caught:
        parse(text, "instruction.json")
    assert "instruction.json:1:" in str(caught.value)
    assert "task.resources.time" in str(caught.value) and "needs a time limit" in str(caught.value)
