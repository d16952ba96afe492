"""`tcloud`: submit ML tasks to a TACC cluster over SSH.

Exit codes: 0 ok, 1 internal error (a bug), 2 usage, 3 invalid task file, 4 cluster or
connection error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tacc_contract.jobs import FINAL_STATES, PS_LIMIT
from tcloud.compile import local_paths
from tcloud.errors import (
    EXIT_CLUSTER,
    EXIT_INTERNAL,
    EXIT_OK,
    EXIT_USAGE,
    TaccError,
    TcloudError,
    UsageError,
)

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from tcloud.compile.tasks import DryRun
    from tcloud.config import Cluster as Settings
    from tcloud.core import Cluster
    from tcloud.transport.link import Direct

# What the SFTP channel carries; every other command goes through the agent's session,
# which the connection master carries (tcloud.transport.mux): those never load paramiko when a
# master is up, nor the SDK's SFTP side.
FILE_COMMANDS = ("upload", "download", "ls", "cat")


def open_cluster(name: str | None, files: bool = False) -> Cluster:
    """The SDK's cluster side, loaded only by the commands that need a cluster: `tcloud
    --help`, init, validate, plugins, config and `submit --dry-run` start without it.
    files: the whole SDK (tcloud.sdk, paramiko); else tcloud.core, which opens the SSH
    stack only when a call needs a direct connection."""
    if files:
        from tcloud.sdk import Cluster as FilesCluster  # lazy verb import

        return FilesCluster(name)
    from tcloud.core import Cluster as AgentCluster  # lazy verb import

    return AgentCluster(name, direct=direct_ssh())


def direct_ssh() -> Direct:
    """The SDK's direct connection and host-key check (tcloud.sdk, tcloud.transport.ssh, paramiko),
    loaded on their first call: a command that the master serves never loads them."""
    from tcloud.transport.link import Direct  # lazy verb import

    return Direct(open_direct, host_keys_known)


def open_direct(settings: Settings) -> AbstractContextManager:
    from tcloud import sdk  # lazy verb import

    return sdk.open_direct(settings)


def host_keys_known(settings: Settings) -> bool:
    from tcloud import sdk  # lazy verb import

    return sdk.host_keys_known(settings)


def count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def idle_time(text: str) -> str:
    """argparse type: `tcloud dev --idle`, a Slurm time or 0 (never)."""
    from tacc_contract import schema  # lazy verb import

    expected = schema.idle_timeout(text)
    if expected is not None:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return text


def port(text: str) -> int:
    """argparse type: a TCP port."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return int(text)


def local_port(text: str) -> int:
    """argparse type: a local port to listen on, 0 for any free one."""
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tcloud", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command")
    p_init = sub.add_parser("init", help="write a commented tcloud.yaml")
    p_init.add_argument("path", nargs="?", type=Path, default=Path("."))
    p_init.add_argument("--name", help="task name (default: the directory's name)")
    p_init.add_argument("--force", action="store_true", help="overwrite an existing file")
    p_validate = sub.add_parser("validate", help="check a task file")
    p_validate.add_argument("path", nargs="?", type=Path)
    p_validate.add_argument("--json", action="store_true", help="machine-readable output")
    add_outside_flag(p_validate)
    p_submit = sub.add_parser("submit", help="compile a task and submit it")
    p_submit.add_argument("path", nargs="?", type=Path)
    p_submit.add_argument(
        "--dry-run",
        action="store_true",
        help="print the digest, sbatch line and instruction; no cluster",
    )
    p_submit.add_argument("--json", action="store_true", help="machine-readable output")
    p_submit.add_argument("--cluster", help="cluster name (default: the current one)")
    p_submit.add_argument(
        "--sweep", action="store_true", help="run the task file's sweep: one trial per combination"
    )
    add_outside_flag(p_submit)
    p_plugins = sub.add_parser("plugins", help="the plug-ins and which are on")
    p_plugins.add_argument("path", nargs="?", type=Path, help="for this task file's selection")
    p_plugins.add_argument("--json", action="store_true", help="machine-readable output")
    p_config = sub.add_parser("config", help="clusters: add, use, ls")
    config_sub = p_config.add_subparsers(dest="config_command", required=True)
    p_add = config_sub.add_parser("add", help="add or update a cluster")
    p_add.add_argument("name")
    p_add.add_argument("--host", help="login node address or ~/.ssh/config alias")
    p_add.add_argument("--user")
    p_add.add_argument("--port", type=port)
    p_add.add_argument("--key", help="private key file (default: ssh-agent, ~/.ssh/config)")
    p_add.add_argument("--proxy-jump", dest="proxy_jump", help="[user@]jumphost[:port]")
    p_add.add_argument("--known-hosts", dest="known_hosts", help="extra known_hosts file")
    p_add.add_argument(
        "--fallback-host",
        dest="fallback_hosts",
        action="append",
        help="another login host, tried when --host does not answer (repeat for more)",
    )
    p_add.add_argument(
        "--userdir", help="your directory on the cluster (default: the cluster's workspace)"
    )
    p_use = config_sub.add_parser("use", help="make NAME the current cluster")
    p_use.add_argument("name")
    p_ls = config_sub.add_parser("ls", help="list clusters")
    p_ls.add_argument("--json", action="store_true", help="machine-readable output")
    add_cluster_commands(sub)
    return parser


def add_outside_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        local_paths.ALLOW_FLAG,
        dest="allow_outside",
        action="store_true",
        help="let code.workdir and datasets[].local name paths outside the task's directory "
        "(places of secrets such as ~/.ssh are refused still)",
    )


def add_cluster_commands(sub) -> None:
    def command(name: str, text: str, *, listing: bool = False):
        p = sub.add_parser(name, help=text)
        p.add_argument("--cluster", help="cluster name (default: the current one)")
        if listing:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    p_ps = command("ps", "your jobs, newest first", listing=True)
    p_ps.add_argument("--limit", type=count, help=f"the newest N (default {PS_LIMIT})")
    command("status", "one job's state, per-node states and exit codes", listing=True).add_argument(
        "job"
    )
    p_logs = command("logs", "a job's output, every line prefixed [host:rank]")
    p_logs.add_argument("job")
    p_logs.add_argument("-f", "--follow", action="store_true", help="until the job ends")
    p_logs.add_argument("--tail", type=count, help="only the last N lines")
    p_logs.add_argument("--node", type=count, help="only this rank's lines (0, 1, ...)")
    command("cancel", "cancel jobs").add_argument("jobs", nargs="+")
    p_halt = command("halt", "checkpoint signal, then keep the job queued on hold")
    p_halt.add_argument("job")
    p_halt.add_argument(
        "--grace",
        type=grace_seconds,
        metavar="SECONDS",
        help="how long the program may take to checkpoint and exit (default: the cluster's)",
    )
    command("resume", "let a halted job run again").add_argument("job")
    command(
        "rerun",
        "submit a past job again: the same files and the same locked versions",
        listing=True,
    ).add_argument("job")
    p_up = command("upload", "copy local files to your cluster directory (files/)")
    p_up.add_argument("local", type=Path)
    p_up.add_argument("remote", nargs="?", help="name under files/ (default: the local name)")
    p_down = command("download", "fetch a job's outputs/ and logs/ (a sweep's: by trial)")
    p_down.add_argument("job")
    p_down.add_argument("dest", nargs="?", type=Path, help="local directory (default: ./JOB)")
    p_down.add_argument(
        "--best",
        action="store_true",
        help="a sweep's best trial only (highest rung, best metric there), into DEST",
    )
    command("ls", "list your cluster directory", listing=True).add_argument("path", nargs="?")
    command("cat", "print a file from your cluster directory").add_argument("path")
    command("quota", "your limits, fair share and usage on the cluster", listing=True)
    p_usage = command("usage", "your CPU and GPU hours by month, account, partition (accounting)")
    p_usage.add_argument("--since", metavar="YYYY-MM[-DD]", help="first month or day")
    p_usage.add_argument("--until", metavar="YYYY-MM[-DD]", help="last month or day (included)")
    p_usage.add_argument(
        "--by",
        default="month,account,partition",
        metavar="WORDS",
        help="group by these, comma-separated: month, account, partition (default: all three)",
    )
    p_usage.add_argument("--format", choices=("table", "csv", "json"), default="table")
    p_usage.add_argument("--json", action="store_true", help="the same as --format json")
    command("disconnect", "stop the shared connection to the cluster (its connection master)")
    p_env = command("env", "cached environments", listing=True)
    p_env.add_argument("action", choices=["ls"])
    command("images", "your container images cached on the cluster", listing=True)
    add_interactive_commands(command)


def add_interactive_commands(command) -> None:
    """Into a running job (docs/interactive.md): shell, exec, forward, dev, top."""
    p_shell = command("shell", "an interactive shell on a node of your running job")
    p_shell.add_argument("job")
    p_shell.add_argument("--node", type=count, default=0, help="the rank's node (default 0)")
    p_exec = command("exec", "run a command on your running job's nodes: exec JOB -- CMD ...")
    p_exec.usage = "tcloud exec [-h] [--cluster CLUSTER] [--node R | --all] JOB -- CMD ..."
    p_exec.add_argument("job")
    where = p_exec.add_mutually_exclusive_group()
    where.add_argument("--node", type=count, default=0, help="the rank's node (default 0)")
    where.add_argument("--all", action="store_true", help="on every node of the job")
    p_forward = command("forward", "forward local ports to your running job's program")
    p_forward.add_argument("job")
    p_forward.add_argument(
        "ports",
        nargs="+",
        metavar="PORT[:LOCAL]|/SOCKET[:LOCAL]",
        help="the program's port on the node's 127.0.0.1, or its Unix socket's absolute path",
    )
    p_forward.add_argument("--node", type=count, default=0, help="the rank's node (default 0)")
    p_dev = command("dev", "start an interactive session: submit, wait, forward or shell")
    p_dev.add_argument("path", nargs="?", type=Path)
    p_dev.add_argument(
        "--port",
        action="append",
        default=[],
        metavar="P[:L]",
        help="a port of the session, forwarded to local port L (default P); repeatable",
    )
    p_dev.add_argument(
        "--idle", type=idle_time, metavar="T", help="idle timeout (a Slurm time; 0: never)"
    )
    p_dev.add_argument(
        "--stop-on-disconnect",
        dest="stop_on_disconnect",
        action="store_true",
        default=None,
        help="cancel the session when this command's connection closes",
    )
    p_dev.add_argument("--detach", action="store_true", help="print how to connect and exit")
    add_outside_flag(p_dev)
    p_dashboard = command(
        "dashboard", "your jobs, their logs and plots in your browser, through your SSH login"
    )
    p_dashboard.add_argument(
        "--port", type=local_port, default=0, help="the local port (default: any free one)"
    )
    p_dashboard.add_argument(
        "--no-browser",
        dest="browser",
        action="store_false",
        help="print the one-time login address instead of opening a browser",
    )
    p_top = command("top", "live CPU, memory and GPU use per node of your running job")
    p_top.add_argument("job")
    p_top.add_argument("--once", action="store_true", help="one frame, then exit")
    p_top.add_argument("--interval", type=interval_seconds, default=2.0, metavar="S")
    p_top.add_argument("--json", action="store_true", help="the raw answers, one per line")


def cmd_init(args: argparse.Namespace) -> int:
    from tcloud import local  # lazy verb import

    target = local.init(args.path, args.name, args.force)
    print(f"wrote {target}; edit it, then `tcloud validate` and `tcloud submit`")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from tacc_contract import cpus_and_memory  # lazy verb import
    from tacc_plugins import gpu_share  # lazy verb import
    from tcloud.compile import imagebuild, tasks  # lazy verb import

    task = tasks.validate(args.path or Path("."), allow_outside=args.allow_outside)
    image = {"image": task.spec.image} if task.spec.image else {}
    if task.spec.image_build:
        build = imagebuild.locate(task.spec, task.source)
        image = {"image_build": {"file": build.file, "base": build.build.base}}
    per_node = cpus_and_memory.described(task.spec.resources)
    share = gpu_share.described(task.spec.resources)
    if args.json:
        fields = {"file": task.source, "valid": True, "name": task.name, "per_node": per_node}
        print(json.dumps({**fields, **({"gpu_share": share} if share else {}), **image}))
        return EXIT_OK
    print(f"{task.source}: valid task {task.name!r}")
    print(f"  per node: {per_node}")
    if share:
        print(f"  GPU: {share}")
    if task.spec.image:
        print(f"  image {task.spec.image} ({tasks.IMAGE_AT_SUBMIT})")
    if "image_build" in image:
        print(f"  {build_text(image['image_build'])}")
    return EXIT_OK


def build_text(build: dict) -> str:
    """What validate and a dry run say of an image built from a build file."""
    from tcloud.compile import imagebuild, tasks  # lazy verb import

    return (
        f"image build {build['file']} FROM {build['base']} ({imagebuild.BUILT_ON_CLUSTER}; "
        f"the base {tasks.IMAGE_AT_SUBMIT})"
    )


def cmd_config(args: argparse.Namespace) -> int:
    from tcloud import local  # lazy verb import

    if args.config_command == "add":
        fields = (
            "host",
            "user",
            "port",
            "key",
            "proxy_jump",
            "known_hosts",
            "userdir",
            "fallback_hosts",
        )
        entry = local.add_cluster(args.name, **{f: getattr(args, f) for f in fields})
        print(f"cluster {entry.name!r}: {entry.user or '(ssh config)'}@{entry.host}")
    elif args.config_command == "use":
        local.use_cluster(args.name)
        print(f"current cluster: {args.name}")
    else:
        rows = local.clusters()
        if args.json:
            print(json.dumps(rows, indent=2))
        for row in [] if args.json else rows:
            mark = "*" if row["current"] else " "
            print(f"{mark} {row['name']:<12} {row['user'] or '-'}@{row['host']}")
    return EXIT_OK


def cmd_plugins(args: argparse.Namespace) -> int:
    from tcloud import local  # lazy verb import

    rows = local.plugins(args.path)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        state = "on " if row["on"] else "off"
        policy = " (cluster policy)" if row["policy"] else ""
        print(f"{state} {row['name']:<10} {'/'.join(row['layers']):<24} {row['summary']}{policy}")
    return EXIT_OK


def print_outside(paths: list[str]) -> None:
    for path in paths:
        print(f"  uploads from outside the task's directory: {path}")


def cmd_submit(args: argparse.Namespace) -> int:
    from tcloud.compile import imagebuild, tasks  # lazy verb import

    task = args.path or Path(".")
    options = {"sweep": args.sweep, "allow_outside": args.allow_outside}
    if args.dry_run:
        return print_dry_run(tasks.dry_run(task, **options), args.json)
    with open_cluster(args.cluster) as cluster:
        submission = cluster.submit(task, **options).submission
    if args.json:
        print(json.dumps(submission.as_dict(), indent=2))
        return EXIT_OK
    print(
        f"submitted job {submission.job_id} ({submission.name}) to partition "
        f"{submission.partition}; sent {submission.blobs_sent} file(s), {submission.bytes_sent} "
        f"bytes; workdir {submission.workdir}"
    )
    if submission.image:
        print(f"  image {submission.image}")
    if submission.image_build:
        print(f"  image: {imagebuild.summary(submission.image_build)}")
    for name, what in sorted(submission.plugins.items()):
        print(f"  plug-in {name}: {what}")
    print_outside(submission.outside_paths)
    return EXIT_OK


def print_dry_run(plan: DryRun, as_json: bool) -> int:
    from tcloud.compile import tasks  # lazy verb import

    if as_json:
        print(json.dumps(plan.as_dict(), indent=2, sort_keys=True))
        return EXIT_OK
    print(f"digest: {plan.digest}")
    print(f"files: {plan.files} ({plan.bytes} bytes)")
    if image := plan.instruction["task"].get("image"):
        print(f"image: {image} ({tasks.IMAGE_AT_SUBMIT}, which changes the digest)")
    if build := plan.instruction["task"].get("image_build"):
        print(f"{build_text(build)}; the key is computed at submit")
    print_outside(plan.outside_paths)
    print(f"sbatch (before the cluster's scheduling plug-ins): {shlex.join(plan.sbatch)}")
    print("--- instruction.json ---")
    print(json.dumps(plan.instruction["task"], indent=2, sort_keys=True))
    return EXIT_OK


def print_rows(rows: list[dict], as_json: bool, columns: tuple[str, ...]) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns).rstrip())


def print_json_or(value, as_json: bool, text) -> None:
    print(json.dumps(value, indent=2) if as_json else text(value))


def run_ps(cluster: Cluster, args: argparse.Namespace) -> None:
    from tcloud.jobs import verbs as jobs  # lazy verb import

    rows = cluster.jobs(args.limit)
    columns = jobs.PS_FIELDS
    if not args.json and any("kind" in row for row in rows):  # an agent that says it
        rows = [{**row, "kind": row.get("kind", "job")} for row in rows]
        columns = (columns[0], "kind", *columns[1:])
    print_rows(rows, args.json, columns)


def run_status(cluster: Cluster, args: argparse.Namespace) -> None:
    from tcloud.jobs import verbs as jobs  # lazy verb import

    info = cluster.job(args.job).status()
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        jobs.describe(info)


def run_logs(cluster: Cluster, args: argparse.Namespace) -> None:
    for line in cluster.job(args.job).logs(args.follow, args.tail, args.node):
        print(line, flush=True)


def run_cancel(cluster: Cluster, args: argparse.Namespace) -> None:
    for row in cluster.cancel(*args.jobs):
        done = "cancelled" if row["cancelled"] else f"already {row['state']}"
        print(f"job {row['job_id']}: {done}")


def run_halt(cluster: Cluster, args: argparse.Namespace) -> None:
    print(halt_text(cluster.job(args.job).halt(args.grace)))


def run_resume(cluster: Cluster, args: argparse.Namespace) -> None:
    cluster.job(args.job).resume()
    print(f"job {args.job} released")


def run_rerun(cluster: Cluster, args: argparse.Namespace) -> None:
    from tcloud.jobs import verbs as jobs  # lazy verb import

    print_json_or(cluster.job(args.job).rerun(), args.json, jobs.rerun_text)


def run_quota(cluster: Cluster, args: argparse.Namespace) -> None:
    print_json_or(cluster.quota(), args.json, quota_text)


def run_usage(cluster: Cluster, args: argparse.Namespace) -> None:
    from tcloud.jobs import usage  # lazy verb import

    report = cluster.usage(args.since, args.until, args.by)
    sys.stdout.write(usage.formatted(report, "json" if args.json else args.format))


def run_env(cluster: Cluster, args: argparse.Namespace) -> None:
    rows = [
        {
            "env": e["digest"],
            "requirements": " ".join(e["requirements"]),
            "python": e.get("python", ""),
            "locked": len(e.get("lock", [])),
            "image": str(e.get("image", ""))[:12],  # built on top of this image
            "built_by_job": e["built_by_job"],
            "path": e["path"],
        }
        for e in cluster.environments()
    ]
    columns = ("env", "requirements", "python", "locked", "image", "built_by_job", "path")
    print_rows(rows, args.json, columns)


def run_images(cluster: Cluster, args: argparse.Namespace) -> None:
    from tcloud.compile import images  # lazy verb import

    cached = cluster.images()
    if args.json:
        print(json.dumps(cached, indent=2))
        return
    print_rows(images.rows(cached), False, images.COLUMNS)


def run_download(cluster: Cluster, args: argparse.Namespace) -> None:
    job = cluster.job(args.job)
    dest = args.dest or Path(job.id)
    if not args.best:
        print(f"downloaded {job.download(dest)} file(s) to {dest}/")
        return
    count, best = job.download_best(dest)
    print(
        f"downloaded {count} file(s) of trial {best['job_id']}, the best "
        f"({best.get('metric', 'metric')} {best.get('value')} at rung {best.get('rung')}"
        f"/{best.get('rungs')}), to {dest}/"
    )


def run_shell(cluster: Cluster, args: argparse.Namespace) -> int:
    return cluster.job(args.job).shell(args.node)


def run_exec(cluster: Cluster, args: argparse.Namespace) -> int:
    from tcloud.jobs import interactive  # lazy verb import

    job = cluster.job(args.job)  # the job id checked before the command
    command = getattr(args, "remote_command", None) or []
    if not command:
        raise UsageError("exec: expected a command after `--` (tcloud exec JOB -- CMD ...)")
    writer = interactive.LineWriter(sys.stdout.buffer, sys.stderr.buffer)
    sys.stdout.flush()
    ranks = None if args.all else [args.node]
    results = interactive.execute(
        cluster.client, cluster.userdir, job.id, command, ranks, interactive.prefixed(writer)
    )
    code, failing = interactive.exit_code(results, args.all)
    for line in failing:
        print(line, file=sys.stderr)
    return code


def run_forward(cluster: Cluster, args: argparse.Namespace) -> int:
    from tcloud.jobs import portforward  # lazy verb import

    job = cluster.job(args.job)
    pairs = portforward.pairs_of(args.ports)  # checked before connecting
    return hold_forwards(cluster, job, pairs, args.node)


def hold_forwards(
    cluster: Cluster, job, pairs: list, rank: int, bound: Callable[[dict], None] | None = None
) -> int:
    """Forward until Ctrl-C (exit 0) or until the job ends (said, exit 0). `bound` is
    given {remote: local} once the local ports listen (a local 0 is a real port then)."""
    from tcloud.jobs import portforward  # lazy verb import

    node_host = {n["rank"]: n["host"] for n in job.target()["nodes"]}.get(rank, "?")
    try:
        with (
            portforward.stop_on_interrupt() as stop,
            job.forward({p.remote: p.local for p in pairs}, rank) as mapping,
        ):
            if bound is not None:
                bound(mapping)
            for remote, local in mapping.items():
                print(
                    f"forwarding 127.0.0.1:{local} -> {node_host}:{remote} (job {job.id}); "
                    "Ctrl-C stops",
                    flush=True,
                )
            portforward.hold(lambda: job_running(job), stop=stop)
    except KeyboardInterrupt:  # before the forward was up
        print("forwarding stopped", file=sys.stderr)
        return EXIT_OK
    if stop.is_set():
        print("forwarding stopped", file=sys.stderr)
    else:
        print(f"job {job.id} is no longer running: forwarding stopped", flush=True)
    return EXIT_OK


def job_running(job) -> bool:
    return job.status()["state"] not in FINAL_STATES


def run_dev(cluster: Cluster, args: argparse.Namespace) -> int:
    from tcloud.jobs import dev, portforward  # lazy verb import

    if args.detach and args.stop_on_disconnect:
        raise UsageError(
            "dev: --detach and --stop-on-disconnect exclude each other "
            "(a detached session has no connection to watch)"
        )
    asked = [portforward.parse_pair(text) for text in args.port]
    job = cluster.dev(
        args.path or Path("."),
        ports=[p.remote for p in asked],
        idle_timeout=args.idle,
        stop_on_disconnect=args.stop_on_disconnect,
        allow_outside=args.allow_outside,
    )
    print(f"submitted session {job.id}", flush=True)
    dev.wait_running(job, lambda line: print(line, flush=True))
    session = job.target().get("session") or {}
    pairs = dev.session_pairs(session.get("ports") or [p.remote for p in asked], asked)
    idle = session.get("idle_timeout") or args.idle

    def say_how_to_connect(mapping: dict[int, int]) -> None:
        """Said once the local ports listen: a local 0 is its real port by then."""
        bound = [portforward.PortPair(p.remote, mapping.get(p.remote, p.local)) for p in pairs]
        for line in dev.connect_text(job.id, bound, idle):
            print(line, flush=True)

    if args.detach or not pairs:
        say_how_to_connect({})
    if args.detach:
        return EXIT_OK
    with contextlib.ExitStack() as stack:
        if session.get("stop_on_disconnect", args.stop_on_disconnect):
            stack.enter_context(dev.stop_on_disconnect(cluster.client, cluster.userdir, job.id))
            print(f"  session {job.id} is cancelled when this command ends", flush=True)
        if pairs:
            return hold_forwards(cluster, job, pairs, 0, bound=say_how_to_connect)
        return job.shell(0)


def run_dashboard(cluster: Cluster, args: argparse.Namespace) -> int:
    from tcloud import dashboard  # lazy verb import

    with contextlib.suppress(KeyboardInterrupt):  # before the forward was up
        dashboard.serve(cluster, args.port, args.browser, say=lambda line: print(line, flush=True))
    print("dashboard stopped", file=sys.stderr)
    return EXIT_OK


def run_top(cluster: Cluster, args: argparse.Namespace) -> int:
    from tcloud.jobs import usage_view  # lazy verb import

    job = cluster.job(args.job)
    in_place = sys.stdout.isatty() and not args.json and not args.once
    previous = None
    shown = False
    try:
        while True:
            try:
                answer = job.usage()
            except TcloudError as exc:
                # After a frame, the agent refusing a job that is no longer running
                # means it ended between two answers: said, exit 0.
                ended = usage_view.ended_state(str(exc), job.id) if shown else None
                if ended is None or exc.exit_code != EXIT_CLUSTER:
                    raise
                print(f"job {job.id} ended ({ended})", flush=True)
                return EXIT_OK
            if args.once and previous is None and not args.json:
                previous = answer  # CPU% needs two answers
                time.sleep(1.0)
                continue
            if args.json:
                print(json.dumps(answer), flush=True)
            else:
                text = usage_view.frame(answer, previous)
                sys.stdout.write(usage_view.drawn(text, in_place))
                sys.stdout.flush()
            shown = True
            previous = answer
            if args.once or answer["state"] in FINAL_STATES:
                return EXIT_OK
            time.sleep(args.interval)
    except KeyboardInterrupt:
        return EXIT_OK


def run_upload(cluster: Cluster, args: argparse.Namespace) -> None:
    count = cluster.upload(args.local, args.remote)
    print(f"uploaded {count} file(s) to files/{args.remote or args.local.name}")


def run_ls(cluster: Cluster, args: argparse.Namespace) -> None:
    print_rows(cluster.ls(args.path or ""), args.json, ("name", "size", "mode"))


def run_cat(cluster: Cluster, args: argparse.Namespace) -> None:
    sys.stdout.buffer.write(cluster.cat(args.path))


def cmd_disconnect(args: argparse.Namespace) -> int:
    """Stop the connection master (like `ssh -O exit`); nothing to stop is no error."""
    from tcloud import config  # lazy verb import
    from tcloud.transport import mux  # lazy verb import

    if mux.stop(config.cluster(args.cluster)):
        print("stopped the shared connection")
    else:
        print("no shared connection was open")
    return EXIT_OK


def cmd_cluster(args: argparse.Namespace) -> int:
    """Every command that needs the cluster: the shared connection (tcloud.transport.mux) or one
    verified SSH connection of its own, opened once the command's arguments have been
    checked."""
    with open_cluster(args.cluster, files=args.command in FILE_COMMANDS) as cluster:
        code = CLUSTER_COMMANDS[args.command](cluster, args)
    return EXIT_OK if code is None else code


def grace_seconds(text: str) -> float:
    """--grace: 0 to 3600 seconds (the agent holds the SSH call that long at most)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0 to 3600 seconds, got {text!r}")
    return value


def interval_seconds(text: str) -> float:
    """--interval: 1 to 3600 seconds between two answers of `tcloud top` (each answer
    is a short step of the job on every node: no more than one a second)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 1 to 3600 seconds, got {text!r}")
    return value


def halt_text(result: dict) -> str:
    job = result["job_id"]
    again = f"`tcloud resume {job}` lets it run again"
    if not result.get("checkpoint_signal"):
        return f"job {job} was still queued: held; {again}"
    grace = f"{result.get('grace_seconds', 0):g} s"
    if result.get("exited_in_grace"):
        done = f"the program exited within the {grace} grace period after the checkpoint signal"
    else:
        done = (
            f"the program was still running {grace} after the checkpoint signal; Slurm stopped it"
        )
    return f"job {job}: {done}; halted and held; {again}"


def quota_text(info: dict) -> str:
    """`tcloud quota` for people: what runs now, then each account's limits."""
    lines = [
        f"{info['user']}: {info['running_jobs']} running job(s) holding "
        f"{info['gpus_in_use']} GPU(s), {info['pending_jobs']} pending"
    ]
    if not info.get("accounting"):
        lines.append(info.get("message", "no accounting on this cluster"))
        return "\n".join(lines)
    shares = {s["Account"].strip(): s for s in info.get("fairshare", [])}
    qos = {q["Name"]: q for q in info.get("qos", [])}
    for assoc in info.get("associations", []):
        share = shares.get(assoc["Account"], {})
        lines.append(
            f"account {assoc['Account']}: fair share {share.get('FairShare', '?')} "
            f"(shares {assoc['Fairshare']}, usage {share.get('EffectvUsage', '?')}), "
            f"QoS {assoc['QOS'] or '-'} (default {assoc['DefaultQOS'] or '-'})"
        )
    for name, q in sorted(qos.items()):
        limits = [f"{k} {q[k]}" for k in ("MaxTRESPU", "MaxJobsPU", "MaxWall") if q.get(k)]
        extra = f", preempts {q['Preempt']}" if q.get("Preempt") else ""
        factor = f", usage factor {q['UsageFactor']}" if q.get("UsageFactor") else ""
        lines.append(
            f"  qos {name}: priority {q['Priority']}, "
            f"{', '.join(limits) or 'no limits'}{extra}{factor}"
        )
    return "\n".join(lines)


COMMANDS = {
    "init": cmd_init,
    "validate": cmd_validate,
    "submit": cmd_submit,
    "config": cmd_config,
    "plugins": cmd_plugins,
    "disconnect": cmd_disconnect,
}
CLUSTER_COMMANDS = {
    "ps": run_ps,
    "status": run_status,
    "logs": run_logs,
    "cancel": run_cancel,
    "rerun": run_rerun,
    "halt": run_halt,
    "resume": run_resume,
    "upload": run_upload,
    "download": run_download,
    "ls": run_ls,
    "cat": run_cat,
    "env": run_env,
    "images": run_images,
    "quota": run_quota,
    "usage": run_usage,
    "shell": run_shell,
    "exec": run_exec,
    "forward": run_forward,
    "dev": run_dev,
    "top": run_top,
    "dashboard": run_dashboard,
}


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The arguments; for `exec`, the words after the first `--` are the remote
    command's, kept as they are (never read as tcloud's options)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    if cut < len(argv) and "exec" in argv[:cut]:
        before = parser.parse_args(argv[:cut])
        if before.command == "exec":
            before.remote_command = argv[cut + 1 :]
            return before
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parse(parser, sys.argv[1:] if argv is None else list(argv))
    if args.version:
        # Lazy: importlib.metadata (email, zipfile, csv) is 20-40 ms of every start.
        from importlib.metadata import PackageNotFoundError, version  # lazy verb import

        try:
            print(version("tacc-client"))
        except PackageNotFoundError:
            print("unknown")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command in CLUSTER_COMMANDS:
            return cmd_cluster(args)
        return COMMANDS[args.command](args)
    except TaccError as exc:
        print(f"tcloud: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tcloud: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `tcloud logs JOB | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug: one line, never a traceback
        print(f"tcloud: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
