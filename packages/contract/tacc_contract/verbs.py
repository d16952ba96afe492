"""Every verb of the agent that tcloud calls, declared once (`Verb`): its words, its
request fields with their types and checks, its stdin, its answer type
(tacc_contract.answers) and the error kinds it may return (tacc_contract.errors).

From this one record come:
- the client's call: `verbs.JOB_CANCEL.request(jobs=["12"])` is the words after
  `tacc-agent`, each field checked first (BadArgument names it: a job id is 1234, or
  1234_5 for trial 5 of sweep 1234);
- the agent's argument parsing (tacc_agent/verb_parser.py builds argparse from it) and
  its dispatch (tacc_agent/cli.py: one handler per Verb);
- the answer check on both sides (`Verb.check_answer`) and the SDK's typed result (the
  Verb's type parameter);
- the verb table in docs/protocol.md (`python -m tacc_contract.verbs`).

The node's and ops' own verbs (check, serve, batch, exec, ...) are the agent's and are
declared with the same record in tacc_agent/node_verbs.py."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from typing import Any, Generic, TypeVar

from tacc_contract import answers
from tacc_contract.errors import ERROR_KINDS
from tacc_contract.jobs import PS_LIMIT
from tacc_contract.shapes import ListOf, Shape, list_of, shape_of
from tacc_contract.wire import AGENT, BadArgument

T = TypeVar("T")

JOB_ID = re.compile(r"[0-9]+(_[0-9]+)?")  # 1234, or 1234_5: trial 5 of sweep 1234
# `usage --since/--until`: a month (2026-11) or a day (2026-11-05).
USAGE_DATE = re.compile(r"([0-9]{4})-([0-9]{2})(?:-([0-9]{2}))?")
STDIN_KINDS = ("", "json", "instruction", "stream")


# --- what a field may hold ---------------------------------------------------------------


def job_id_problem(job_ids: Sequence[object]) -> str:
    """ "" when every id is a job id, else the message that names the bad ones."""
    bad = [job for job in job_ids if not isinstance(job, str) or not JOB_ID.fullmatch(job)]
    if not bad:
        return ""
    return (
        f"not a job id: {', '.join(map(str, bad))} (expected numbers such as 1234, or "
        "1234_5 for trial 5 of a sweep)"
    )


def job_ids_problem(value: object) -> str:
    if not isinstance(value, list | tuple) or not value:
        return "expected at least one job id"
    return job_id_problem(list(value))


def one_job_problem(value: object) -> str:
    return job_id_problem([value])


def whole_number_problem(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"expected a whole number >= 0, got {value!r}"
    return ""


def seconds_problem(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        return f"expected seconds, got {value!r}"
    return ""


def directory_problem(value: object) -> str:
    if not isinstance(value, str) or not value or "\0" in value or value.startswith("-"):
        return f"expected a job directory, got {value!r}"
    return ""


def reference_problem(value: object) -> str:
    if not isinstance(value, str) or not value or value.startswith("-"):
        return f"expected an image reference, got {value!r}"
    return ""


def command_problem(value: object) -> str:
    if not isinstance(value, list | tuple) or any(
        not isinstance(word, str) or "\0" in word for word in value
    ):
        return f"expected a command of words, got {value!r}"
    return ""


def port_problem(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        return f"expected a TCP port 1..65535, got {value!r}"
    return ""


def socket_problem(value: object) -> str:
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value:
        return f"expected a Unix socket's absolute path, got {value!r}"
    return ""


def period_of(text: object) -> tuple[date, date] | None:
    """The days a `--since`/`--until` word names: (its first day, the day after its last);
    a month (2026-11: November) or a day (2026-11-05). None for anything else."""
    found = USAGE_DATE.fullmatch(text) if isinstance(text, str) else None
    if found is None:
        return None
    year, month, day = int(found[1]), int(found[2]), found[3]
    try:
        first = date(year, month, int(day) if day else 1)
        after = first + timedelta(days=1) if day else date(year + month // 12, month % 12 + 1, 1)
    except (ValueError, OverflowError):
        return None
    return first, after


def period_problem(value: object) -> str:
    if period_of(value) is None:
        return f"expected a month YYYY-MM or a day YYYY-MM-DD, got {value!r}"
    return ""


def usage_period(text: object, what: str = "date") -> tuple[date, date]:
    """period_of, or BadArgument naming `what` (the option) for a word that is not one."""
    period = period_of(text)
    if period is None:
        raise BadArgument(f"{what}: {period_problem(text)}")
    return period


def usage_order_problem(values: Mapping[str, Any]) -> str:
    since, until = values.get("since"), values.get("until")
    if since is not None and until is not None and usage_period(since)[0] >= usage_period(until)[1]:
        return f"--since {since} comes after --until {until}"
    return ""


def connect_target_problem(values: Mapping[str, Any]) -> str:
    if (values.get("port") is None) == (values.get("socket") is None):
        return "expected a port (1..65535) or a socket's absolute path"
    return ""


# --- the records -------------------------------------------------------------------------


@dataclass(frozen=True)
class Field:
    """One field of a request: a positional word (or words: many) or an option (flag).
    A value of None, or False for a switch, is left out of the words."""

    name: str
    kind: type = str  # str, int, float, bool (a switch), or list (the words after --)
    flag: str = ""  # "--tail"; "" for a positional word
    short: str = ""  # "-f": the agent's command line also takes it
    many: bool = False  # one or more positional words
    default: object = None
    problem: Callable[[object], str] | None = None  # "" when the value may be sent
    help: str = ""
    choices: tuple[str, ...] = ()  # the words it may be, when they are few

    @property
    def label(self) -> str:
        return self.flag or self.name

    def words(self, value: object) -> list[str]:
        if value is None or value is False:
            return []
        if self.kind is bool:
            return [self.flag]
        if self.kind is list:
            return ["--", *value] if value else []
        if self.many:
            return list(value)
        text = f"{value:g}" if self.kind is float else str(value)
        if self.flag and text.startswith("-"):
            return [f"{self.flag}={text}"]  # so the value is never read as an option
        return [self.flag, text] if self.flag else [text]


@dataclass(frozen=True, repr=False)
class Verb(Generic[T]):
    """One verb: `words` after `tacc-agent`, its request fields, what it reads on stdin
    ("": nothing; "json": one request object; "instruction": an instruction document;
    "stream": framed bytes after the request), the check of its answer (T; None for a
    verb that streams text or answers by its request's op), the error kinds it may
    return, and whether it keeps its own exec channel (streams) rather than a session
    line. A rejection of a `task` verb is a problem of the task (tcloud's exit 3)."""

    words: tuple[str, ...]
    help: str
    fields: tuple[Field, ...] = ()
    returns: Any = None  # an answer type (tacc_contract.answers), or list[one]
    errors: tuple[str, ...] = ("rejected", "cluster")
    stdin: str = ""
    streams: bool = False
    task: bool = False
    across: Callable[[Mapping[str, Any]], str] | None = None  # a check across fields

    @property
    def answer(self) -> Shape | ListOf | None:
        """The check of its answer type, built on first use: the node daemon, which
        imports the records but checks no answer, never pays for it."""
        if "_answer" not in self.__dict__:
            object.__setattr__(self, "_answer", answer_check(self.returns, self.name))
        return self.__dict__["_answer"]

    @property
    def name(self) -> str:
        return " ".join(self.words)

    def __repr__(self) -> str:
        return f"Verb({self.name!r})"

    def request(self, **values: object) -> list[str]:
        """The words after `tacc-agent`; BadArgument naming the field that cannot go."""
        unknown = sorted(set(values) - {item.name for item in self.fields})
        if unknown:
            raise BadArgument(f"{self.name}: no field {', '.join(unknown)}")
        words = list(self.words)
        given = {item.name: values.get(item.name, item.default) for item in self.fields}
        for item in self.fields:
            value = given[item.name]
            if item.choices and value is not None and value not in item.choices:
                raise BadArgument(f"{item.label}: expected one of {', '.join(item.choices)}")
            checked = item.problem is not None and (value is not None or not item.flag)
            if checked and (problem := item.problem(value)):
                raise BadArgument(self.problem_text(item, problem))
        if self.across is not None and (problem := self.across(given)):
            raise BadArgument(f"{self.name}: {problem}" if "--" not in problem else problem)
        for item in self.fields:
            words += item.words(given[item.name])
        return words

    def problem_text(self, item: Field, problem: str) -> str:
        if item.flag:
            return f"{item.flag}: {problem}"
        if item.problem in (one_job_problem, job_ids_problem):
            return problem  # "not a job id: ..." says what it is
        return f"{self.name}: {problem}"

    def check_answer(self, answer: object) -> T:
        """answer itself when it fits the verb's type; ProtocolError when it does not."""
        if self.answer is None:
            return answer  # type: ignore[return-value]
        return self.answer.check(answer, self.name, "")  # type: ignore[return-value]


def answer_check(returns: Any, name: str) -> Shape | ListOf | None:
    """The check of an answer type: a TypedDict, or list[TypedDict]."""
    if returns is None:
        return None
    if getattr(returns, "__origin__", None) is list:
        return list_of(returns.__args__[0], name)
    return shape_of(returns, name)


def answer_name(returns: Any) -> str:
    if getattr(returns, "__origin__", None) is list:
        return f"list of {returns.__args__[0].__name__}"
    return returns.__name__


def job_field(**more: object) -> Field:
    return Field("job", problem=one_job_problem, help="a job id (1234, or 1234_5: a trial)", **more)


def whole(flag: str, help: str, default: int | None = None) -> Field:
    return Field(
        flag.removeprefix("--"),
        int,
        flag,
        default=default,
        problem=whole_number_problem,
        help=help,
    )


REASON = Field("reason", flag="--reason", help="why, for the job's events (default: its owner)")
PERIOD = (
    Field("since", flag="--since", problem=period_problem, help="first month or day"),
    Field("until", flag="--until", problem=period_problem, help="last month or day, included"),
)

HELLO: Verb[answers.HelloAnswer] = Verb(
    ("hello",),
    "the protocol this agent speaks and its version",
    returns=answers.HelloAnswer,
    errors=(),
)
SESSION = Verb(
    ("session",),
    "every verb that answers JSON, one request line at a time, in one agent process",
    streams=True,
)
WHOAMI: Verb[answers.Whoami] = Verb(
    ("whoami",), "the caller's user and directory", returns=answers.Whoami
)
QUOTA: Verb[answers.Quota] = Verb(
    ("quota",),
    "the caller's limits, fair share and usage (Slurm accounting)",
    returns=answers.Quota,
)
ENV: Verb[list[answers.Environment]] = Verb(
    ("env",), "the caller's cached environments", returns=list[answers.Environment]
)
STORE: Verb[dict] = Verb(
    ("store",),
    "delta upload: a request object on stdin (op missing or commit; answers by its op)",
    stdin="json",
    task=True,
)
STORE_RECEIVE: Verb[answers.StoreReceived] = Verb(
    ("store", "receive"),
    "blobs streamed on stdin into the store (framed: tacc_agent/tasks/store/receive.py)",
    returns=answers.StoreReceived,
    stdin="stream",
    task=True,
)
IMAGE_RESOLVE: Verb[answers.ImageResolved] = Verb(
    ("image", "resolve"),
    "the digest a registry reference names now (at submit)",
    (Field("reference", problem=reference_problem, help="a registry reference"),),
    answers.ImageResolved,
)
IMAGE_LS: Verb[list[answers.Image]] = Verb(
    ("image", "ls"), "the caller's cached container images", returns=list[answers.Image]
)
JOB_CHECK: Verb[answers.JobCheck] = Verb(
    ("job", "check"),
    "would the cluster accept this instruction? (the instruction on stdin)",
    returns=answers.JobCheck,
    stdin="instruction",
)
JOB_SUBMIT: Verb[answers.JobSubmitted] = Verb(
    ("job", "submit"),
    "sbatch a committed job directory",
    (Field("workdir", problem=directory_problem, help="the job directory"),),
    answers.JobSubmitted,
)
JOB_PS: Verb[list[answers.PsRow]] = Verb(
    ("job", "ps"),
    "the caller's jobs, newest first",
    (whole("--limit", f"the newest N (default {PS_LIMIT})"),),
    list[answers.PsRow],
)
JOB_STATUS: Verb[answers.JobStatus] = Verb(
    ("job", "status"),
    "one job's state, nodes, exit codes",
    (job_field(),),
    answers.JobStatus,
)
JOB_LOGS = Verb(
    ("job", "logs"),
    "every node's output, [host:rank] first; text as it comes",
    (
        job_field(),
        Field("follow", bool, "--follow", short="-f", help="until the job ends"),
        whole("--tail", "the last N lines of each node"),
        whole("--rank", "one rank's lines only"),
    ),
    streams=True,
)
JOB_CANCEL: Verb[list[answers.Cancelled]] = Verb(
    ("job", "cancel"),
    "cancel jobs",
    (Field("jobs", many=True, problem=job_ids_problem, help="job ids"),),
    list[answers.Cancelled],
)
JOB_HALT: Verb[answers.Halted] = Verb(
    ("job", "halt"),
    "checkpoint signal, then requeue on hold",
    (
        job_field(),
        Field("grace", float, "--grace", problem=seconds_problem, help="seconds to checkpoint"),
        REASON,
    ),
    answers.Halted,
)
JOB_RESUME: Verb[answers.Resumed] = Verb(
    ("job", "resume"),
    "release a halted job",
    (job_field(), REASON),
    answers.Resumed,
)
JOB_RERUN: Verb[answers.Rerun] = Verb(
    ("job", "rerun"),
    "the same files and locked environment again",
    (job_field(),),
    answers.Rerun,
)
JOB_TARGET: Verb[answers.JobTarget] = Verb(
    ("job", "target"),
    "a running job's nodes by rank, with addresses (refused: not yours, not running)",
    (job_field(), whole("--rank", "that rank's node only")),
    answers.JobTarget,
)
JOB_ATTACH = Verb(
    ("job", "attach"),
    "a command (none: the user's shell) on a running job's node, in its allocation and "
    "environment; stdin, stdout, stderr and exit status are the command's",
    (
        job_field(),
        whole("--rank", "the rank's node", default=0),
        Field("pty", bool, "--pty", help="the SSH channel has a PTY"),
        Field("command", list, problem=command_problem, default=(), help="words after --"),
    ),
    streams=True,
)
JOB_CONNECT = Verb(
    ("job", "connect"),
    "one connection to a running job's program on the rank's node (stdin and stdout are "
    "its bytes, as `ssh -W`); a warning on stderr when the port listens on every address",
    (
        job_field(),
        whole("--rank", "the rank's node", default=0),
        Field("port", int, "--port", problem=port_problem, help="127.0.0.1:PORT on the node"),
        Field("socket", str, "--socket", problem=socket_problem, help="a Unix socket's path"),
        Field("check", bool, "--check", help="only say whether it is exposed"),
    ),
    streams=True,
    across=connect_target_problem,
)
JOB_STOP_ON_DISCONNECT = Verb(
    ("job", "stop-on-disconnect"),
    "cancel the running job when the client goes away: a byte on stdin every 10 s is a "
    "heartbeat, the end of stdin or 30 s without one a disconnect; a JSON line when it "
    "watches and one when it stops",
    (job_field(),),
    streams=True,
)
JOB_TOP: Verb[answers.JobTop] = Verb(
    ("job", "top"),
    "a running job's live usage on each node, read by a step of the caller's own job",
    (job_field(),),
    answers.JobTop,
)
USAGE: Verb[answers.Usage] = Verb(
    ("usage",),
    "the caller's own CPU and GPU seconds by month, account, partition (Slurm accounting; "
    "default: this month and the two before it)",
    PERIOD,
    answers.Usage,
    across=usage_order_problem,
)
DASHBOARD_OPEN: Verb[answers.DashboardOpened] = Verb(
    ("dashboard", "open"),
    "start the caller's dashboard server on this login node (or find it running) and a "
    "one-time code that logs a browser in to it",
    returns=answers.DashboardOpened,
)
DASHBOARD_CONNECT = Verb(
    ("dashboard", "connect"),
    "one browser connection to the caller's dashboard server on this login node (stdin "
    "and stdout are its bytes, as `ssh -W`)",
    streams=True,
)

VERBS: tuple[Verb, ...] = tuple(
    value for value in list(globals().values()) if isinstance(value, Verb)
)
BY_NAME: dict[str, Verb] = {verb.name: verb for verb in VERBS}
if any(kind not in ERROR_KINDS for verb in VERBS for kind in verb.errors):
    raise TypeError(f"a verb names an error kind that is not one of {sorted(ERROR_KINDS)}")
if any(verb.stdin not in STDIN_KINDS for verb in VERBS):
    raise TypeError(f"a verb's stdin is not one of {STDIN_KINDS}")


def verb_named(words: Sequence[str]) -> Verb | None:
    """The verb a request's words ask for (the longest declared prefix), if any."""
    for length in (2, 1):
        if len(words) >= length and (verb := BY_NAME.get(" ".join(words[:length]))):
            return verb
    return None


# --- the table in docs/protocol.md -------------------------------------------------------


def field_text(item: Field) -> str:
    kinds = {str: "text", int: "number", float: "seconds", bool: "switch", list: "words"}
    shown = f"{item.label} {'...' if item.many else ''}".strip()
    return f"`{shown}` ({kinds[item.kind]})"


def answer_text(verb: Verb) -> str:
    if verb.streams:
        return "streams"
    if verb.answer is None:
        return "by the request's op"
    return answer_name(verb.returns)


def table() -> str:
    """The verb table as Markdown: verb, request, stdin, answer, errors."""
    rows = [
        "| verb | request | stdin | answer | errors |",
        "| --- | --- | --- | --- | --- |",
    ]
    for verb in VERBS:
        request = ", ".join(field_text(item) for item in verb.fields) or "-"
        errors = ", ".join(verb.errors) or "-"
        stdin = verb.stdin or "-"
        rows.append(
            f"| `{AGENT} {verb.name}` | {request} | {stdin} | {answer_text(verb)} | {errors} |"
        )
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table())
