"""`tacc-agent`: the cluster side of TACC, run by tcloud over SSH (JSON in, JSON out),
by Slurm (the batch step and the per-node execution wrapper) and by ops.

Verbs (tcloud's are built, and their answers shaped, by tacc_contract.protocol):
  hello                        the protocol this agent speaks and its version
  session                      every verb below that answers JSON, one request line at a time,
                               in this one process (tacc_agent/session.py): tcloud's way in
  check [--json] [--no-slurm]  node health checks; drain/resume this node in Slurm
  serve [--port N] [--interval S] [--config FILE]  the node daemon: checks, /metrics, facts
  accept NODE [--peer NODE] [--json] [--thresholds JSON]  acceptance tests of a new or
                               rebooted node (root, on the controller; health/acceptance.py)
  whoami                       the caller's user and directory
  quota                        the caller's limits, fair share and usage
  queue-tick                   one round of the scheduling plug-ins' queue hooks (LAS)
  store                        delta upload: JSON request on stdin (missing | commit)
  store receive                blobs streamed on stdin (tacc_agent/tasks/store/receive.py)
  image resolve REF            the digest a registry reference names now (at submit)
  image ls                     the caller's cached container images
  job check                    would the cluster accept this instruction? (stdin)
  job submit WORKDIR           sbatch a committed job directory
  job status|logs|cancel|halt|resume|rerun JOB, job ps
  usage [--since D] [--until D]  the caller's own CPU and GPU seconds (Slurm accounting)
  report usage [--since D] [--until D] [--format F]  (root) every user's, with GPU time used
  batch JOBDIR, exec JOBDIR    run by Slurm: layer 4 (see tacc_agent/execute.py)
  node-usage                   run by srun in a step of a job (`job top`): its figures here
Errors: one JSON line {"error": ..., "field": ...} on stdout (the contract's error_line,
with the field it names) and a non-zero exit
(2 rejected request, 3 Slurm or storage trouble); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from tacc_agent.config import load_config
from tacc_agent.errors import EXIT_CLUSTER, EXIT_OK, EXIT_REJECTED, AgentError, Rejected
from tacc_contract import protocol
from tacc_contract.errors import error_line

DISTRIBUTION = "tacc-agent"
RECEIVE = "receive"  # `store receive`: the streamed form of `store`

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


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser):
    parser = parser_class(
        prog="tacc-agent",
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument(
        "--config", type=Path, help="settings file (default /etc/tacc-agent/config.yaml)"
    )
    parser.add_argument("--userdir", help="use this directory instead of <workspace>/<user>")
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("hello", help="the protocol this agent speaks")
    sub.add_parser("session", help="every JSON verb of one connection, one line each (tcloud)")
    p_check = sub.add_parser("check", help="run the node health checks once (HealthCheckProgram)")
    p_check.add_argument("--json", action="store_true", help="machine-readable output")
    p_check.add_argument("--no-slurm", action="store_true", help="do not drain or resume")
    p_serve = sub.add_parser("serve", help="the node daemon: checks on an interval, /metrics")
    p_serve.add_argument("--port", type=int, help="metrics port (default: metrics_port)")
    p_serve.add_argument("--interval", type=float, help="seconds between check runs (60)")
    p_accept = sub.add_parser("accept", help="acceptance tests of a node (root, controller)")
    p_accept.add_argument("node", help="the Slurm node to test; it stays drained unless it passes")
    p_accept.add_argument("--peer", help="the node in service to test with (default: the first)")
    p_accept.add_argument("--json", action="store_true", help="the record as JSON")
    p_accept.add_argument("--thresholds", help="JSON object over the config's `acceptance`")
    for verb in (p_check, p_serve, p_accept):  # also after the verb: `serve --config FILE`
        verb.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="settings file")
    sub.add_parser("whoami", help="the caller's user and directory")
    sub.add_parser("quota", help="the caller's limits, fair share and usage (Slurm accounting)")
    sub.add_parser("queue-tick", help="one round of the scheduling plug-ins' tick (root)")
    p_store = sub.add_parser("store", help="delta upload (JSON on stdin; `receive`: blobs)")
    p_store.add_argument("action", nargs="?", choices=[RECEIVE], help="blobs streamed on stdin")
    sub.add_parser("env", help="the caller's cached environments")
    p_image = sub.add_parser("image", help="container images: resolve, list the cache")
    image = p_image.add_subparsers(dest="image_verb", required=True)
    image.add_parser("resolve", help="the digest a registry reference names now").add_argument(
        "reference"
    )
    image.add_parser("ls", help="your cached images")
    p_job = sub.add_parser("job", help="submit and watch jobs")
    job = p_job.add_subparsers(dest="verb", required=True)
    job.add_parser("check", help="validate an instruction (stdin) against the cluster")
    job.add_parser("submit", help="sbatch a committed job directory").add_argument(
        "workdir", type=Path
    )
    job.add_parser("ps", help="your jobs")
    job.add_parser("status", help="one job's state, nodes, exit codes").add_argument("job")
    p_logs = job.add_parser("logs", help="every node's output, [host:rank] prefixed")
    p_logs.add_argument("job")
    p_logs.add_argument("-f", "--follow", action="store_true")
    p_logs.add_argument("--tail", type=int)
    p_logs.add_argument("--rank", type=int)
    job.add_parser("cancel", help="cancel jobs").add_argument("jobs", nargs="+")
    p_halt = job.add_parser("halt", help="checkpoint signal, then requeue on hold")
    p_halt.add_argument("job")
    p_halt.add_argument("--grace", type=float, help="seconds to wait for the checkpoint")
    p_resume = job.add_parser("resume", help="release a halted job")
    p_resume.add_argument("job")
    for verb in (p_halt, p_resume):  # the queue tick's preemption says why (one line)
        verb.add_argument("--reason", help="why, for the job's events (default: its owner)")
    job.add_parser("rerun", help="the same files and locked environment again").add_argument("job")
    p_target = job.add_parser("target", help="a running job's nodes, by rank, with addresses")
    p_target.add_argument("job")
    p_target.add_argument("--rank", type=int)
    p_attach = job.add_parser("attach", help="a command (or a shell) on a running job's node")
    p_attach.add_argument("job")
    p_attach.add_argument("--rank", type=int, default=0)
    p_attach.add_argument("--pty", action="store_true", help="the SSH channel has a PTY")
    p_attach.set_defaults(command_words=[])  # the words after `--` (parse_command_line)
    p_connect = job.add_parser("connect", help="one connection to a running job's program")
    p_connect.add_argument("job")
    p_connect.add_argument("--rank", type=int, default=0)
    add_relay_target(p_connect)
    job.add_parser(
        "stop-on-disconnect", help="cancel the running job when stdin closes"
    ).add_argument("job")
    job.add_parser("top", help="a running job's usage on each node").add_argument("job")
    add_usage_verbs(sub)
    sub.add_parser("batch", help="(Slurm) a job's batch step").add_argument("jobdir", type=Path)
    sub.add_parser("exec", help="(srun) one node's execution wrapper").add_argument(
        "jobdir", type=Path
    )
    p_enter = sub.add_parser("enter", help="(srun) a command in a job's environment on a node")
    p_enter.add_argument("jobdir", type=Path)
    p_enter.add_argument("--rank", type=int, default=0)
    p_enter.set_defaults(command_words=[])  # the words after `--` (parse_command_line)
    add_relay_target(sub.add_parser("relay", help="(srun) stdin/stdout to a port or socket here"))
    sub.add_parser("node-usage", help="(srun, by `job top`) this node's figures of the job")
    return parser


def tcp_port(text: str) -> int:
    """argparse's type for a port: a usage error, never a traceback, for anything else."""
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port 1..65535")
    return int(text)


def add_relay_target(verb) -> None:
    """`job connect` and `relay`: the loopback port or the Unix socket, and --check."""
    target = verb.add_mutually_exclusive_group(required=True)
    target.add_argument("--port", type=tcp_port, help="127.0.0.1:PORT on the node")
    target.add_argument("--socket", dest="socket_path", help="a Unix socket's absolute path")
    verb.add_argument("--check", action="store_true", help="only say whether it is exposed")


def add_usage_verbs(sub) -> None:
    """`usage` (the caller's own, tcloud's) and `report usage` (ops, root)."""
    p_usage = sub.add_parser("usage", help="your CPU and GPU seconds by month, account, partition")
    p_report = sub.add_parser("report", help="(root) reports for ops")
    report = p_report.add_subparsers(dest="report_verb", required=True)
    p_report_usage = report.add_parser("usage", help="every user's GPU hours, allocated and used")
    p_report_usage.add_argument("--format", choices=("table", "csv", "json"), default="table")
    for verb in (p_usage, p_report_usage):
        verb.add_argument("--since", help="first month or day (YYYY-MM[-DD])")
        verb.add_argument("--until", help="last month or day, included (YYYY-MM[-DD])")


# The words on every submit's path (tcloud's `session` and `hello`, Slurm's `batch JOBDIR`
# and srun's `exec JOBDIR`), read without building the parser above (a few ms a start).
QUICK_VERBS = ("hello", "session")
QUICK_JOB_DIR_VERBS = ("batch", "exec")


def quick_args(argv: list[str]) -> argparse.Namespace | None:
    """What build_parser().parse_args(argv) returns for the words on a submit's path;
    None for anything else (an option, a word too few or too many), which the parser
    reads, with its own usage and errors."""
    common = {"version": False, "config": None, "userdir": None}
    if len(argv) == 1 and argv[0] in QUICK_VERBS:
        return argparse.Namespace(**common, command=argv[0])
    if len(argv) == 2 and argv[0] in QUICK_JOB_DIR_VERBS and not argv[1].startswith("-"):
        return argparse.Namespace(**common, command=argv[0], jobdir=Path(argv[1]))
    return None


def parse_command_line(argv: list[str]) -> argparse.Namespace | None:
    """The command line's arguments; None after printing the help (no verb)."""
    args = quick_args(argv)
    if args is not None:
        return args
    parser = build_parser()
    words, command = split_command(argv)
    args = parser.parse_args(words)
    if command is not None:
        if "command_words" not in vars(args):
            parser.error("only `job attach` and `enter` take a command after --")
        args.command_words = command
    if args.command is None and not args.version:
        parser.print_help()
        return None
    return args


@dataclass(frozen=True)
class VerbInput:
    """What a verb reads besides its words: its stdin, whole (`store`, `job check`), or
    as a binary stream (`store receive`). One-shot: the process's stdin; in a session:
    the request line's text and the session's own reader."""

    data: Callable[[], bytes]
    reader: BinaryIO


def process_input() -> VerbInput:
    return VerbInput(lambda: sys.stdin.buffer.read(), sys.stdin.buffer)


def streams_output(args: argparse.Namespace) -> bool:
    """Verbs whose output is not one JSON answer (text as it comes, a daemon, a job's
    own output): a session refuses them, they keep their own process."""
    if args.command == "job":
        return args.verb in ("logs", "attach", "connect", "stop-on-disconnect")
    if args.command == "accept":  # root's, on the controller; its progress on stderr
        return True
    streaming = ("check", "serve", "batch", "exec", "enter", "relay", "node-usage", "session")
    return args.command in streaming or args.command == "report"


def emit(data: object) -> int:
    print(json.dumps(data, indent=1, sort_keys=True))
    return EXIT_OK


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


def job_answer(args: argparse.Namespace, config, source: VerbInput) -> object:
    from tacc_agent.tasks.jobs import rerun  # lazy verb import
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import
    from tacc_agent.tasks.schedule import submit as schedule  # lazy verb import
    from tacc_agent.tasks.schedule.instruction import parse  # lazy verb import
    from tacc_agent.tasks.store import workspace  # lazy verb import

    if args.verb == "check":
        task = parse(source.data().decode(errors="replace"), "instruction")
        partition = schedule.check(task, config)
        return {"ok": True, "partition": partition}
    user_dir = workspace.userdir(config, args.userdir)
    if args.verb == "submit":
        return schedule.submit(user_dir, args.workdir, config)
    if args.verb == "ps":
        return protocol.JOB_PS.check(jobs.ps(user_dir, config), "job ps", "")
    if args.verb == "status":
        return protocol.JOB_STATUS.check(jobs.status(user_dir, args.job, config))
    if args.verb == "cancel":
        return jobs.cancel(user_dir, args.jobs, config)
    if args.verb == "halt":
        return jobs.halt(user_dir, args.job, config, args.grace, args.reason)
    if args.verb == "rerun":
        return rerun.rerun(user_dir, args.job, config)
    if args.verb == "target":
        from tacc_agent.tasks.interactive import attach  # lazy verb import

        return protocol.JOB_TARGET.check(attach.target(user_dir, args.job, config, args.rank))
    if args.verb == "top":
        from tacc_agent.tasks.interactive import top  # lazy verb import

        return protocol.JOB_TOP.check(top.top(user_dir, args.job, config))
    return jobs.resume(user_dir, args.job, config, args.reason)


def answer(args: argparse.Namespace, source: VerbInput) -> object:
    """The JSON answer of a verb that answers one (every verb but streams_output): what
    the one-shot command prints and what a session answers. Raises AgentError."""
    if args.command == "hello":
        return protocol.hello_answer(agent_version())
    config = configured(args)
    if args.command == "job":
        return job_answer(args, config, source)
    if args.command == "quota":
        from tacc_agent.tasks.accounting.quota import quota  # lazy verb import

        return quota(config)
    if args.command == "usage":
        from tacc_agent.tasks.accounting.usage import usage  # lazy verb import

        return protocol.USAGE.check(usage(config, args.since, args.until))
    if args.command == "queue-tick":
        from tacc_agent.tasks.schedule.queue_ticks import tick  # lazy verb import

        return {"changes": tick(config)}
    if args.command == "image" and args.image_verb == "resolve":
        from tacc_agent.tasks.images.registry import resolve  # lazy verb import

        return resolve(args.reference, config.image_resolve_timeout_seconds)
    from tacc_agent.tasks.execute import envcache  # lazy verb import
    from tacc_agent.tasks.store import workspace  # lazy verb import

    user_dir = workspace.userdir(config, args.userdir)
    if args.command == "whoami":
        return protocol.whoami_answer(workspace.current_user(), str(user_dir))
    if args.command == "env":
        return envcache.listing(user_dir)
    if args.command == "image":
        from tacc_agent.tasks.images.cache import listing  # lazy verb import

        return protocol.IMAGES.check(listing(user_dir), "image ls", "")
    if args.action == RECEIVE:
        from tacc_agent.tasks.store.receive import receive  # lazy verb import

        return receive(user_dir, source.reader)
    return store_round_trip(user_dir, read_request(source), config)


def stream_verb(args: argparse.Namespace) -> int:
    """The verbs that write as they go (streams_output); their own process each."""
    if args.command == "session":
        from tacc_agent import session  # lazy verb import

        return session.serve_stdio(protocol.hello_answer(agent_version()), SessionVerbs(args))
    config = configured(args)
    if args.command in ("batch", "exec"):
        from tacc_agent.tasks.execute import launch as execute  # lazy verb import

        run = execute.batch if args.command == "batch" else execute.execute
        return run(args.jobdir, config)
    if args.command == "check":
        from tacc_agent.health import cycle as health  # lazy verb import

        return health.check(config, args.json, not args.no_slurm)
    if args.command == "accept":
        from tacc_agent.health import acceptance  # lazy verb import

        return acceptance.accept(config, args.node, args.peer, args.thresholds, args.json)
    if args.command == "serve":
        from tacc_agent import serve  # lazy verb import

        return serve.serve(config, args.port, args.interval)
    if args.command == "report":
        from tacc_agent.tasks.accounting import usage_report  # lazy verb import

        return usage_report.run(config, args.since, args.until, args.format)
    if args.command == "enter":
        from tacc_agent.tasks.interactive import attach  # lazy verb import

        return attach.enter(args.jobdir, args.rank, args.command_words, config)
    if args.command == "node-usage":
        from tacc_agent import node_usage  # lazy verb import

        return node_usage.run(config)
    if args.command == "relay":
        from tacc_agent.tasks.interactive import relay  # lazy verb import

        return relay.relay(args.port, args.socket_path, args.check)
    if args.verb in ("attach", "connect", "stop-on-disconnect"):
        from tacc_agent.tasks.interactive import attach  # lazy verb import
        from tacc_agent.tasks.store import workspace  # lazy verb import

        user_dir = workspace.userdir(config, args.userdir)
        if args.verb == "stop-on-disconnect":
            return attach.stop_on_disconnect(user_dir, args.job, config)
        if args.verb == "connect":
            target = attach.RelayTarget(args.port, args.socket_path, args.check)
            return attach.connect(user_dir, args.job, config, args.rank, target)
        return attach.attach(user_dir, args.job, config, args.rank, args.command_words, args.pty)
    return job_logs(args, config)


def split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(the agent's own words, the command's words after the first `--` or None): a
    command's words are never read as the agent's options."""
    if "--" not in argv:
        return argv, None
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1 :]


def job_logs(args: argparse.Namespace, config) -> int:
    from tacc_agent.tasks.jobs import logs, records, sweeps  # lazy verb import
    from tacc_agent.tasks.jobs import verbs as jobs  # lazy verb import
    from tacc_agent.tasks.store import workspace  # lazy verb import

    user_dir = workspace.userdir(config, args.userdir)
    job_dir = jobs.find_job(user_dir, args.job, config)

    def ended() -> bool:  # once a second while following: the state only
        if sweeps.is_whole_sweep(args.job, job_dir):
            state = jobs.sweep_status(args.job, job_dir, config)["state"]
        else:
            state, _ = jobs.reconcile(job_dir, jobs.own_info(args.job, job_dir, config))
        return state in (*records.TERMINAL, "HALTED")

    logs.stream(job_dir, args.follow, args.tail, args.rank, ended)
    return EXIT_OK


def store_round_trip(user_dir: Path, request: dict, config) -> dict:
    """`store`, optionally with the scheduling steps that go with it, so a submit is two
    round trips: "check" (the instruction) refuses an impossible task before anything
    is uploaded; "submit" sbatches the job directory the commit just built."""
    from tacc_agent.tasks.schedule import submit as schedule  # lazy verb import
    from tacc_agent.tasks.schedule.instruction import parse  # lazy verb import
    from tacc_agent.tasks.store import delta as store  # lazy verb import

    partition = None
    if request.get("check") is not None:
        task = parse(json.dumps(request["check"]), "instruction")
        partition = schedule.check(task, config)
    answer = store.handle(user_dir, request)
    if partition:
        answer["partition"] = partition
    if request.get("submit") and answer.get("workdir"):
        answer["job"] = schedule.submit(user_dir, Path(answer["workdir"]), config)
    return answer


def failure_line(exc: Exception) -> tuple[int, str]:
    """A failed verb as the protocol reports it: its exit code and its error line."""
    if isinstance(exc, AgentError):
        return exc.exit_code, error_line(str(exc), getattr(exc, "field", ""))
    # the contract is JSON on stdout, never a traceback
    return EXIT_CLUSTER, error_line(f"internal error: {type(exc).__name__}: {exc}")


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
            if args.version or args.command is None or streams_output(args):
                asked = " ".join(words) or "no verb"
                raise Rejected(
                    f"not a session request: {asked} (a verb that answers one JSON value; "
                    "`job logs` and the node's verbs run as their own tacc-agent command)"
                )
            args.config = args.config or self.session_args.config
            args.userdir = args.userdir or self.session_args.userdir
            return EXIT_OK, answer(args, VerbInput(lambda: stdin, reader))
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
        return EXIT_REJECTED
    if args.version:
        print(agent_version())
        return EXIT_OK
    if args.command == "hello":  # before the settings: answers even when they are broken
        return emit(protocol.hello_answer(agent_version()))
    os.umask(0o077)  # everything the agent writes for a user is private to them
    try:
        if streams_output(args):
            return stream_verb(args)
        return emit(answer(args, process_input()))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        rc, line = failure_line(exc)
        print(line)
        return rc


if __name__ == "__main__":
    sys.exit(main())
