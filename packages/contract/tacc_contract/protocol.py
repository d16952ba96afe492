"""The agent protocol as data: how tcloud asks (`tacc-agent <verb> ...` over SSH, JSON on
stdin for `store` and `job check`) and what the agent answers (one JSON value on stdout).
`job logs`, `job attach`, `job connect` and `job stop-on-disconnect` stream instead: each
keeps its own exec channel (an interactive command's stdin, PTY and exit status are its
own).

tcloud asks every verb of one SSH connection through one `tacc-agent session`: the agent
writes its hello answer as the first line, then answers each request line
(session_request) with one line {"rc": exit code, "answer": what the verb would print}
(SESSION_ANSWER); `job logs` streams text and keeps its own `tacc-agent` exec.

One builder per verb returns the words after `tacc-agent`, refusing an argument that is
not one (a job id is 1234, or 1234_5 for trial 5 of sweep 1234). One shape per answer
checks the JSON that comes back, so a changed answer is a clear ProtocolError naming
the verb and the key, never a KeyError three calls later. Keys an answer has beyond its
shape are kept: a newer agent may say more without breaking an older tcloud.

PROTOCOL_VERSION changes when a verb or an answer changes in a way the other side must
know about (2: `session`; 3: `job target`, `attach`, `stop-on-disconnect`, `top`; 4:
`usage`; 5: `job connect`); tcloud reads the hello of each session and refuses to go on
when the two sides differ (tcloud.agent.handshake).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta

from tacc_contract.errors import ERROR_KEY, EXIT_CLUSTER, EXIT_USAGE, TaccError

PROTOCOL_VERSION = 5
AGENT = "tacc-agent"

JOB_ID = re.compile(r"\d+(_\d+)?")  # 1234, or 1234_5: trial 5 of sweep 1234
# The states `job status` and `job ps` answer; a job in a final state will not change.
JOB_STATES = ("QUEUED", "PROVISIONING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "HALTED")
FINAL_STATES = ("COMPLETED", "FAILED", "CANCELLED")
BLOB_NAME = re.compile(r"[0-9a-f]{64}-[0-7]{3,4}")  # a file's content and mode in the store
# `usage --since/--until`: a month (2026-11) or a day (2026-11-05).
USAGE_DATE = re.compile(r"([0-9]{4})-([0-9]{2})(?:-([0-9]{2}))?")


class ProtocolError(TaccError):
    """An answer that does not have the shape this side of the protocol expects."""

    exit_code = EXIT_CLUSTER

    def __init__(self, verb: str, problem: str) -> None:
        super().__init__(
            f"the answer of `{AGENT} {verb}` does not fit protocol {PROTOCOL_VERSION}: "
            f"{problem} (are tcloud and the cluster's tacc-agent the same version?)"
        )
        self.verb = verb
        self.problem = problem


class BadArgument(TaccError, ValueError):
    """A verb's argument that the protocol cannot carry (a job id that is not one)."""

    exit_code = EXIT_USAGE


# --- builders: the words after `tacc-agent` ---------------------------------------------


def job_id_problem(job_ids: Sequence[str]) -> str:
    """ "" when every id is a job id, else the message that names the bad ones."""
    bad = [job for job in job_ids if not isinstance(job, str) or not JOB_ID.fullmatch(job)]
    if not bad:
        return ""
    return (
        f"not a job id: {', '.join(map(str, bad))} (expected numbers such as 1234, or "
        "1234_5 for trial 5 of a sweep)"
    )


def job_ids(ids: Sequence[str]) -> list[str]:
    problem = job_id_problem(ids) if ids else "expected at least one job id"
    if problem:
        raise BadArgument(problem)
    return list(ids)


def whole_number(value: int, what: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadArgument(f"{what}: expected a whole number >= 0, got {value!r}")
    return str(value)


def command(verb: Sequence[str], userdir: str | None = None) -> list[str]:
    """The whole command line: `tacc-agent [--userdir DIR] VERB ...`."""
    return [AGENT, *(["--userdir", userdir] if userdir else []), *verb]


def hello() -> list[str]:
    return ["hello"]


def session() -> list[str]:
    """Every verb of one connection through one agent process (session_request)."""
    return ["session"]


def whoami() -> list[str]:
    return ["whoami"]


def quota() -> list[str]:
    return ["quota"]


def store() -> list[str]:
    """Delta upload; the request (missing_request, commit_request) goes on stdin."""
    return ["store"]


def store_receive() -> list[str]:
    """Blobs streamed on stdin (framed, tacc_agent.tasks.store.receive) into the store."""
    return ["store", "receive"]


def env() -> list[str]:
    return ["env"]


def image_resolve(reference: str) -> list[str]:
    """The digest a registry reference names now (tacc_contract.images)."""
    if not isinstance(reference, str) or not reference or reference.startswith("-"):
        raise BadArgument(f"image resolve: expected an image reference, got {reference!r}")
    return ["image", "resolve", reference]


def image_ls() -> list[str]:
    """The caller's images cached on the cluster."""
    return ["image", "ls"]


def job_check() -> list[str]:
    """Would the cluster accept this instruction? (the instruction on stdin)"""
    return ["job", "check"]


def job_submit(workdir: str) -> list[str]:
    if not isinstance(workdir, str) or not workdir or "\0" in workdir:
        raise BadArgument(f"job submit: expected a job directory, got {workdir!r}")
    return ["job", "submit", workdir]


def job_ps() -> list[str]:
    return ["job", "ps"]


def job_status(job_id: str) -> list[str]:
    return ["job", "status", *job_ids([job_id])]


def job_logs(
    job_id: str, follow: bool = False, tail: int | None = None, rank: int | None = None
) -> list[str]:
    verb = ["job", "logs", *job_ids([job_id])]
    verb += ["--follow"] if follow else []
    verb += ["--tail", whole_number(tail, "--tail")] if tail is not None else []
    verb += ["--rank", whole_number(rank, "--rank")] if rank is not None else []
    return verb


def job_cancel(ids: Sequence[str]) -> list[str]:
    return ["job", "cancel", *job_ids(ids)]


def job_halt(job_id: str, grace: float | None = None) -> list[str]:
    if grace is None:
        return ["job", "halt", *job_ids([job_id])]
    if isinstance(grace, bool) or not isinstance(grace, int | float) or grace != grace:
        raise BadArgument(f"--grace: expected seconds, got {grace!r}")
    return ["job", "halt", *job_ids([job_id]), "--grace", f"{grace:g}"]


def job_resume(job_id: str) -> list[str]:
    return ["job", "resume", *job_ids([job_id])]


def job_rerun(job_id: str) -> list[str]:
    return ["job", "rerun", *job_ids([job_id])]


# --- into a running job (docs/interactive.md) -------------------------------------------


def job_target(job_id: str, rank: int | None = None) -> list[str]:
    """Where a running job of the caller's runs: its nodes by rank, with each node's
    address (JOB_TARGET); with rank, that rank's node only. Refused (exit 4) when the
    job is not the caller's or is not running."""
    verb = ["job", "target", *job_ids([job_id])]
    return verb + (["--rank", whole_number(rank, "--rank")] if rank is not None else [])


def job_attach(
    job_id: str, rank: int = 0, command: Sequence[str] = (), pty: bool = False
) -> list[str]:
    """A command (none: the user's interactive shell) on one node of a running job of
    the caller's, inside its allocation (`srun --jobid --overlap`) and the job's
    environment (its variables, venv, container image, code/ as the directory). Streams:
    its own exec channel, stdin/stdout/stderr are the command's, its exit status the
    command's (a PTY with pty, which the client asks of SSH too)."""
    if any(not isinstance(word, str) or "\0" in word for word in command):
        raise BadArgument(f"job attach: expected a command of words, got {list(command)!r}")
    verb = ["job", "attach", *job_ids([job_id]), "--rank", whole_number(rank, "--rank")]
    return verb + (["--pty"] if pty else []) + (["--", *command] if command else [])


def job_connect(
    job_id: str, rank: int = 0, target: int | str = 0, check: bool = False
) -> list[str]:
    """One connection to the program of a running job of the caller's on the rank's
    node, made there by the caller's own process inside the job's allocation (`srun
    --overlap ... tacc-agent relay`): target a port (to 127.0.0.1:PORT, else [::1]) or
    the absolute path of a Unix socket. Streams: stdin and stdout are the connection's
    bytes (as `ssh -W`); stderr carries one warning line when the port listens on every
    address of the node, and a refusal's line (exit 4: not yours, not running, nothing
    listens, no socket there). check: only the warning, or the socket's presence."""
    verb = ["job", "connect", *job_ids([job_id]), "--rank", whole_number(rank, "--rank")]
    if isinstance(target, str) and target.startswith("/") and "\0" not in target:
        verb += ["--socket", target]
    elif isinstance(target, int) and not isinstance(target, bool) and 1 <= target <= 65535:
        verb += ["--port", str(target)]
    else:
        raise BadArgument(
            f"job connect: expected a port 1-65535 or a socket's absolute path, got {target!r}"
        )
    return verb + (["--check"] if check else [])


def job_stop_on_disconnect(job_id: str) -> list[str]:
    """Cancel the caller's running job when the client goes away (Ctrl-C, a closed
    laptop, a dropped connection). Heartbeat: the client writes one byte (b"\\n") on this
    command's stdin every 10 s; the agent takes any bytes as a heartbeat, and the end of
    stdin or 30 s without a byte (sshd does not probe clients) as a disconnect: it cancels
    the job (the cancel tried again with backoff, about 3 minutes, while Slurm does not
    answer). Streams: prints one JSON line ({"job_id", "state"}) once it watches, another
    when it stops watching (the cancel's answer, or the job's own final state)."""
    return ["job", "stop-on-disconnect", *job_ids([job_id])]


def job_top(job_id: str) -> list[str]:
    """The job's live usage on each of its nodes (JOB_TOP), read on each node by a step
    of the caller's own job, as the caller (never from the nodes' /metrics)."""
    return ["job", "top", *job_ids([job_id])]


# --- accounting (docs/usage.md) ---------------------------------------------------------


def usage_period(text: str, what: str = "date") -> tuple[date, date]:
    """The days a `--since`/`--until` word names: (its first day, the day after its last);
    a month (2026-11: November) or a day (2026-11-05). BadArgument for anything else."""
    found = USAGE_DATE.fullmatch(text) if isinstance(text, str) else None
    try:
        if found is None:
            raise ValueError(text)
        year, month, day = int(found[1]), int(found[2]), found[3]
        first = date(year, month, int(day) if day else 1)
        after = first + timedelta(days=1) if day else date(year + month // 12, month % 12 + 1, 1)
    except (ValueError, OverflowError):
        raise BadArgument(
            f"{what}: expected a month YYYY-MM or a day YYYY-MM-DD, got {text!r}"
        ) from None
    return first, after


def usage(since: str | None = None, until: str | None = None) -> list[str]:
    """The caller's own usage from Slurm's accounting (USAGE): CPU and GPU seconds of
    their jobs by month, account and partition, from the first day of `since` to the
    last of `until` (both ends included; the agent's default: this month and the two
    before it, up to now). The agent asks Slurm for the calling user's jobs only: no word
    of the request can name another user."""
    verb = ["usage"]
    for flag, text in (("--since", since), ("--until", until)):
        if text is not None:
            usage_period(text, flag)
            verb += [flag, text]
    if since is not None and until is not None and usage_period(since)[0] >= usage_period(until)[1]:
        raise BadArgument(f"--since {since} comes after --until {until}")
    return verb


# --- the store's requests (stdin of `tacc-agent store`) ---------------------------------


def blob_name(sha256: str, mode: int) -> str:
    """A file's name in the store: its content and its mode (0o644 or 0o755)."""
    return f"{sha256}-{mode:o}"


def missing_request(blobs: Sequence[str], check: Mapping | None = None) -> dict:
    """Which of these blobs does the store lack? With check (an instruction document),
    the cluster first refuses a task it can never run."""
    request: dict = {"op": "missing", "blobs": sorted(blobs)}
    if check is not None:
        request["check"] = dict(check)
    return request


def commit_request(
    blobs: Sequence[str],
    manifest: Mapping[str, str],
    uploads: Mapping[str, str],
    digest: str,
    files: Mapping[str, str],
    submit: bool = False,
) -> dict:
    """Verify the uploaded blobs and build the job directory; with submit, sbatch it."""
    return {
        "op": "commit",
        "blobs": list(blobs),
        "manifest": dict(manifest),
        "uploads": dict(uploads),
        "submit": submit,
        "digest": digest,
        "files": dict(files),
    }


# --- the session's requests (one JSON line each) -----------------------------------------


def session_request(verb: Sequence[str], userdir: str | None = None, stdin: bytes = b"") -> dict:
    """One request line of `tacc-agent session`: the words after `tacc-agent` (as
    `command` builds them) and the verb's stdin as text (bytes that are not UTF-8 travel
    as surrogate escapes, so they arrive unchanged), null when there is none."""
    text = stdin.decode("utf-8", "surrogateescape") if stdin else None
    return {"verb": command(verb, userdir)[1:], "stdin": text}


def session_stdin(request: Mapping) -> bytes:
    """The bytes a session request carries for its verb's stdin."""
    text = request.get("stdin")
    return text.encode("utf-8", "surrogateescape") if isinstance(text, str) else b""


# --- shapes: what each verb answers -----------------------------------------------------

NULL = type(None)
NUMBER = (int, float)
TYPE_NAMES = {
    str: "text",
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    list: "a list",
    dict: "an object",
    NULL: "null",
}


@dataclass(frozen=True)
class ListOf:
    """A JSON list whose every item has a kind."""

    item: Kind

    def check(self, value: object, verb: str, where: str) -> list:
        if not isinstance(value, list):
            raise ProtocolError(
                verb, f"{where or 'the answer'}: expected a list, got {shown(value)}"
            )
        for index, item in enumerate(value):
            check_kind(self.item, item, verb, f"{where}[{index}]")
        return value


@dataclass(frozen=True)
class Shape:
    """A JSON object: keys it must have and keys it may have, each of a kind (a type or
    tuple of types, a nested Shape or a ListOf)."""

    name: str
    required: Mapping[str, Kind]
    optional: Mapping[str, Kind] = field(default_factory=dict)

    def check(self, value: object, verb: str = "", where: str = "") -> dict:
        """value itself when it fits; ProtocolError naming the verb and the key if not."""
        verb = verb or self.name
        if not isinstance(value, dict):
            raise ProtocolError(
                verb, f"{where or 'the answer'}: expected an object, got {shown(value)}"
            )
        for key, kind in self.required.items():
            if key not in value:
                inside = f"{where}: " if where else ""
                raise ProtocolError(verb, f"{inside}the key {key!r} is missing")
            check_kind(kind, value[key], verb, f"{where}.{key}" if where else key)
        for key, kind in self.optional.items():
            if key in value:
                check_kind(kind, value[key], verb, f"{where}.{key}" if where else key)
        return value


Kind = type | tuple[type, ...] | Shape | ListOf


def shown(value: object) -> str:
    if isinstance(value, bool):
        return f"{value!r}".lower()
    for kind, name in TYPE_NAMES.items():
        if type(value) is kind:
            text = json.dumps(value)
            return name if len(text) > 40 else f"{name} {text}"
    return type(value).__name__


def expected(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if float in kinds:  # a float accepts a whole number: say "a number" once
        kinds = tuple(k for k in kinds if k is not int)
    return " or ".join(TYPE_NAMES.get(k, k.__name__) for k in kinds)


def fits(kinds: tuple[type, ...], value: object) -> bool:
    if isinstance(value, bool):  # JSON true is not the number 1
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return type(value) in kinds


def check_kind(kind: Kind, value: object, verb: str, where: str) -> object:
    if isinstance(kind, Shape | ListOf):
        return kind.check(value, verb, where)
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if not fits(kinds, value):
        raise ProtocolError(verb, f"{where}: expected {expected(kind)}, got {shown(value)}")
    return value


TEXT_OR_NULL = (str, NULL)
WHOLE_OR_NULL = (int, NULL)

HELLO = Shape("hello", {"protocol": int, "agent_version": str})
WHOAMI = Shape("whoami", {"user": str, "userdir": str})
QUOTA = Shape(
    "quota",
    {"user": str, "running_jobs": int, "pending_jobs": int, "gpus_in_use": int},
    {
        "accounting": bool,
        "message": str,
        "associations": ListOf(dict),
        "qos": ListOf(dict),
        "fairshare": ListOf(dict),
    },
)
ENVIRONMENT = Shape(
    "env",
    {"digest": str, "requirements": ListOf(str), "path": str},
    {
        "lock": ListOf(str),
        "python": str,
        "built_by_job": (str, int, NULL),
        "platform": str,
        "installer": str,
        "index": str,
    },
)
ENV = ListOf(ENVIRONMENT)
IMAGE_RESOLVED = Shape("image resolve", {"reference": str, "pinned": str, "digest": str})
IMAGE = Shape(
    "image ls",
    {"digest": str, "reference": str, "path": str},
    {
        "pulled_by_job": (str, int, NULL),
        "seconds": NUMBER,
        "bytes": int,
        "time": NUMBER,
        "runtime": str,
        # An image built from a task's build file: {"file", "base"}, and the job that built it.
        "build": Shape("image ls", {"file": str, "base": str}),
        "built_by_job": (str, int, NULL),
    },
)
IMAGES = ListOf(IMAGE)
JOB_CHECK = Shape("job check", {"ok": bool, "partition": str})
JOB_SUBMIT = Shape(
    "job submit",
    {"job_id": str, "name": str, "workdir": str, "partition": TEXT_OR_NULL},
    {"plugins": dict},
)
PS_ROW = Shape(
    "job ps",
    {"job": str, "name": str, "state": str, "submitted": str, "nodes": str},
    {"kind": str},  # "job", or "session" (an interactive session: tcloud dev)
)
JOB_PS = ListOf(PS_ROW)
NODE = Shape(
    "job status",
    {"host": str, "state": str},
    {"rank": WHOLE_OR_NULL, "exit_code": WHOLE_OR_NULL, "signal": (int, str, NULL)},
)
TRIAL = Shape(
    "job status",
    {"job_id": str, "state": str},
    {
        "trial": int,
        "exit_code": WHOLE_OR_NULL,
        "parameters": dict,
        "nodes": str,
        "reason": TEXT_OR_NULL,
    },
)
EVENT = Shape("job status", {"state": str}, {"time": NUMBER, "lost": (str, dict, list)})
JOB_STATUS = Shape(
    "job status",
    {"job_id": str, "name": str, "state": str, "workdir": str},
    {
        "reason": TEXT_OR_NULL,
        "exit_code": WHOLE_OR_NULL,
        "slurm_state": TEXT_OR_NULL,
        "sweep": bool,
        "trials": ListOf(TRIAL),
        "history": ListOf(EVENT),
        "nodes": ListOf(NODE),
        "plugins": dict,
        "environment": (dict, NULL),
        "image": (dict, NULL),
        "code_digest": TEXT_OR_NULL,
        "rerun_of": TEXT_OR_NULL,
        "last_lines": dict,
        "session": (dict, NULL),
    },
)
CANCELLED = Shape("job cancel", {"job_id": str, "state": str, "cancelled": bool}, {"trials": int})
JOB_CANCEL = ListOf(CANCELLED)
JOB_HALT = Shape(
    "job halt",
    {"job_id": str, "state": str, "checkpoint_signal": bool},
    {"exited_in_grace": bool, "grace_seconds": NUMBER},
)
JOB_RESUME = Shape("job resume", {"job_id": str, "state": str})
JOB_RERUN = Shape(
    "job rerun",
    {**JOB_SUBMIT.required, "rerun_of": str, "code_digest": str, "lock": ListOf(str)},
    JOB_SUBMIT.optional,
)
STORE_MISSING = Shape(
    "store",
    {"missing": ListOf(str), "partial": dict, "userdir": str},
    {"uploads": dict, "partition": TEXT_OR_NULL},
)
STORE_COMMIT = Shape(
    "store",
    {"workdir": TEXT_OR_NULL, "bad": ListOf(str)},
    {"userdir": str, "partition": TEXT_OR_NULL, "job": JOB_SUBMIT},
)
TARGET_NODE = Shape("job target", {"host": str, "rank": int, "address": str})
JOB_TARGET = Shape(
    "job target",
    {"job_id": str, "slurm_job_id": str, "state": str, "nodes": ListOf(TARGET_NODE)},
    {"session": (dict, NULL)},  # a session's settings (ports, idle_timeout, ...)
)
GPU_USAGE = Shape(
    "job top",
    {"index": int},
    {
        "utilization_ratio": (*NUMBER, NULL),
        "memory_used_bytes": WHOLE_OR_NULL,
        "memory_total_bytes": WHOLE_OR_NULL,
    },
)
USAGE_NODE = Shape(
    "job top",
    {"host": str, "rank": int},
    # A node that gave no figures (its task of the step did not run) has "error". cpu_seconds is the
    # job's CPU time on the node so far (a counter): the client's rate between two
    # answers is its CPU use; `sampled` is when the node read it (Unix time).
    {
        "cpu_seconds": (*NUMBER, NULL),
        "memory_bytes": WHOLE_OR_NULL,
        "cpus": WHOLE_OR_NULL,
        "sampled": (*NUMBER, NULL),
        "gpus": ListOf(GPU_USAGE),
        "error": TEXT_OR_NULL,
    },
)
JOB_TOP = Shape(
    "job top", {"job_id": str, "state": str, "time": NUMBER, "nodes": ListOf(USAGE_NODE)}
)
USAGE_ROW = Shape(
    "usage",
    # One month (YYYY-MM, the cluster's local time) of one account and partition: the
    # allocated CPU and GPU seconds of the caller's jobs in it (a job that crosses a month
    # is split by its time in each), and the jobs counted there: each job once, in the
    # first month of the window it ran in (summed over rows, they are the jobs).
    {
        "month": str,
        "account": str,
        "partition": str,
        "jobs": int,
        "cpu_seconds": NUMBER,
        "gpu_seconds": NUMBER,
    },
    {"running": int},  # of those jobs, the ones still running (counted up to now)
)
USAGE = Shape(
    "usage",
    # since/until: the window the rows cover, ISO local times (until is at most now).
    {"user": str, "since": str, "until": str, "rows": ListOf(USAGE_ROW)},
)
ERROR = Shape("error", {ERROR_KEY: str}, {"field": str})
JSON_VALUE = (dict, list, str, int, float, bool, NULL)
SESSION_REQUEST = Shape("session", {"verb": ListOf(str)}, {"stdin": TEXT_OR_NULL})
SESSION_ANSWER = Shape("session", {"rc": int, "answer": JSON_VALUE})

# The answer of each verb that answers one JSON value (`job logs` streams text; `store`
# answers by its request's op: store_answer).
ANSWERS: dict[tuple[str, ...], Shape | ListOf] = {
    ("hello",): HELLO,
    ("whoami",): WHOAMI,
    ("quota",): QUOTA,
    ("env",): ENV,
    ("image", "resolve"): IMAGE_RESOLVED,
    ("image", "ls"): IMAGES,
    ("job", "check"): JOB_CHECK,
    ("job", "submit"): JOB_SUBMIT,
    ("job", "ps"): JOB_PS,
    ("job", "status"): JOB_STATUS,
    ("job", "cancel"): JOB_CANCEL,
    ("job", "halt"): JOB_HALT,
    ("job", "resume"): JOB_RESUME,
    ("job", "rerun"): JOB_RERUN,
    ("job", "target"): JOB_TARGET,
    ("job", "top"): JOB_TOP,
    ("usage",): USAGE,
}
STORE_ANSWERS = {"missing": STORE_MISSING, "commit": STORE_COMMIT}


def verb_name(verb: Sequence[str]) -> str:
    """`job status` for ["job", "status", "12"]: the words that name the verb."""
    words = tuple(verb[:2]) if verb[:1] in (["job"], ["image"]) else tuple(verb[:1])
    return " ".join(words)


def answer_shape(verb: Sequence[str]) -> Shape | ListOf | None:
    """The shape of what this verb (as a builder built it) answers; None for a verb whose
    answer depends on its request (`store`) or is text (`job logs`)."""
    return ANSWERS.get(tuple(verb_name(verb).split()))


def parse_answer(verb: Sequence[str], answer: object) -> object:
    """answer itself when it fits the verb's shape; ProtocolError when it does not."""
    shape = answer_shape(verb)
    if shape is None:
        return answer
    return shape.check(answer, verb_name(verb), "")


def store_answer(request: Mapping, answer: object) -> dict:
    shape = STORE_ANSWERS.get(str(request.get("op")))
    if shape is None:
        raise BadArgument(f"store: unknown op {request.get('op')!r} (expected missing or commit)")
    return shape.check(answer, f"store ({request['op']})", "")


# --- answers the agent builds -----------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """What `hello` answers: the protocol the agent speaks and its own version."""

    protocol: int
    agent_version: str

    @classmethod
    def parse(cls, answer: object) -> Hello:
        checked = HELLO.check(answer)
        return cls(checked["protocol"], checked["agent_version"])

    def answer(self) -> dict:
        return {"protocol": self.protocol, "agent_version": self.agent_version}


def hello_answer(agent_version: str) -> dict:
    return Hello(PROTOCOL_VERSION, agent_version).answer()


def whoami_answer(user: str, userdir: str) -> dict:
    return WHOAMI.check({"user": user, "userdir": userdir})


def error_message(answer: object) -> str | None:
    """The message of an error answer; None when answer is not one."""
    if isinstance(answer, dict) and isinstance(answer.get(ERROR_KEY), str):
        return answer[ERROR_KEY]
    return None
