"""Every declared verb end to end through a fake transport ([19] point 1): tcloud builds
the request from the contract's record (tacc_contract.verbs), the agent's parser reads
the same record back into the same fields and dispatches to the verb's one handler, and
the answer is checked against the verb's type on both sides. Errors travel as one kind,
which each side maps to its exit code in one table. docs/protocol.md holds the table
the contract generates."""

from __future__ import annotations

import io
import json

import pytest

from tacc_agent import cli as agent_cli
from tacc_agent.errors import AgentError
from tacc_agent.node_verbs import NODE_VERBS
from tacc_contract import protocol, verbs
from tacc_contract.errors import ERROR_KINDS
from tacc_contract.verbs import Verb
from tacc_contract.wire import BadArgument
from tcloud.errors import EXIT_CLUSTER, EXIT_INVALID_TASK, EXIT_OF_KIND, AgentFailure
from tcloud.transport import agent
from tests.conftest import ROOT
from tests.unit.contract.test_protocol import ANSWERS

# A request of each verb, as tcloud would ask it.
FIELDS: dict[Verb, dict] = {
    verbs.IMAGE_RESOLVE: {"reference": "n1:5000/tacc/base:1"},
    verbs.JOB_SUBMIT: {"workdir": "/shared/alice/jobs/1"},
    verbs.JOB_STATUS: {"job": "12_3"},
    verbs.JOB_LOGS: {"job": "12", "follow": True, "tail": 5, "rank": 1},
    verbs.JOB_PS: {"limit": 200},
    verbs.JOB_CANCEL: {"jobs": ["1", "2_0"]},
    verbs.JOB_HALT: {"job": "7", "grace": 2.5},
    verbs.JOB_RESUME: {"job": "7"},
    verbs.JOB_RERUN: {"job": "7"},
    verbs.JOB_TARGET: {"job": "7", "rank": 1},
    verbs.JOB_ATTACH: {"job": "7", "rank": 1, "pty": True, "command": ["ls", "-l", "--", "x"]},
    verbs.JOB_CONNECT: {"job": "7", "rank": 0, "socket": "/tmp/s.sock", "check": True},
    verbs.JOB_STOP_ON_DISCONNECT: {"job": "7"},
    verbs.DASHBOARD_CONNECT: {},
    verbs.JOB_TOP: {"job": "7"},
    verbs.USAGE: {"since": "2026-09", "until": "2026-11"},
}
STORE_ANSWER = {"missing": [], "partial": {}, "userdir": "/u"}


def sample_answer(verb: Verb) -> object:
    return STORE_ANSWER if verb is verbs.STORE else ANSWERS[verb.words]


class FakeSession:
    """The agent's session in this process: each request line is what `tacc-agent
    session` would run (its parser, its dispatch, its answer check)."""

    def __init__(self) -> None:
        self.verbs = agent_cli.SessionVerbs(agent_cli.parse_command_line(["session"]))

    def request(self, words, userdir, stdin=b"", produce=None):
        stream = io.BytesIO()
        if produce is not None:
            produce(stream.write)
            stream.seek(0)
        return self.verbs(list(words), stdin, stream)

    def close(self) -> None:
        pass


class FakeTransport:
    """What tcloud.transport.agent.session takes for a connection (a SessionSource)."""

    def __init__(self) -> None:
        self.session = FakeSession()

    def agent_session(self) -> FakeSession:
        return self.session


@pytest.fixture
def handled(monkeypatch):
    """Every answering verb's handler replaced by one that records its fields and
    answers the verb's sample."""
    seen: dict[Verb, dict] = {}

    def stub(verb: Verb):
        def handler(call: agent_cli.Call) -> object:
            seen[verb] = {item.name: getattr(call.args, item.name) for item in verb.fields}
            return sample_answer(verb)

        return handler

    for verb in list(agent_cli.ANSWERS):
        monkeypatch.setitem(agent_cli.ANSWERS, verb, stub(verb))
    return seen


def test_every_verb_has_exactly_one_handler():
    for verb in (*verbs.VERBS, *NODE_VERBS):
        assert (verb in agent_cli.ANSWERS) != (verb in agent_cli.STREAMS), verb.name
        assert verb.streams == (verb in agent_cli.STREAMS), verb.name
    assert set(agent_cli.ANSWERS) | set(agent_cli.STREAMS) == {*verbs.VERBS, *NODE_VERBS}


ANSWERING = [verb for verb in verbs.VERBS if not verb.streams]


@pytest.mark.parametrize("verb", ANSWERING, ids=lambda verb: verb.name)
def test_each_answering_verb_end_to_end(verb, handled):
    fields = FIELDS.get(verb, {})
    transport = FakeTransport()
    if verb.stdin == "stream":
        answer = agent.call_streaming(transport, verb, None, lambda write: write(b"x"))
    else:
        answer = agent.call(transport, verb, None, b"{}" if verb.stdin else b"", **fields)
    assert answer == sample_answer(verb)
    if verb is not verbs.HELLO:  # hello answers before anything (its handler is not stubbed)
        expected = {item.name: fields.get(item.name, item.default) for item in verb.fields}
        assert handled[verb] == expected


STREAMING = [verb for verb in verbs.VERBS if verb.streams and verb is not verbs.SESSION]


@pytest.mark.parametrize("verb", STREAMING, ids=lambda verb: verb.name)
def test_each_streaming_verb_is_parsed_back_into_its_fields(verb):
    fields = FIELDS[verb]
    args = agent_cli.parse_command_line(verb.request(**fields))
    assert args.declared is verb
    for item in verb.fields:
        assert getattr(args, item.name) == fields.get(item.name, item.default), item.name


@pytest.mark.bad_input
def test_an_answer_that_does_not_fit_is_refused_by_the_agent_naming_verb_and_key(monkeypatch):
    monkeypatch.setitem(agent_cli.ANSWERS, verbs.JOB_STATUS, lambda call: {"job_id": "1"})
    with pytest.raises(AgentFailure) as caught:
        agent.call(FakeTransport(), verbs.JOB_STATUS, None, job="1")
    assert "`tacc-agent job status`" in str(caught.value)
    assert "the key 'name' is missing" in str(caught.value)
    assert caught.value.kind == "cluster" and caught.value.exit_code == EXIT_CLUSTER


@pytest.mark.parametrize("kind", sorted(ERROR_KINDS))
@pytest.mark.parametrize("verb", [verbs.JOB_CANCEL, verbs.STORE], ids=lambda verb: verb.name)
def test_an_error_travels_as_its_kind_and_each_side_maps_it_once(monkeypatch, verb, kind):
    def refuse(call):
        raise AgentError(f"no ({kind})", ERROR_KINDS[kind])

    monkeypatch.setitem(agent_cli.ANSWERS, verb, refuse)
    rc, answer = FakeSession().request(verb.request(**FIELDS.get(verb, {})), None, b"{}")
    assert rc == ERROR_KINDS[kind] and answer["kind"] == kind
    with pytest.raises(AgentFailure, match=rf"^no \({kind}\)$") as caught:
        agent.call(FakeTransport(), verb, None, b"{}", **FIELDS.get(verb, {}))
    task_rejected = verb.task and kind == "rejected"
    assert caught.value.exit_code == (EXIT_INVALID_TASK if task_rejected else EXIT_OF_KIND[kind])


def test_the_docs_verb_table_is_the_contracts():
    text = (ROOT / "docs" / "protocol.md").read_text()
    assert verbs.table() in text, "regenerate it: python -m tacc_contract.verbs"


def test_every_answer_type_reaches_json_and_back():
    for verb in ANSWERING:
        if verb.answer is not None:
            assert verb.check_answer(json.loads(json.dumps(sample_answer(verb))))


@pytest.mark.security
def test_a_value_that_starts_with_a_dash_is_never_read_as_an_option():
    """A halt's reason is a plug-in's text: `--reason -x` would be read as an option."""
    words = verbs.JOB_HALT.request(job="1", reason="--userdir=/shared/bob")
    assert words[-1] == "--reason=--userdir=/shared/bob"
    args = agent_cli.parse_command_line(words)
    assert args.reason == "--userdir=/shared/bob" and args.userdir is None


def test_version_and_the_node_verbs_numbers_are_read_strictly(capsys):
    assert agent_cli.main(["--version"]) == 0
    assert capsys.readouterr().out.strip()
    for words in (["serve", "--interval", "x"], ["serve", "--port", "abc"]):
        with pytest.raises(SystemExit) as caught:
            agent_cli.parse_command_line(words)
        assert caught.value.code == 2
    assert agent_cli.parse_command_line(["enter", "/j", "--rank", "x"]) is None
    assert "--rank: expected a whole number" in capsys.readouterr().err


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: verbs.JOB_SUBMIT.request(workdir="-h"), "expected a job directory"),
        (lambda: verbs.JOB_STATUS.request(job="\u0661\u0662"), "not a job id"),
        (lambda: verbs.JOB_CONNECT.request(job="1"), "expected a port (1..65535) or a socket"),
    ],
    ids=["dash-workdir", "arabic-digits", "connect-no-target"],
)
def test_a_request_that_cannot_go_is_refused_before_anything_is_sent(build, message):
    with pytest.raises(BadArgument) as caught:
        build()
    assert message in str(caught.value)


def test_a_userdir_that_starts_with_a_dash_is_never_an_option():
    argv = protocol.command(["whoami"], "-x")
    assert argv == ["tacc-agent", "--userdir=-x", "whoami"]
    assert agent_cli.parse_command_line(argv[1:]).userdir == "-x"
