"""The agent protocol (tacc_contract.protocol): every verb's builder and answer shape,
the `hello` handshake tcloud makes on the first call of an SSH session (an older or a
newer agent is a clear exit-4 message, never a parse error or a traceback), and the
upload's progress bar (tqdm, silent when stderr is not a terminal)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import subprocess
import sys

import pytest

from tacc_agent import cli as agent_cli
from tacc_contract import protocol, verbs
from tacc_contract.errors import EXIT_CLUSTER, EXIT_USAGE, error_line
from tacc_contract.protocol import PROTOCOL_VERSION, BadArgument, Hello, ProtocolError
from tacc_contract.shapes import ListOf
from tcloud import cli
from tcloud.compile.compiler import Instruction
from tcloud.errors import TcloudError
from tcloud.jobs import verbs as jobs
from tcloud.transfer import upload
from tcloud.transport import agent, ssh

# --- builders ---------------------------------------------------------------------------

BUILT = [
    (verbs.HELLO.request(), ["hello"]),
    (verbs.SESSION.request(), ["session"]),
    (verbs.WHOAMI.request(), ["whoami"]),
    (verbs.QUOTA.request(), ["quota"]),
    (verbs.STORE.request(), ["store"]),
    (verbs.STORE_RECEIVE.request(), ["store", "receive"]),
    (verbs.ENV.request(), ["env"]),
    (verbs.JOB_CHECK.request(), ["job", "check"]),
    (verbs.JOB_SUBMIT.request(workdir="/w/jobs/1"), ["job", "submit", "/w/jobs/1"]),
    (verbs.JOB_PS.request(), ["job", "ps"]),
    (verbs.JOB_STATUS.request(job="12"), ["job", "status", "12"]),
    (verbs.JOB_STATUS.request(job="12_3"), ["job", "status", "12_3"]),
    (verbs.JOB_LOGS.request(job="12"), ["job", "logs", "12"]),
    (
        verbs.JOB_LOGS.request(job="12", follow=True, tail=5, rank=0),
        ["job", "logs", "12", "--follow", "--tail", "5", "--rank", "0"],
    ),
    (verbs.JOB_CANCEL.request(jobs=["1", "2_0"]), ["job", "cancel", "1", "2_0"]),
    (verbs.JOB_HALT.request(job="7"), ["job", "halt", "7"]),
    (verbs.JOB_HALT.request(job="7", grace=2.5), ["job", "halt", "7", "--grace", "2.5"]),
    (verbs.JOB_HALT.request(job="7", grace=0), ["job", "halt", "7", "--grace", "0"]),
    (verbs.JOB_RESUME.request(job="7"), ["job", "resume", "7"]),
    (verbs.JOB_RERUN.request(job="7"), ["job", "rerun", "7"]),
    (verbs.USAGE.request(), ["usage"]),
    (verbs.USAGE.request(since="2026-09"), ["usage", "--since", "2026-09"]),
    (
        verbs.USAGE.request(since="2026-09-15", until="2026-11"),
        ["usage", "--since", "2026-09-15", "--until", "2026-11"],
    ),
    (
        verbs.USAGE.request(since="2026-11", until="2026-11"),
        ["usage", "--since", "2026-11", "--until", "2026-11"],
    ),
]


@pytest.mark.parametrize(("built", "words"), BUILT, ids=[" ".join(w) for _, w in BUILT])
def test_each_builder_gives_the_words_after_tacc_agent(built, words):
    assert built == words


def test_every_verb_of_the_agent_has_a_builder():
    """The agent's parser reads every request tcloud builds back into its verb."""
    parser = agent_cli.build_parser()
    for built, _ in BUILT:
        assert parser.parse_args(built).declared is verbs.verb_named(built)


def test_command_puts_the_userdir_before_the_verb():
    assert protocol.command(["job", "ps"]) == ["tacc-agent", "job", "ps"]
    assert protocol.command(["whoami"], "/u/a") == ["tacc-agent", "--userdir", "/u/a", "whoami"]


BAD_ARGUMENTS = [
    (
        "injection",
        lambda: verbs.JOB_STATUS.request(job="12; rm -rf /"),
        "not a job id: 12; rm -rf /",
    ),
    ("traversal", lambda: verbs.JOB_RERUN.request(job="../../etc"), "not a job id: ../../etc"),
    ("empty", lambda: verbs.JOB_RESUME.request(job=""), "not a job id"),
    ("option", lambda: verbs.JOB_HALT.request(job="--help"), "not a job id: --help"),
    ("trial-of-trial", lambda: verbs.JOB_LOGS.request(job="1_2_3"), "not a job id: 1_2_3"),
    ("one-bad-of-two", lambda: verbs.JOB_CANCEL.request(jobs=["1", "x"]), "not a job id: x"),
    ("no-ids", lambda: verbs.JOB_CANCEL.request(jobs=[]), "expected at least one job id"),
    ("negative-tail", lambda: verbs.JOB_LOGS.request(job="1", tail=-1), "--tail: expected a whole"),
    ("bool-rank", lambda: verbs.JOB_LOGS.request(job="1", rank=True), "--rank: expected a whole"),
    (
        "nan-grace",
        lambda: verbs.JOB_HALT.request(job="1", grace=float("nan")),
        "--grace: expected seconds",
    ),
    (
        "text-grace",
        lambda: verbs.JOB_HALT.request(job="1", grace="soon"),
        "--grace: expected seconds",
    ),
    ("empty-workdir", lambda: verbs.JOB_SUBMIT.request(workdir=""), "expected a job directory"),
    ("nul-workdir", lambda: verbs.JOB_SUBMIT.request(workdir="/a\0b"), "expected a job directory"),
    (
        "usage-option",
        lambda: verbs.USAGE.request(since="--user=bob"),
        "--since: expected a month YYYY-MM",
    ),
    ("usage-all", lambda: verbs.USAGE.request(until="-a"), "--until: expected a month YYYY-MM"),
    ("usage-month-13", lambda: verbs.USAGE.request(since="2026-13"), "got '2026-13'"),
    ("usage-day-31", lambda: verbs.USAGE.request(since="2026-02-31"), "got '2026-02-31'"),
    ("usage-year-end", lambda: verbs.USAGE.request(since="9999-12"), "got '9999-12'"),
    ("usage-words", lambda: verbs.USAGE.request(since="2026-09 2026-10"), "got '2026-09 2026-10'"),
    ("usage-number", lambda: verbs.USAGE.request(since=202609), "got 202609"),
    (
        "usage-order",
        lambda: verbs.USAGE.request(since="2026-11", until="2026-10-31"),
        "comes after --until",
    ),
]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("build", "message"), [c[1:] for c in BAD_ARGUMENTS], ids=[c[0] for c in BAD_ARGUMENTS]
)
def test_a_builder_refuses_what_is_not_an_argument(build, message):
    with pytest.raises(BadArgument, match=None) as caught:
        build()
    assert message in str(caught.value)
    assert caught.value.exit_code == EXIT_USAGE


def test_job_id_problem_names_every_bad_id():
    assert verbs.job_id_problem(["1", "2_3"]) == ""
    problem = verbs.job_id_problem(["1", "a", "2;", 3])
    assert problem.startswith("not a job id: a, 2;, 3 (expected numbers such as 1234")


def test_the_store_requests():
    check = {"task": {"name": "t"}}
    assert protocol.missing_request(["b", "a"]) == {"op": "missing", "blobs": ["a", "b"]}
    assert protocol.missing_request(["a"], check)["check"] == check
    request = protocol.commit_request(
        ["a"], {"code/x": "a"}, {"a": "u1"}, "d" * 64, {"instruction.json": "{}"}, submit=True
    )
    assert request == {
        "op": "commit",
        "blobs": ["a"],
        "manifest": {"code/x": "a"},
        "uploads": {"a": "u1"},
        "submit": True,
        "digest": "d" * 64,
        "files": {"instruction.json": "{}"},
    }
    assert protocol.blob_name("ab" * 32, 0o755) == "ab" * 32 + "-755"
    assert protocol.BLOB_NAME.fullmatch(protocol.blob_name("ab" * 32, 0o644))
    assert upload.blob_name is protocol.blob_name  # still importable where tests look


# --- shapes -----------------------------------------------------------------------------

SUBMITTED = {
    "job_id": "12",
    "name": "t",
    "workdir": "/u/jobs/x",
    "partition": "gpu",
    "plugins": {"sweep": "4 trials"},
}
ANSWERS = {
    ("hello",): {"protocol": 1, "agent_version": "0.2.0"},
    ("whoami",): {"user": "alice", "userdir": "/shared/alice"},
    ("dashboard", "open"): {"code": "nonce.1796539506.0123abcd", "expires": 1796539506.0},
    ("store", "receive"): {"received": ["b1"], "bad": [], "bytes": 10},
    ("quota",): {
        "user": "alice",
        "running_jobs": 1,
        "pending_jobs": 0,
        "gpus_in_use": 2,
        "accounting": False,
        "message": "no accounting",
    },
    ("env",): [
        {
            "digest": "e1",
            "requirements": ["numpy"],
            "path": "/u/envs/e1",
            "lock": ["numpy==2.0"],
            "python": "3.11",
            "built_by_job": "12",
        }
    ],
    ("image", "resolve"): {
        "reference": "n1:5000/tacc/base:bookworm",
        "pinned": "n1:5000/tacc/base:bookworm@sha256:" + "a" * 64,
        "digest": "sha256:" + "a" * 64,
    },
    ("image", "ls"): [
        {
            "digest": "sha256:" + "a" * 64,
            "reference": "n1:5000/tacc/base:bookworm@sha256:" + "a" * 64,
            "path": "/u/images/" + "a" * 64,
            "pulled_by_job": "12",
            "seconds": 1.5,
            "bytes": 1000,
        }
    ],
    ("job", "check"): {"ok": True, "partition": "gpu"},
    ("job", "submit"): SUBMITTED,
    ("job", "ps"): [
        {
            "job": "12",
            "name": "t",
            "state": "RUNNING",
            "submitted": "2025-01-01 10:00:00",
            "nodes": "n1",
        }
    ],
    ("job", "status"): {
        "job_id": "12",
        "name": "t",
        "state": "FAILED",
        "reason": "exit 1",
        "exit_code": 1,
        "slurm_state": None,
        "workdir": "/u/jobs/x",
        "history": [{"state": "QUEUED", "time": 1.5}, {"state": "RUNNING", "time": 2}],
        "nodes": [{"rank": 0, "host": "n1", "state": "EXITED", "exit_code": 1, "signal": None}],
        "plugins": {},
        "environment": None,
        "code_digest": "c" * 64,
        "rerun_of": None,
        "last_lines": {"n1:0": ["boom"]},
    },
    ("job", "cancel"): [
        {"job_id": "12", "state": "CANCELLED", "cancelled": True},
        {"job_id": "13", "state": "RUNNING", "cancelled": True, "trials": 2},
    ],
    ("job", "halt"): {
        "job_id": "12",
        "state": "HALTED",
        "checkpoint_signal": True,
        "exited_in_grace": False,
        "grace_seconds": 30,
    },
    ("job", "resume"): {"job_id": "12", "state": "QUEUED"},
    ("job", "rerun"): {**SUBMITTED, "rerun_of": "11", "code_digest": "c" * 64, "lock": []},
    ("job", "target"): {
        "job_id": "12",
        "slurm_job_id": "12",
        "state": "RUNNING",
        "session": None,
        "nodes": [
            {"host": "n2", "rank": 0, "address": "10.0.0.2"},
            {"host": "n3", "rank": 1, "address": "10.0.0.3"},
        ],
    },
    ("job", "top"): {
        "job_id": "12",
        "state": "RUNNING",
        "time": 1700000000.5,
        "nodes": [
            {
                "host": "n2",
                "rank": 0,
                "cpu_seconds": 12.5,
                "memory_bytes": 1 << 30,
                "cpus": 2,
                "sampled": 1700000000.1,
                "gpus": [
                    {
                        "index": 0,
                        "utilization_ratio": 0.5,
                        "memory_used_bytes": 1 << 30,
                        "memory_total_bytes": 80 << 30,
                    }
                ],
            },
            {"host": "n3", "rank": 1, "error": "connection refused"},
        ],
    },
    ("usage",): {
        "user": "alice",
        "since": "2026-09-01T00:00:00",
        "until": "2026-11-24T20:00:00",
        "rows": [
            {
                "month": "2026-10",
                "account": "physics",
                "partition": "gpu",
                "jobs": 2,
                "running": 1,
                "cpu_seconds": 57600,
                "gpu_seconds": 14400,
            }
        ],
    },
}
SWEEP_STATUS = {
    "job_id": "20",
    "name": "s",
    "state": "RUNNING",
    "reason": "1 COMPLETED, 1 RUNNING",
    "exit_code": None,
    "workdir": "/u/jobs/s",
    "sweep": True,
    "history": [],
    "nodes": [],
    "plugins": {},
    "trials": [
        {
            "trial": 0,
            "job_id": "20_0",
            "state": "COMPLETED",
            "reason": None,
            "exit_code": 0,
            "parameters": {"lr": 0.1},
            "nodes": "n1",
        },
        {
            "trial": 1,
            "job_id": "20_1",
            "state": "RUNNING",
            "reason": None,
            "exit_code": None,
            "parameters": {"lr": 0.2},
            "nodes": "",
        },
    ],
}


def test_every_verb_with_a_json_answer_has_a_shape_and_a_sample_here():
    assert set(ANSWERS) == {verb.words for verb in verbs.VERBS if verb.answer is not None}


@pytest.mark.parametrize("words", sorted(ANSWERS), ids=" ".join)
def test_each_shape_takes_what_the_agent_answers(words):
    extra = {
        "status": "12",
        "halt": "12",
        "resume": "12",
        "rerun": "12",
        "resolve": "h:1/a",
        "target": "12",
        "top": "12",
    }
    verb = [*words, extra[words[-1]]] if words[-1] in extra else list(words)
    answer = ANSWERS[words]
    assert parse_answer(verb, json.loads(json.dumps(answer))) == answer


def test_a_sweep_status_fits_and_extra_keys_are_kept():
    """A newer agent may say more: keys beyond the shape pass through."""
    answer = {**SWEEP_STATUS, "new_key": [1, 2]}
    assert parse_answer(["job", "status", "20"], answer) is answer


def parse_answer(words: list[str], answer: object) -> object:
    return verbs.verb_named(words).check_answer(answer)


def required_keys(shape) -> list[str]:
    item = shape.item if isinstance(shape, ListOf) else shape
    return list(item.required)


def without(answer, key):
    if isinstance(answer, list):
        return [without(answer[0], key), *answer[1:]]
    return {k: v for k, v in answer.items() if k != key}


def retyped(answer, key):
    if isinstance(answer, list):
        return [retyped(answer[0], key), *answer[1:]]
    return {**answer, key: {"not": "this"}}


MISSING = [
    (w, k) for w in sorted(ANSWERS) for k in required_keys(verbs.BY_NAME[" ".join(w)].answer)
]


@pytest.mark.bad_input
@pytest.mark.parametrize(("words", "key"), MISSING, ids=[f"{' '.join(w)}-{k}" for w, k in MISSING])
def test_an_answer_missing_a_key_is_a_protocol_error_naming_verb_and_key(words, key):
    with pytest.raises(ProtocolError) as caught:
        parse_answer(list(words), without(ANSWERS[words], key))
    message = str(caught.value)
    assert f"`tacc-agent {' '.join(words)}`" in message
    assert f"the key {key!r} is missing" in message
    assert caught.value.exit_code == EXIT_CLUSTER


@pytest.mark.bad_input
@pytest.mark.parametrize(("words", "key"), MISSING, ids=[f"{' '.join(w)}-{k}" for w, k in MISSING])
def test_an_answer_with_a_mistyped_key_is_a_protocol_error_naming_it(words, key):
    with pytest.raises(ProtocolError) as caught:
        parse_answer(list(words), retyped(ANSWERS[words], key))
    assert f"{key}: expected " in str(caught.value)
    assert 'got an object {"not": "this"}' in str(caught.value)


MISFITS = [
    (
        "status-node-host",
        ["job", "status", "1"],
        {**ANSWERS[("job", "status")], "nodes": [{"rank": 0, "state": "RUNNING"}]},
        "nodes[0]: the key 'host' is missing",
    ),
    (
        "status-trial-state",
        ["job", "status", "1"],
        {**SWEEP_STATUS, "trials": [{"job_id": "1_0", "state": 3}]},
        "trials[0].state: expected text, got a whole number 3",
    ),
    ("ps-not-a-list", ["job", "ps"], {"job": "1"}, "the answer: expected a list, got an object"),
    ("whoami-a-list", ["whoami"], [], "the answer: expected an object, got a list []"),
    (
        "hello-bool",
        ["hello"],
        {"protocol": True, "agent_version": "1"},
        "protocol: expected a whole number, got true",
    ),
    (
        "cancel-int",
        ["job", "cancel", "1"],
        [{"job_id": "1", "state": "X", "cancelled": 1}],
        "[0].cancelled: expected true or false",
    ),
    (
        "halt-grace",
        ["job", "halt", "1"],
        {**ANSWERS[("job", "halt")], "grace_seconds": "30"},
        "grace_seconds: expected a number",
    ),
    (
        "exit-code-float",
        ["job", "status", "1"],
        {**ANSWERS[("job", "status")], "exit_code": 1.5},
        "exit_code: expected a whole number or null, got a number 1.5",
    ),
]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("verb", "answer", "message"), [c[1:] for c in MISFITS], ids=[c[0] for c in MISFITS]
)
def test_nested_and_typed_misfits_are_named(verb, answer, message):
    with pytest.raises(ProtocolError, match=None) as caught:
        parse_answer(verb, answer)
    assert message in str(caught.value)


def test_store_answers_are_shaped_by_their_op():
    missing = {"missing": ["a"], "partial": {}, "uploads": {"a": "u"}, "userdir": "/u"}
    committed = {"workdir": "/u/jobs/x", "userdir": "/u", "bad": [], "job": SUBMITTED}
    assert protocol.store_answer({"op": "missing"}, missing) is missing
    assert protocol.store_answer({"op": "commit"}, committed) is committed
    assert protocol.store_answer({"op": "commit"}, {"workdir": None, "bad": ["a"]})
    with pytest.raises(ProtocolError, match=r"store \(commit\)`.*job: the key 'job_id'"):
        protocol.store_answer({"op": "commit"}, {**committed, "job": {"name": "t"}})
    with pytest.raises(ProtocolError, match="the key 'partial' is missing"):
        protocol.store_answer({"op": "missing"}, {"missing": [], "userdir": "/u"})
    with pytest.raises(BadArgument, match="unknown op 'other'"):
        protocol.store_answer({"op": "other"}, {})


def test_verbs_without_a_json_shape_pass_through():
    assert verbs.JOB_LOGS.answer is None
    assert verbs.STORE.answer is None
    assert parse_answer(["store"], {"anything": 1}) == {"anything": 1}
    assert verbs.verb_named(["job", "status", "1"]) is verbs.JOB_STATUS
    assert verbs.verb_named(["store", "receive"]) is verbs.STORE_RECEIVE
    assert verbs.verb_named(["whoami"]) is verbs.WHOAMI


def test_error_answers():
    assert error_line("no") == '{"error": "no", "field": "", "kind": "rejected"}'
    line = error_line("bad gpus", "resources.gpus")
    assert json.loads(line) == {"error": "bad gpus", "field": "resources.gpus", "kind": "rejected"}
    assert json.loads(error_line("down", "", 3))["kind"] == "cluster"
    assert line.startswith(agent.ERROR_LINE.decode())  # what `logs` looks for in a stream
    assert protocol.error_message(json.loads(line)) == "bad gpus"
    assert protocol.error_message({"error": 3}) is None
    assert protocol.error_message([]) is None


# --- the agent's side -------------------------------------------------------------------


def agent_says(argv: list[str]) -> tuple[int, str]:
    """The agent's main in this process; the umask it sets (077) is put back, so that
    later tests in this worker (a lab's node directories) do not inherit it."""
    out = io.StringIO()
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        with contextlib.redirect_stdout(out):
            rc = agent_cli.main(argv)
    finally:
        os.umask(umask)
    return rc, out.getvalue()


def test_the_agent_says_hello_with_its_protocol_and_version(tmp_path):
    broken = tmp_path / "config.yaml"  # hello comes before the settings: it still answers
    broken.write_text("no_such_setting: 1\n")
    assert agent_says(["--config", str(broken), "whoami"])[0] != 0
    rc, out = agent_says(["--config", str(broken), "hello"])
    assert rc == 0
    hello = Hello.parse(json.loads(out))
    assert hello.protocol == PROTOCOL_VERSION
    assert hello.agent_version == agent_cli.agent_version() != ""


def test_the_agent_whoami_is_the_protocols_shape(tmp_path):
    settings = tmp_path / "config.yaml"
    settings.write_text(f"workspace: {tmp_path / 'ws'}\n")
    rc, out = agent_says(["--config", str(settings), "--userdir", str(tmp_path / "u"), "whoami"])
    assert rc == 0, out
    assert verbs.WHOAMI.answer.check(json.loads(out))["userdir"] == str(tmp_path / "u")


def test_the_agent_error_line_is_the_contracts(tmp_path):
    settings = tmp_path / "config.yaml"
    settings.write_text(f"workspace: {tmp_path / 'ws'}\n")
    rc, out = agent_says(
        ["--config", str(settings), "--userdir", str(tmp_path / "u"), "job", "status", "99"]
    )
    assert rc != 0
    assert protocol.ERROR.check(json.loads(out))
    assert out.startswith(agent.ERROR_LINE.decode())


# --- the handshake, against a fake SSH connection ---------------------------------------

OLD_AGENT_USAGE = (
    "usage: tacc-agent [-h] [--version] [--config CONFIG] [--userdir USERDIR]\n"
    "tacc-agent: error: argument command: invalid choice: 'session' (choose from 'hello', "
    "'check', 'serve', 'whoami', 'quota', 'store', 'env', 'job', 'batch', 'exec')\n"
)


class FakeSession:
    """`tacc-agent session` as paramiko's three channel files: it writes `hello`'s
    stdout first; if that is a hello, each request line sent is answered from the
    agent's script, else the process ends there with `hello`'s exit code and stderr."""

    def __init__(self, agent: FakeAgent) -> None:
        self.agent = agent
        self.channel = self
        rc, out, err = agent.hello
        text = out if isinstance(out, str) else json.dumps(out)
        self.serving = rc == 0 and agent_hello(text)
        self.out = (text + "\n").encode() if text else b""
        self.rc, self.err = (0, b"") if self.serving else (rc, err.encode())
        self.closed = False

    # stdin (its channel)
    def sendall(self, data: bytes) -> None:
        assert self.serving and not self.closed, "a request after the session ended"
        request = protocol.SESSION_REQUEST.check(json.loads(data))
        self.agent.commands.append(["tacc-agent", *request["verb"]])
        words = request["verb"]
        words = words[2:] if words[:1] == ["--userdir"] else words
        name = verbs.verb_named(words).name
        rc, out, _err = self.agent.answers.get(name, (0, ANSWERS.get(tuple(name.split())), ""))
        self.out += json.dumps({"rc": rc, "answer": out}).encode() + b"\n"

    def shutdown_write(self) -> None:
        self.closed = True

    def close(self) -> None:
        self.closed = True

    # stdout and stderr
    def readline(self) -> bytes:
        line, newline, self.out = self.out.partition(b"\n")
        return line + newline

    def read(self) -> bytes:
        out, self.out = self.out, b""
        return out

    def recv_exit_status(self) -> int:
        return self.rc

    def exit_status_ready(self) -> bool:
        return self.closed


def agent_hello(text: str) -> bool:
    try:
        Hello.parse(json.loads(text))
    except (ValueError, ProtocolError):
        return False
    return True


class Stderr:
    def __init__(self, session: FakeSession) -> None:
        self.session, self.channel = session, session

    def read(self) -> bytes:
        return self.session.err


class FakeAgent:
    """An SSH client whose login node runs a scripted tacc-agent: `hello` is what its
    `session` first says (rc, stdout, stderr), answers verb -> (rc, answer, stderr).
    Records every command line it is asked to run, and each session request."""

    def __init__(
        self,
        hello=(0, {"protocol": PROTOCOL_VERSION, "agent_version": "9"}, ""),
        answers: dict | None = None,
    ) -> None:
        self.hello = hello
        self.answers = answers or {}
        self.commands: list[list[str]] = []

    def exec_command(self, line: str):
        argv = shlex.split(line)
        assert argv == ["tacc-agent", "session"], argv  # every verb goes through the session
        self.commands.append(argv)
        session = FakeSession(self)
        return session, session, Stderr(session)

    def get_transport(self):
        raise AssertionError("a stream was opened before the handshake refused the agent")

    def verbs(self) -> list[str]:
        return [" ".join(c[1:]) for c in self.commands]


def test_one_session_per_ssh_client_says_hello_then_serves_the_verbs():
    client = FakeAgent()
    assert jobs.ps(client, None) == ANSWERS[("job", "ps")]
    assert jobs.status(client, "/u", "12")["job_id"] == "12"
    assert jobs.whoami(client, None)["user"] == "alice"
    assert client.verbs() == ["session", "job ps", "--userdir /u job status 12", "whoami"]
    other = FakeAgent()
    jobs.quota(other, None)
    assert other.verbs() == ["session", "quota"]
    assert agent.handshake(client) == Hello(PROTOCOL_VERSION, "9")
    assert client.verbs()[-1] == "whoami"  # the hello came with the session: no round trip


def test_the_real_agents_session_hello_passes_the_handshake():
    class RealHello(FakeAgent):
        def exec_command(self, line: str):
            real = subprocess.run(  # the real session, its stdin at EOF at once
                [sys.executable, "-m", "tacc_agent", *shlex.split(line)[1:]],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert real.returncode == 0 and real.stdout.count("\n") == 1, real
            self.hello = (real.returncode, real.stdout.strip(), real.stderr)
            return super().exec_command(line)

    client = RealHello()
    jobs.environments(client, None)
    assert client.verbs() == ["session", "env"]


def mismatch(client, call=lambda c: jobs.ps(c, None)) -> TcloudError:
    with pytest.raises(agent.AgentMismatch) as caught:
        call(client)
    assert caught.value.exit_code == EXIT_CLUSTER == 4
    assert client.verbs() == ["session"]  # nothing else was asked
    return caught.value


UPGRADE_AGENT = (
    f"the cluster's tacc-agent is older than this tcloud (protocol {PROTOCOL_VERSION}): "
    "upgrade the agent (re-run the tacc_agent role)"
)


@pytest.mark.bad_input
def test_an_agent_older_than_session_is_told_to_upgrade():
    error = mismatch(FakeAgent(hello=(2, "", OLD_AGENT_USAGE)))
    assert str(error).startswith(UPGRADE_AGENT)
    assert "it does not know the verb `session`" in str(error)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "hello",
    [(0, "", ""), (0, "hello world", ""), (0, {"user": "x"}, ""), (1, "", "Traceback ...")],
    ids=["silent", "text", "other-json", "crash"],
)
def test_an_agent_that_answers_hello_with_no_protocol_is_older(hello):
    assert str(mismatch(FakeAgent(hello=hello))).startswith(UPGRADE_AGENT)


@pytest.mark.bad_input
def test_an_agent_with_an_older_protocol_is_told_to_upgrade():
    error = mismatch(FakeAgent(hello=(0, {"protocol": 1, "agent_version": "0.1.0"}, "")))
    assert str(error).startswith(UPGRADE_AGENT)
    assert "it is 0.1.0, speaking protocol 1" in str(error)


@pytest.mark.bad_input
def test_a_newer_agent_asks_to_upgrade_tcloud():
    newer = {"protocol": PROTOCOL_VERSION + 1, "agent_version": "9.0"}
    error = mismatch(FakeAgent(hello=(0, newer, "")))
    assert f"speaks protocol {PROTOCOL_VERSION + 1}, newer than this tcloud's" in str(error)
    assert "upgrade tcloud" in str(error)


@pytest.mark.bad_input
def test_logs_and_uploads_shake_hands_first():
    old = (2, "", OLD_AGENT_USAGE)
    mismatch(FakeAgent(hello=old), lambda c: jobs.logs(c, None, "1", False, None, None))
    mismatch(FakeAgent(hello=old), lambda c: upload.remote(c, {"op": "missing"}, None))


def test_a_failed_handshake_is_asked_again_on_the_next_call():
    client = FakeAgent(hello=(2, "", OLD_AGENT_USAGE))
    mismatch(client)
    client.hello = FakeAgent().hello  # upgraded meanwhile
    jobs.ps(client, None)
    assert client.verbs()[1:] == ["session", "job ps"]


@pytest.mark.bad_input
def test_an_agent_that_knows_session_but_fails_says_why():
    client = FakeAgent(hello=(3, {"error": "internal error: OSError: disk"}, ""))
    with pytest.raises(TcloudError, match=r"^internal error: OSError: disk$") as caught:
        jobs.ps(client, None)
    assert not isinstance(caught.value, agent.AgentMismatch)


@pytest.mark.bad_input
def test_no_agent_on_the_login_node():
    with pytest.raises(TcloudError, match="tacc-agent is not installed on the login node"):
        jobs.ps(FakeAgent(hello=(127, "", "sh: tacc-agent: not found")), None)


@pytest.mark.bad_input
def test_an_answer_of_the_wrong_shape_is_a_protocol_error_not_a_key_error():
    client = FakeAgent(answers={"job status": (0, {"job_id": "12", "state": "RUNNING"}, "")})
    with pytest.raises(ProtocolError, match=r"`tacc-agent job status`.*'name' is missing"):
        jobs.status(client, None, "12")


def test_a_refusal_keeps_its_message_and_exit_code():
    client = FakeAgent(answers={"job status": (2, {"error": "job 12 is not yours"}, "")})
    with pytest.raises(TcloudError, match=r"^job 12 is not yours$") as caught:
        jobs.status(client, None, "12")
    assert caught.value.exit_code == EXIT_CLUSTER


@pytest.mark.bad_input
def test_tcloud_says_upgrade_the_agent_with_exit_4_and_no_traceback(tmp_path, monkeypatch, capsys):
    """The whole command line: `tcloud ps` against an agent older than `hello`."""
    settings = tmp_path / "config.yaml"
    settings.write_text("current: lab\nclusters:\n  lab: {host: login.example}\n")
    monkeypatch.setenv("TCLOUD_CONFIG", str(settings))
    monkeypatch.setenv("HOME", str(tmp_path))
    old = FakeAgent(hello=(2, "", OLD_AGENT_USAGE))
    monkeypatch.setattr(ssh, "connect", lambda *args, **kwargs: old)
    old.close = lambda: None
    assert cli.main(["ps"]) == 4
    err = capsys.readouterr().err
    assert UPGRADE_AGENT in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.bad_input
def test_tcloud_says_upgrade_tcloud_for_a_newer_agent(tmp_path, monkeypatch, capsys):
    settings = tmp_path / "config.yaml"
    settings.write_text("current: lab\nclusters:\n  lab: {host: login.example}\n")
    monkeypatch.setenv("TCLOUD_CONFIG", str(settings))
    monkeypatch.setenv("HOME", str(tmp_path))
    newer = FakeAgent(hello=(0, {"protocol": PROTOCOL_VERSION + 1, "agent_version": "9"}, ""))
    newer.close = lambda: None
    monkeypatch.setattr(ssh, "connect", lambda *args, **kwargs: newer)
    assert cli.main(["status", "12"]) == 4
    err = capsys.readouterr().err
    assert "upgrade tcloud" in err and "Traceback" not in err


# --- the upload's progress bar ----------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_is_silent_when_stderr_is_not_a_terminal(monkeypatch):
    quiet = io.StringIO()
    monkeypatch.setattr(sys, "stderr", quiet)
    progress = upload.Progress(3 << 20)
    progress.add(1 << 20)
    progress.add(2 << 20)
    progress.close()
    assert quiet.getvalue() == ""


def test_the_progress_bar_shows_bytes_on_a_terminal(monkeypatch):
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    progress = upload.Progress(3 << 20)
    progress.add(3 << 20)
    progress.close()
    shown = screen.getvalue()
    assert "upload" in shown and "100%" in shown and "3.00M" in shown


def test_nothing_to_send_shows_no_bar(monkeypatch):
    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    upload.Progress(0).close()
    assert screen.getvalue() == ""


def test_the_upload_checks_the_store_answers(monkeypatch, tmp_path):
    """A store answer without the keys the upload reads is a ProtocolError."""
    monkeypatch.setattr(upload, "remote", lambda client, request, userdir: {"missing": []})
    instruction = Instruction(manifest={}, document={}, digest="d" * 64)
    with pytest.raises(ProtocolError, match=r"store \(missing\)`.*'partial' is missing"):
        upload.upload(object(), instruction)
