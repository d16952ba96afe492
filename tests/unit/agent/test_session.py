"""`tacc-agent session` (tacc_agent/session.py), the real process driven over its pipes:
the hello line first, then one answer line per request line, answered by the same code
the one-shot verbs run; a bad line is an error answer and the session goes on; EOF ends
it; `store receive` reads its stream from the same stdin; a child process can neither
take a request's bytes nor break a line."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tacc_agent.cli import configured, parse_command_line
from tacc_agent.tasks.schedule import instruction
from tacc_contract import protocol, verbs
from tacc_contract.errors import AGENT_REJECTED
from tacc_contract.protocol import PROTOCOL_VERSION, Hello
from tests.unit.agent_jobs import agent, agent_env


class AgentSession:
    """A running `tacc-agent [--userdir DIR] session`, a request line at a time."""

    def __init__(self, env: dict[str, str], userdir: Path | None = None) -> None:
        options = ["--userdir", str(userdir)] if userdir else []
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tacc_agent", *options, "session"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
        )
        self.hello = self.line()

    def line(self) -> dict:
        return json.loads(self.process.stdout.readline())

    def send(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def ask(self, verb: list[str], userdir: str | None = None, stdin: bytes = b"") -> dict:
        self.send(json.dumps(protocol.session_request(verb, userdir, stdin)).encode() + b"\n")
        return protocol.SESSION_ANSWER.check(self.line())

    def end(self) -> tuple[int, bytes, bytes]:
        out, err = self.process.communicate(timeout=60)
        return self.process.returncode, out, err


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    (tmp_path / "workspace").mkdir()
    return agent_env(tmp_path)


@pytest.fixture
def session(env):
    running = AgentSession(env)
    yield running
    if running.process.poll() is None:
        running.end()


def test_the_first_line_is_the_hello_then_each_verb_answers_as_its_one_shot_form(
    session, env, tmp_path
):
    assert Hello.parse(session.hello).protocol == PROTOCOL_VERSION
    user_dir = tmp_path / "workspace" / "own"
    for verb, userdir in [
        (verbs.WHOAMI.request(), None),
        (verbs.WHOAMI.request(), str(user_dir)),
        (verbs.ENV.request(), str(user_dir)),
        (verbs.JOB_PS.request(), str(user_dir)),
        (verbs.HELLO.request(), None),
    ]:
        answer = session.ask(verb, userdir)
        one_shot = agent(*protocol.command(verb, userdir)[1:], env=env)
        assert (answer["rc"], answer["answer"]) == (
            one_shot.returncode,
            json.loads(one_shot.stdout),
        )
    assert session.end()[0] == 0


def test_stdin_travels_with_the_request(session, tmp_path):
    request = json.dumps(protocol.missing_request([f"{'a' * 64}-644"])).encode()
    answer = session.ask(verbs.STORE.request(), None, request)
    assert answer["rc"] == 0
    assert protocol.store_answer({"op": "missing"}, answer["answer"])["missing"] == [
        f"{'a' * 64}-644"
    ]
    check = session.ask(verbs.JOB_CHECK.request(), None, b"{not an instruction")
    assert check["rc"] == AGENT_REJECTED and protocol.ERROR.check(check["answer"])


def test_an_error_is_the_verbs_error_object_and_exit_code(session, env):
    answer = session.ask(verbs.JOB_STATUS.request(job="99"))
    one_shot = agent(*verbs.JOB_STATUS.request(job="99"), env=env)
    assert answer == {"rc": one_shot.returncode, "answer": json.loads(one_shot.stdout)}
    assert answer["rc"] != 0 and "no job 99" in protocol.error_message(answer["answer"])


BAD_LINES = [
    (b"not json\n", "a request is one JSON object per line"),
    (b"[1, 2]\n", "not a request"),
    (b'{"stdin": null}\n', "'verb' is missing"),
    (b'{"verb": "whoami"}\n', "verb: expected a list"),
    (b'{"verb": ["whoami"], "stdin": 5}\n', "stdin: expected text or null"),
    (b"\n", "a request is one JSON object per line"),
    (b'{"verb": ["nope"]}\n', "invalid choice: 'nope'"),
    (b'{"verb": []}\n', "not a session request: no verb"),
    (b'{"verb": ["job", "status"]}\n', "the following arguments are required: job"),
    (b'{"verb": ["--help"]}\n', "--help is not a request"),
    (b'{"verb": ["--version"]}\n', "not a session request"),
    (b'{"verb": ["job", "logs", "1"]}\n', "not a session request: job logs 1"),
    (b'{"verb": ["session"]}\n', "not a session request: session"),
    (b'{"verb": ["check", "--json"]}\n', "not a session request: check --json"),
    (b'{"verb": ["batch", "/x"]}\n', "not a session request: batch /x"),
    (b'{"verb": ["serve"]}\n', "not a session request: serve"),
    (b'{"verb": ["queue-tick"]}\n', "not a session request: queue-tick"),  # root's
    (b'{"verb": ["whoami"], "stdin": "\\ud800"}\n', "stdin: text that is not UTF-8"),
    (b'{"verb": ["job", "logs", "1", "--tail", "x"]}\n', "not a session request"),
    (b'{"verb": ["job", "halt", "1", "--grace", "soon"]}\n', "--grace: expected seconds"),
    (b"[" * 100_000 + b"\n", "a request is one JSON object per line"),  # nested too deep
]


@pytest.mark.bad_input
@pytest.mark.parametrize(("line", "message"), BAD_LINES, ids=[m for _, m in BAD_LINES])
def test_a_bad_line_answers_an_error_and_the_session_goes_on(session, line, message):
    session.send(line)
    answer = protocol.SESSION_ANSWER.check(session.line())
    assert answer["rc"] == AGENT_REJECTED
    assert message in protocol.ERROR.check(answer["answer"])["error"]
    assert session.ask(verbs.WHOAMI.request())["rc"] == 0
    rc, out, err = session.end()
    assert (rc, out) == (0, b"")
    assert b"Traceback" not in err


def test_eof_ends_the_session_at_once(session):
    assert session.end() == (0, b"", b"")


def test_the_session_userdir_is_the_default_a_request_may_name_its_own(env, tmp_path):
    default, own = tmp_path / "workspace" / "default", tmp_path / "workspace" / "own"
    session = AgentSession(env, default)
    assert session.ask(verbs.WHOAMI.request())["answer"]["userdir"] == str(default)
    assert session.ask(verbs.WHOAMI.request(), str(own))["answer"]["userdir"] == str(own)
    assert session.end()[0] == 0


@pytest.mark.security
def test_what_the_session_writes_is_private(session, tmp_path):
    user_dir = tmp_path / "workspace" / "fresh"
    session.ask(
        verbs.STORE.request(), str(user_dir), json.dumps(protocol.missing_request([])).encode()
    )
    session.end()
    made = [user_dir, *user_dir.rglob("*")]
    assert len(made) > 1
    assert all(stat.S_IMODE(p.stat().st_mode) & 0o077 == 0 for p in made), made


def test_the_hello_comes_even_when_the_settings_are_broken(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("no_such_setting: 1\n")
    session = AgentSession({**agent_env(tmp_path), "TACC_AGENT_CONFIG": str(broken)})
    assert Hello.parse(session.hello).protocol == PROTOCOL_VERSION
    answer = session.ask(verbs.WHOAMI.request())
    assert answer["rc"] != 0 and "unknown setting(s): no_such_setting" in answer["answer"]["error"]
    assert session.end()[0] == 0


# --- `store receive`: the request line, then the stream on the same stdin -----------------


def blob(data: bytes, mode: int = 0o644) -> str:
    return protocol.blob_name(hashlib.sha256(data).hexdigest(), mode)


def frames(entries: dict[str, tuple[str, bytes]]) -> bytes:
    """The framed stream (tacc_agent/tasks/store/receive.py) of whole blobs."""
    stream = b""
    for name, (upload, data) in entries.items():
        header = {"blob": name, "upload": upload, "offset": 0, "size": len(data)}
        stream += json.dumps(header).encode() + b"\n" + data
    return stream + b'{"end": true}\n'


def test_store_receive_reads_its_stream_from_the_session_stdin(session, tmp_path):
    user_dir = tmp_path / "workspace" / "user"
    contents = [b"hello\n", b"\0binary\n" * 1000]
    names = [blob(data) for data in contents]
    missing = session.ask(
        verbs.STORE.request(), str(user_dir), json.dumps(protocol.missing_request(names)).encode()
    )
    uploads = missing["answer"]["uploads"]
    request = protocol.session_request(verbs.STORE_RECEIVE.request(), str(user_dir))
    session.send(
        json.dumps(request).encode()
        + b"\n"
        + frames({name: (uploads[name], data) for name, data in zip(names, contents, strict=True)})
    )
    received = protocol.SESSION_ANSWER.check(session.line())
    assert received["rc"] == 0, received
    assert all(
        (user_dir / "store" / name).read_bytes() == data
        for name, data in zip(names, contents, strict=True)
    )
    after = session.ask(
        verbs.STORE.request(), str(user_dir), json.dumps(protocol.missing_request(names)).encode()
    )
    assert after["answer"]["missing"] == []  # the next request came out of the same buffer
    assert session.end()[0] == 0


@pytest.mark.bad_input
def test_a_refused_stream_ends_the_session_after_its_answer(session, tmp_path):
    """The rest of a refused stream cannot be told from the next request line."""
    request = protocol.session_request(
        verbs.STORE_RECEIVE.request(), str(tmp_path / "workspace" / "u")
    )
    session.send(
        json.dumps(request).encode() + b"\n" + b"not a header\n" + b'{"verb": ["whoami"]}\n'
    )
    answer = protocol.SESSION_ANSWER.check(session.line())
    assert answer["rc"] == AGENT_REJECTED and "upload stream" in answer["answer"]["error"]
    rc, out, err = session.end()
    assert (rc, out) == (AGENT_REJECTED, b"")  # the whoami in the stream was not run
    assert b"Traceback" not in err


def test_store_receive_one_shot_reads_stdin(env, tmp_path):
    user_dir = tmp_path / "workspace" / "user"
    name = blob(b"one shot\n")
    missing = agent(
        "--userdir",
        str(user_dir),
        *verbs.STORE.request(),
        env=env,
        input=json.dumps(protocol.missing_request([name])),
    )
    upload = json.loads(missing.stdout)["uploads"][name]
    received = subprocess.run(
        [
            sys.executable,
            "-m",
            "tacc_agent",
            "--userdir",
            str(user_dir),
            *verbs.STORE_RECEIVE.request(),
        ],
        input=frames({name: (upload, b"one shot\n")}),
        capture_output=True,
        env=env,
        timeout=60,
    )
    assert received.returncode == 0, received
    assert (user_dir / "store" / name).read_bytes() == b"one shot\n"


# --- the session's own stdio: children and stray prints cannot break the lines -----------

STRAY = """
import subprocess, sys
from tacc_agent import session

def handle(words, stdin, reader):
    print("a stray print")
    child = subprocess.run(["cat"], capture_output=True, check=True)  # stdin inherited
    return 0, {"words": words, "child_read": child.stdout.decode()}

sys.exit(session.serve_stdio({"protocol": 0, "agent_version": "t"}, handle))
"""


def test_a_child_reads_no_request_bytes_and_a_print_goes_to_stderr():
    requests = b"".join(
        json.dumps({"verb": [str(n)], "stdin": None}).encode() + b"\n" for n in range(3)
    )
    done = subprocess.run(
        [sys.executable, "-c", STRAY], input=requests, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines[0] == {"protocol": 0, "agent_version": "t"}
    assert [a["answer"] for a in lines[1:]] == [
        {"words": [str(n)], "child_read": ""} for n in range(3)
    ]
    assert done.stderr.count(b"a stray print") == 3


@pytest.mark.security
def test_a_refused_stream_spelt_otherwise_still_ends_the_session(session, tmp_path):
    """`store -- receive` parses as `store receive`: its refused stream's rest is never
    run as requests either."""
    request = protocol.session_request(
        ["store", "--", "receive"], str(tmp_path / "workspace" / "u")
    )
    session.send(
        json.dumps(request).encode() + b"\n" + b"not a header\n" + b'{"verb": ["whoami"]}\n'
    )
    answer = protocol.SESSION_ANSWER.check(session.line())
    assert answer["rc"] == AGENT_REJECTED
    rc, out, _ = session.end()
    assert (rc, out) == (AGENT_REJECTED, b"")


def test_one_requests_plugin_settings_do_not_leak_into_the_next(env, tmp_path):
    """A request naming settings with plug-ins, then one without: the second reads
    instructions with no plug-in fields, as its one-shot form would."""
    settings = tmp_path / "with.yaml"
    settings.write_text("plugins: [las]\n")
    configured(parse_command_line(["--config", str(settings), "whoami"]))
    assert instruction.CONFIGURED == ["las"]
    plain = tmp_path / "plain.yaml"
    plain.write_text("{}\n")
    configured(parse_command_line(["--config", str(plain), "whoami"]))
    assert instruction.CONFIGURED == []
