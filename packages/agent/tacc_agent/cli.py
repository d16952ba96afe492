"""`tacc-agent`: the cluster side of TACC, run by tcloud over SSH (JSON in, JSON out),
by Slurm (the batch step and the per-node execution wrapper) and by ops.

Verbs (tcloud's are built, and their answers shaped, by tacc_contract.protocol):
  hello                        the protocol this agent speaks and its version
  check [--json] [--no-slurm]  node health checks; drain/resume this node in Slurm
  serve [--port N] [--interval S] [--config FILE]  the node daemon: checks, /metrics, facts
  whoami                       the caller's user and directory
  quota                        the caller's limits, fair share and usage
  queue-tick                   one round of the scheduling plug-ins' queue hooks (LAS)
  store                        delta upload: JSON request on stdin (missing | commit)
  job check                    would the cluster accept this instruction? (stdin)
  job submit WORKDIR           sbatch a committed job directory
  job status|logs|cancel|halt|resume|rerun JOB, job ps
  batch JOBDIR, exec JOBDIR    run by Slurm: layer 4 (see tacc_agent/execute.py)
Errors: one JSON line {"error": ..., "field": ...} on stdout (the contract's error_line,
with the field it names) and a non-zero exit
(2 rejected request, 3 Slurm or storage trouble); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from tacc_agent.config import load_config
from tacc_agent.errors import EXIT_CLUSTER, EXIT_OK, EXIT_REJECTED, AgentError, Rejected
from tacc_contract import protocol
from tacc_contract.errors import error_line

DISTRIBUTION = "tacc-agent"

# Each verb imports only the modules it uses: `check` (Slurm's HealthCheckProgram) starts
# fast, and the `serve` daemon stays small.


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    sub.add_parser("hello", help="the protocol this agent speaks (tcloud asks once a session)")
    p_check = sub.add_parser("check", help="run the node health checks once (HealthCheckProgram)")
    p_check.add_argument("--json", action="store_true", help="machine-readable output")
    p_check.add_argument("--no-slurm", action="store_true", help="do not drain or resume")
    p_serve = sub.add_parser("serve", help="the node daemon: checks on an interval, /metrics")
    p_serve.add_argument("--port", type=int, help="metrics port (default: metrics_port, 9770)")
    p_serve.add_argument("--interval", type=float, help="seconds between check runs (60)")
    for verb in (p_check, p_serve):  # also after the verb: `tacc-agent serve --config FILE`
        verb.add_argument("--config", type=Path, default=argparse.SUPPRESS, help="settings file")
    sub.add_parser("whoami", help="the caller's user and directory")
    sub.add_parser("quota", help="the caller's limits, fair share and usage (Slurm accounting)")
    sub.add_parser("queue-tick", help="one round of the scheduling plug-ins' tick (root)")
    sub.add_parser("store", help="delta upload (JSON on stdin)")
    sub.add_parser("env", help="the caller's cached environments")
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
    job.add_parser("resume", help="release a halted job").add_argument("job")
    job.add_parser("rerun", help="the same files and locked environment again").add_argument("job")
    sub.add_parser("batch", help="(Slurm) a job's batch step").add_argument("jobdir", type=Path)
    sub.add_parser("exec", help="(srun) one node's execution wrapper").add_argument(
        "jobdir", type=Path
    )
    return parser


def emit(data: object) -> int:
    print(json.dumps(data, indent=1, sort_keys=True))
    return EXIT_OK


def read_request() -> dict:
    try:
        request = json.loads(sys.stdin.buffer.read().decode())
    except ValueError as exc:
        raise Rejected(f"expected one JSON object on stdin: {exc}") from None
    if not isinstance(request, dict):
        raise Rejected("expected one JSON object on stdin")
    return request


def job_command(args: argparse.Namespace, config) -> int:
    from tacc_agent.tasks import (  # lazy verb import
        jobs,
        logs,
        records,
        rerun,
        schedule,
        sweeps,
        workspace,
    )
    from tacc_agent.tasks.instruction import parse  # lazy verb import

    if args.verb == "check":
        task = parse(sys.stdin.buffer.read().decode(errors="replace"), "instruction")
        partition = schedule.check(task, config)
        return emit({"ok": True, "partition": partition})
    user_dir = workspace.userdir(config, args.userdir)
    if args.verb == "submit":
        return emit(schedule.submit(user_dir, args.workdir, config))
    if args.verb == "ps":
        return emit(protocol.JOB_PS.check(jobs.ps(user_dir, config), "job ps", ""))
    if args.verb == "status":
        return emit(protocol.JOB_STATUS.check(jobs.status(user_dir, args.job, config)))
    if args.verb == "logs":
        job_dir = jobs.find_job(user_dir, args.job, config)

        def ended() -> bool:  # once a second while following: the state only
            if sweeps.is_whole_sweep(args.job, job_dir):
                state = jobs.sweep_status(args.job, job_dir, config)["state"]
            else:
                state, _ = jobs.reconcile(job_dir, jobs.own_info(args.job, job_dir, config))
            return state in (*records.TERMINAL, "HALTED")

        logs.stream(job_dir, args.follow, args.tail, args.rank, ended)
        return EXIT_OK
    if args.verb == "cancel":
        return emit(jobs.cancel(user_dir, args.jobs, config))
    if args.verb == "halt":
        return emit(jobs.halt(user_dir, args.job, config, args.grace))
    if args.verb == "rerun":
        return emit(rerun.rerun(user_dir, args.job, config))
    return emit(jobs.resume(user_dir, args.job, config))


def dispatch(args: argparse.Namespace) -> int:
    config = load_config(args.config)
    if config.plugins:  # their task fields are part of what an instruction may hold
        from tacc_agent.tasks.instruction import configure  # lazy verb import

        configure(config.plugins)
    if args.command in ("batch", "exec"):
        from tacc_agent.tasks import execute  # lazy verb import

        run = execute.batch if args.command == "batch" else execute.execute
        return run(args.jobdir, config)
    if args.command == "job":
        return job_command(args, config)
    if args.command == "check":
        from tacc_agent.health import cycle as health  # lazy verb import

        return health.check(config, args.json, not args.no_slurm)
    if args.command == "serve":
        from tacc_agent import serve  # lazy verb import

        return serve.serve(config, args.port, args.interval)
    if args.command == "quota":
        from tacc_agent.tasks.quota import quota  # lazy verb import

        return emit(quota(config))
    if args.command == "queue-tick":
        from tacc_agent.tasks.queue_ticks import tick  # lazy verb import

        return emit({"changes": tick(config)})
    from tacc_agent.tasks import envcache, workspace  # lazy verb import

    user_dir = workspace.userdir(config, args.userdir)
    if args.command == "whoami":
        return emit(protocol.whoami_answer(workspace.current_user(), str(user_dir)))
    if args.command == "env":
        return emit(envcache.listing(user_dir))
    return emit(store_round_trip(user_dir, read_request(), config))


def store_round_trip(user_dir: Path, request: dict, config) -> dict:
    """`store`, optionally with the scheduling steps that go with it, so a submit is two
    round trips: "check" (the instruction) refuses an impossible task before anything
    is uploaded; "submit" sbatches the job directory the commit just built."""
    from tacc_agent.tasks import schedule, store  # lazy verb import
    from tacc_agent.tasks.instruction import parse  # lazy verb import

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


def agent_version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # lazy verb import

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        print(agent_version())
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_REJECTED
    if args.command == "hello":  # before the settings: answers even when they are broken
        return emit(protocol.hello_answer(agent_version()))
    os.umask(0o077)  # everything the agent writes for a user is private to them
    try:
        return dispatch(args)
    except AgentError as exc:
        print(error_line(str(exc), getattr(exc, "field", "")))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the contract is JSON on stdout, never a traceback
        print(error_line(f"internal error: {type(exc).__name__}: {exc}"))
        return EXIT_CLUSTER


if __name__ == "__main__":
    sys.exit(main())
