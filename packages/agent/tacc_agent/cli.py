"""`tacc-agent`: the cluster side of TACC, run by tcloud over SSH (JSON in, JSON out),
by Slurm (the batch step and the per-node execution wrapper) and by ops.

The verbs are declared once: tcloud's in tacc_contract.verbs (their table is in
docs/protocol.md), the node's and ops' in tacc_agent/node_verbs.py. The command line is
built from them (tacc_agent/verb_parser.py); this module holds one handler per verb
(ANSWERS: the verbs that answer one JSON value, checked against the verb's answer type
before it goes out; STREAMS: the verbs that write as they go, each its own process).
`tacc-agent session` runs every ANSWERS verb of one tcloud connection in one process.

Errors: one JSON line {"error": ..., "field": ..., "kind": ...} on stdout (the
contract's error_line) and the kind's exit number (1 failed, 2 rejected, 3 cluster:
tacc_contract.errors.ERROR_KINDS); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import BinaryIO

from tacc_agent import node_verbs
from tacc_agent.config import AgentConfig, load_config
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.verb_parser import build_parser, option_problem
from tacc_contract import protocol, verbs
from tacc_contract.errors import AGENT_CLUSTER, AGENT_OK, AGENT_REJECTED, error_line
from tacc_contract.verbs import Verb

DISTRIBUTION = "tacc-agent"

# Each verb imports only the modules it uses: `check` (Slurm's HealthCheckProgram) starts
# fast, and the `serve` daemon stays small.


class RefusedArguments(Rejected):
    """Words a session request carries that the parser refuses (argparse's message)."""


class RequestParser(argparse.ArgumentParser):
    """The parser of a session's request lines: a bad line is an error answer, the
    session goes on (the one-shot command line keeps argparse's usage and exit 2)."""

    def error(self, message: str):
        raise RefusedArguments(f"{self.prog}: {message}")

    def exit(self, status: int = 0, message: str | None = None):
        raise RefusedArguments(message.strip() if message else f"{self.prog}: exit {status}")

    def print_help(self, file=None) -> None:
        raise RefusedArguments(f"{self.prog}: --help is not a request")


# The words on every submit's path (tcloud's `session` and `hello`, Slurm's `batch JOBDIR`
# and srun's `exec JOBDIR`), read without building the parser (a few ms a start).
QUICK_VERBS = {"hello": verbs.HELLO, "session": verbs.SESSION}
QUICK_JOB_DIR_VERBS = {"batch": node_verbs.BATCH, "exec": node_verbs.EXEC}


def quick_args(argv: list[str]) -> argparse.Namespace | None:
    """What build_parser().parse_args(argv) returns for the words on a submit's path;
    None for anything else (an option, a word too few or too many), which the parser
    reads, with its own usage and errors."""
    common = {"version": False, "config": None, "userdir": None}
    if len(argv) == 1 and argv[0] in QUICK_VERBS:
        return argparse.Namespace(**common, declared=QUICK_VERBS[argv[0]], word=argv[0])
    if len(argv) == 2 and argv[0] in QUICK_JOB_DIR_VERBS and not argv[1].startswith("-"):
        declared = QUICK_JOB_DIR_VERBS[argv[0]]
        return argparse.Namespace(**common, declared=declared, word=argv[0], jobdir=argv[1])
    return None


def parse_command_line(argv: list[str]) -> argparse.Namespace | None:
    """The command line's arguments; None after printing the help (no verb) or a
    streaming verb's refused option."""
    args = quick_args(argv)
    if args is not None:
        return args
    parser = build_parser()
    words, command = split_command(argv)
    args = parser.parse_args(words)
    if command is not None:
        if "command" not in vars(args):
            parser.error("only `job attach` and `enter` take a command after --")
        args.command = command
    if args.declared is None and not args.version:
        parser.print_help()
        return None
    if args.declared is not None and args.declared.streams and (problem := option_problem(args)):
        # a stream's refusal goes where its own output does not: stderr, exit 2
        print(f"tacc-agent {args.declared.name}: {problem}", file=sys.stderr)
        return None
    return args


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the agent's own words, the command's words after the first `--` or None): a
    command's words are never read as the agent's options."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


@dataclass(frozen=True)
class VerbInput:
    """What a verb reads besides its words: its stdin, whole (`store`, `job check`), or
    as a binary stream (`store receive`). One-shot: the process's stdin; in a session:
    the request line's text and the session's own reader."""

    data: Callable[[], bytes]
    reader: BinaryIO


def process_input() -> VerbInput:
    return VerbInput(lambda: sys.stdin.buffer.read(), sys.stdin.buffer)


@dataclass
class Call:
    """One asked verb: its fields, its settings and the caller's directory (read when a
    handler first needs them), and its input."""

    args: argparse.Namespace
    source: VerbInput = field(default_factory=process_input)

    @cached_property
    def config(self) -> AgentConfig:
        return configured(self.args)

    @cached_property
    def user_dir(self) -> Path:
        from tacc_agent.tasks.store import workspace  # lazy verb import

        return workspace.userdir(self.config, self.args.userdir)


def emit(data: object) -> int:
    print(json.dumps(data, indent=1, sort_keys=True))
    return AGENT_OK


def read_request(source: VerbInput) -> dict:
    try:
        request = json.loads(source.data().decode())
    except ValueError as exc:
        raise Rejected(f"expected one JSON object on stdin: {exc}") from None
    if not isinstance(request, dict):
        raise Rejected("expected one JSON object on stdin")
    return request


def configured(args: argparse.Namespace):
    """The agent's settings, with the plug-ins' task fields an instruction may hold."""
    config = load_config(args.config)
    # Set for every verb that reads instructions; reset too once loaded: a session's
    # earlier request may have named other settings (--config) than this one.
    if config.plugins or "tacc_agent.tasks.schedule.instruction" in sys.modules:
        from tacc_agent.tasks.schedule.instruction import configure  # lazy verb import

        configure(config.plugins)
    return config


# --- the verbs that answer one JSON value ------------------------------------------------


def hello(call: Call) -> object:
    return protocol.hello_answer(agent_version())


def whoami(call: Call) -> object:
    from tacc_agent.tasks.store import workspace  # lazy verb import

    return {"user": workspace.current_user(), "userdir": str(call.user_dir)}


def quota(call: Call) -> object:
    from tacc_agent.tasks.accounting.quota import quota  # lazy verb import

    return quota(call.config)


def usage(call: Call) -> object:
    from tacc_agent.tasks.accounting.usage import usage  # lazy verb import

    return usage(call.config, call.args.since, call.args.until)


def queue_tick(call: Call) -> object:
    from tacc_agent.tasks.schedule.queue_ticks import tick  # lazy verb import

    return {"changes": tick(call.config)}


def environments(call: Call) -> object:
    from tacc_agent.tasks.execute import envcache  # lazy verb import

    return envcache.listing(call.user_dir)


def image_resolve(call: Call) -> object:
    from tacc_agent.tasks.images.registry import resolve  # lazy verb import

    config = call.config
    return resolve(
        call.args.reference, config.image_resolve_timeout_seconds, config.image_registries
    )


def image_ls(call: Call) -> object:
    from tacc_agent.tasks.images.cache import listing  # lazy verb import

    return listing(call.user_dir)


def job_check(call: Call) -> object:
    from tacc_agent.tasks.schedule import submit as schedule  # lazy verb import
    from tacc_agent.tasks.schedule.instruction import parse  # lazy verb import

    task = parse(call.source.data().decode(errors="replace"), "instruction")
    return {"ok": True, "partition": schedule.check(task, call.config)}


def job_submit(call: Call) -> object:
    from tacc_agent.tasks.schedule import submit as schedule  # lazy verb import

    return schedule.submit(call.user_dir, Path(call.args.workdir), call.config)


def job_ps(call: Call) -> object:
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    limit = call.args.limit
    return jobs.ps(call.user_dir, call.config, **({} if limit is None else {"limit": limit}))


def job_status(call: Call) -> object:
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    return jobs.status(call.user_dir, call.args.job, call.config)


def job_cancel(call: Call) -> object:
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    return jobs.cancel(call.user_dir, call.args.jobs, call.config)


def job_halt(call: Call) -> object:
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    args = call.args
    return jobs.halt(call.user_dir, args.job, call.config, args.grace, args.reason)


def job_resume(call: Call) -> object:
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    return jobs.resume(call.user_dir, call.args.job, call.config, call.args.reason)


def job_rerun(call: Call) -> object:
    from tacc_agent.tasks.jobs import rerun  # lazy verb import

    return rerun.rerun(call.user_dir, call.args.job, call.config)


def job_target(call: Call) -> object:
    from tacc_agent.tasks.interactive import attach  # lazy verb import

    return attach.target(call.user_dir, call.args.job, call.config, call.args.rank)


def job_top(call: Call) -> object:
    from tacc_agent.tasks.interactive import top  # lazy verb import

    return top.top(call.user_dir, call.args.job, call.config)


def settings_words(args: argparse.Namespace) -> list[str]:
    """The caller's --config and --userdir, for a process the verb starts as the caller."""
    words = ["--config", str(args.config)] if args.config else []
    return words + (["--userdir", args.userdir] if args.userdir else [])


def dashboard_open(call: Call) -> object:
    from tacc_agent.dashboard import launch  # lazy verb import

    return launch.open_dashboard(settings_words(call.args))


def store(call: Call) -> object:
    """`store`, optionally with the scheduling steps that go with it, so a submit is two
    round trips: "check" (the instruction) refuses an impossible task before anything
    is uploaded; "submit" sbatches the job directory the commit just built."""
    from tacc_agent.tasks.schedule import submit as schedule  # lazy verb import
    from tacc_agent.tasks.schedule.instruction import parse  # lazy verb import
    from tacc_agent.tasks.store import delta  # lazy verb import

    request = read_request(call.source)
    partition, shape = None, None
    if request.get("check") is not None:
        task = parse(json.dumps(request["check"]), "instruction")
        # Read once: the sbatch below (when this request carries it) is planned against
        # the same nodes and partitions, moments later.
        shape = schedule.cluster_shape(call.config.slurm_timeout_seconds)
        partition = schedule.check(task, call.config, shape)
    answer = delta.handle(call.user_dir, request)
    if partition:
        answer["partition"] = partition
    if request.get("submit") and answer.get("workdir"):
        workdir = Path(answer["workdir"])
        answer["job"] = schedule.submit(call.user_dir, workdir, call.config, shape)
    return protocol.store_answer(request, answer)


def store_receive(call: Call) -> object:
    from tacc_agent.tasks.store.receive import receive  # lazy verb import

    return receive(call.user_dir, call.source.reader)


ANSWERS: dict[Verb, Callable[[Call], object]] = {
    verbs.DASHBOARD_OPEN: dashboard_open,
    verbs.HELLO: hello,
    verbs.WHOAMI: whoami,
    verbs.QUOTA: quota,
    verbs.USAGE: usage,
    node_verbs.QUEUE_TICK: queue_tick,
    verbs.ENV: environments,
    verbs.IMAGE_RESOLVE: image_resolve,
    verbs.IMAGE_LS: image_ls,
    verbs.JOB_CHECK: job_check,
    verbs.JOB_SUBMIT: job_submit,
    verbs.JOB_PS: job_ps,
    verbs.JOB_STATUS: job_status,
    verbs.JOB_CANCEL: job_cancel,
    verbs.JOB_HALT: job_halt,
    verbs.JOB_RESUME: job_resume,
    verbs.JOB_RERUN: job_rerun,
    verbs.JOB_TARGET: job_target,
    verbs.JOB_TOP: job_top,
    verbs.STORE: store,
    verbs.STORE_RECEIVE: store_receive,
}


def answer(call: Call) -> object:
    """The JSON answer of a verb that answers one (every verb but the streaming ones):
    what the one-shot command prints and what a session answers, checked against the
    verb's answer type first. Raises AgentError."""
    declared: Verb = call.args.declared
    return declared.check_answer(ANSWERS[declared](call))


# --- the verbs that write as they go: their own process each ------------------------------


def session(call: Call) -> int:
    from tacc_agent import session  # lazy verb import

    return session.serve_stdio(protocol.hello_answer(agent_version()), SessionVerbs(call.args))


def batch(call: Call) -> int:
    from tacc_agent.tasks.execute import launch  # lazy verb import

    return launch.batch(Path(call.args.jobdir), call.config)


def execute(call: Call) -> int:
    from tacc_agent.tasks.execute import launch  # lazy verb import

    return launch.execute(Path(call.args.jobdir), call.config)


def health_check(call: Call) -> int:
    from tacc_agent.health import cycle as health  # lazy verb import

    return health.check(call.config, call.args.json, not call.args.no_slurm)


def accept(call: Call) -> int:
    from tacc_agent.health import acceptance  # lazy verb import

    args = call.args
    return acceptance.accept(call.config, args.node, args.peer, args.thresholds, args.json)


def accounts_sync(call: Call) -> int:
    from tacc_agent.accounts import sync  # lazy verb import

    args = call.args
    root = args.workspace_root or ""
    return sync.run_sync(call.config, not args.no_slurm, root, args.dry_run, args.json)


def serve(call: Call) -> int:
    """The node daemon. Its settings are read plainly (not call.config, which loads the
    plug-ins' task fields and with them the task schema): only the controller's daemon
    needs those, for its queue round."""
    from tacc_agent import serve  # lazy verb import

    config = load_config(call.args.config)
    rounds = queue_round(call) if config.queue_tick_seconds > 0 else None
    return serve.serve(config, call.args.port, call.args.interval, rounds)


def queue_round(call: Call) -> Callable[[], list[str]]:
    """The controller's queue ticks for its daemon (queue_tick_seconds > 0). Every other
    node's daemon never loads the scheduling backend (about 1.2 MiB of its 30 MiB
    budget: tests/unit/agent/tasks/jobs/test_security_serve_logs.py)."""
    from tacc_agent.tasks.schedule.queue_ticks import Allowed, tick  # lazy verb import

    config = call.config  # with the plug-ins' task fields: a tick reads instructions
    allowed: Allowed = {}  # running jobs' opt-ins, read once per job, kept between ticks
    return lambda: tick(config, allowed)


def report_usage(call: Call) -> int:
    from tacc_agent.tasks.accounting import usage_report  # lazy verb import

    args = call.args
    return usage_report.run(call.config, args.since, args.until, args.format)


def enter(call: Call) -> int:
    from tacc_agent.tasks.interactive import attach  # lazy verb import

    args = call.args
    return attach.enter(Path(args.jobdir), args.rank, args.command, call.config)


def node_usage(call: Call) -> int:
    from tacc_agent import node_usage  # lazy verb import

    return node_usage.run(call.config)


def relay(call: Call) -> int:
    from tacc_agent.tasks.interactive import relay  # lazy verb import

    args = call.args
    return relay.relay(args.port, args.socket, args.check, args.back)


def job_attach(call: Call) -> int:
    from tacc_agent.tasks.interactive import attach  # lazy verb import

    args = call.args
    return attach.attach(call.user_dir, args.job, call.config, args.rank, args.command, args.pty)


def job_connect(call: Call) -> int:
    from tacc_agent.tasks.interactive import connect  # lazy verb import

    args = call.args
    target = connect.RelayTarget(args.port, args.socket, args.check)
    return connect.connect(call.user_dir, args.job, call.config, args.rank, target)


def job_stop_on_disconnect(call: Call) -> int:
    from tacc_agent.tasks.interactive import attach  # lazy verb import

    return attach.stop_on_disconnect(call.user_dir, call.args.job, call.config)


def dashboard_connect(call: Call) -> int:
    from tacc_agent.dashboard import launch  # lazy verb import

    return launch.connect(settings_words(call.args))


def dashboard_serve(call: Call) -> int:
    from tacc_agent.dashboard import server, views  # lazy verb import

    config, settings = call.config, settings_words(call.args)
    runner = SessionVerbs(call.args)
    me = views.caller(config)

    def dashboard_of(codes) -> server.Dashboard:
        answers = views.Views(config, runner, me)
        return server.Dashboard(answers, codes, config.dashboard_idle_seconds, settings)

    return server.run(dashboard_of)


def job_logs(call: Call) -> int:
    from tacc_agent.tasks.jobs import logs, records, sweeps  # lazy verb import
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import

    args, config = call.args, call.config
    job_dir = jobs.find_job(call.user_dir, args.job, config)

    def ended() -> bool:  # once a second while following: the state only
        if sweeps.is_whole_sweep(args.job, job_dir):
            state = jobs.sweep_status(args.job, job_dir, config)["state"]
        else:
            state, _ = jobs.reconcile(job_dir, jobs.own_info(args.job, job_dir, config))
        return state in (*records.TERMINAL, "HALTED")

    logs.stream(job_dir, args.follow, args.tail, args.rank, ended)
    return AGENT_OK


STREAMS: dict[Verb, Callable[[Call], int]] = {
    verbs.SESSION: session,
    verbs.JOB_LOGS: job_logs,
    verbs.JOB_ATTACH: job_attach,
    verbs.JOB_CONNECT: job_connect,
    verbs.JOB_STOP_ON_DISCONNECT: job_stop_on_disconnect,
    node_verbs.CHECK: health_check,
    node_verbs.SERVE: serve,
    node_verbs.ACCEPT: accept,
    node_verbs.ACCOUNTS_SYNC: accounts_sync,
    node_verbs.REPORT_USAGE: report_usage,
    node_verbs.BATCH: batch,
    node_verbs.EXEC: execute,
    node_verbs.ENTER: enter,
    node_verbs.RELAY: relay,
    node_verbs.NODE_USAGE: node_usage,
    verbs.DASHBOARD_CONNECT: dashboard_connect,
    node_verbs.DASHBOARD_SERVE: dashboard_serve,
}


def failure_line(exc: Exception) -> tuple[int, str]:
    """A failed verb as the protocol reports it: its exit number and its error line."""
    if isinstance(exc, AgentError):
        return exc.exit_code, error_line(str(exc), getattr(exc, "field", ""), exc.exit_code)
    # the contract is JSON on stdout, never a traceback
    message = f"internal error: {type(exc).__name__}: {exc}"
    return AGENT_CLUSTER, error_line(message, "", AGENT_CLUSTER)


class SessionVerbs:
    """How a session runs one request: its words parsed as the command line's (the
    session's --config and --userdir unless the request names its own), answered by
    the same `answer` the one-shot verbs print."""

    def __init__(self, session_args: argparse.Namespace) -> None:
        self.session_args = session_args
        self.parser = build_parser(RequestParser)

    def __call__(self, words: list[str], stdin: bytes, reader: BinaryIO) -> tuple[int, object]:
        """(exit code, answer or error object); never raises but KeyboardInterrupt."""
        try:
            args = self.parser.parse_args(words)
            node_verb = args.declared in node_verbs.NODE_VERBS  # root's and Slurm's
            if args.version or args.declared not in ANSWERS or node_verb:
                asked = " ".join(words) or "no verb"
                raise Rejected(
                    f"not a session request: {asked} (a verb that answers one JSON value; "
                    "`job logs` and the node's verbs run as their own tacc-agent command)"
                )
            if problem := option_problem(args):
                raise Rejected(problem)
            args.config = args.config or self.session_args.config
            args.userdir = args.userdir or self.session_args.userdir
            return AGENT_OK, answer(Call(args, VerbInput(lambda: stdin, reader)))
        except Exception as exc:
            rc, line = failure_line(exc)
            return rc, json.loads(line)


def agent_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # lazy verb import

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_command_line(sys.argv[1:] if argv is None else argv)
    if args is None:
        return AGENT_REJECTED
    if args.version:
        print(agent_version())
        return AGENT_OK
    if args.declared is verbs.HELLO:  # before the settings: answers even when they are broken
        return emit(protocol.hello_answer(agent_version()))
    os.umask(0o077)  # everything the agent writes for a user is private to them
    try:
        if args.declared in STREAMS:
            return STREAMS[args.declared](Call(args))
        if problem := option_problem(args):
            raise Rejected(problem)
        return emit(answer(Call(args)))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        rc, line = failure_line(exc)
        print(line)
        return rc


if __name__ == "__main__":
    sys.exit(main())
