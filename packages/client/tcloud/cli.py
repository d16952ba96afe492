"""`tcloud`: submit ML tasks to a TACC cluster over SSH.

Exit codes: 0 ok, 1 internal error (a bug), 2 usage, 3 invalid task file, 4 cluster or
connection error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from contextlib import closing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.tasks.schedule import sbatch_argv
from tacc_contract.instruction import parse
from tacc_contract.registry import PluginError, available, from_env, select
from tacc_contract.registry import describe as describe_plugins
from tacc_contract.schema import NAME, TASK_FILE
from tacc_plugins.sweep import trials_of

from tcloud import config, files, jobs, local_paths
from tcloud.agent import call
from tcloud.compiler import compile_task
from tcloud.errors import (
    EXIT_INTERNAL,
    EXIT_INVALID_TASK,
    EXIT_OK,
    EXIT_USAGE,
    TaccError,
    TcloudError,
    UsageError,
)
from tcloud.hashcache import HashCache
from tcloud.ssh import session
from tcloud.task_file import find_task_file, load_task, local_path_fields
from tcloud.template import render_template
from tcloud.upload import upload


def count(text: str) -> int:
    """argparse type: a whole number >= 0."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return int(text)


def port(text: str) -> int:
    """argparse type: a TCP port."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
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
        local_paths.ALLOW_FLAG, dest="allow_outside", action="store_true",
        help="let code.workdir and datasets[].local name paths outside the task's directory "
        "(places of secrets such as ~/.ssh are refused still)",
    )  # fmt: skip


def add_cluster_commands(sub) -> None:
    def command(name: str, text: str, *, listing: bool = False):
        p = sub.add_parser(name, help=text)
        p.add_argument("--cluster", help="cluster name (default: the current one)")
        if listing:
            p.add_argument("--json", action="store_true", help="machine-readable output")
        return p

    command("ps", "your jobs, newest first", listing=True)
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
        "--grace", type=grace_seconds, metavar="SECONDS",
        help="how long the program may take to checkpoint and exit (default: the cluster's)",
    )  # fmt: skip
    command("resume", "let a halted job run again").add_argument("job")
    command(
        "rerun", "submit a past job again: the same files and the same locked versions",
        listing=True,
    ).add_argument("job")  # fmt: skip
    p_up = command("upload", "copy local files to your cluster directory (files/)")
    p_up.add_argument("local", type=Path)
    p_up.add_argument("remote", nargs="?", help="name under files/ (default: the local name)")
    p_down = command("download", "fetch a job's outputs/ and logs/ (a sweep's: by trial)")
    p_down.add_argument("job")
    p_down.add_argument("dest", nargs="?", type=Path, help="local directory (default: ./JOB)")
    command("ls", "list your cluster directory", listing=True).add_argument("path", nargs="?")
    command("cat", "print a file from your cluster directory").add_argument("path")
    command("quota", "your limits, fair share and usage on the cluster", listing=True)
    p_env = command("env", "cached environments", listing=True)
    p_env.add_argument("action", choices=["ls"])


def cmd_init(args: argparse.Namespace) -> int:
    target = args.path / TASK_FILE if args.path.is_dir() or not args.path.suffix else args.path
    if target.exists() and not args.force:
        raise TcloudError(f"{target} exists; use --force to overwrite it")
    default = re.sub(r"[^A-Za-z0-9_.-]", "-", target.resolve().parent.name).strip("-.")
    name = args.name or default[:64] or "task"
    if not re.fullmatch(NAME, name):
        raise UsageError(f"--name {name!r}: expected a name of letters, digits, _.- (<= 64)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template(name))
    print(f"wrote {target}; edit it, then `tcloud validate` and `tcloud submit`")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    path = find_task_file(args.path)
    task = load_task(path, allow_outside=args.allow_outside)
    check_locally(path, task)
    if args.json:
        print(json.dumps({"file": str(path), "valid": True, "name": task.name}))
    else:
        print(f"{path}: valid task {task.name!r}")
    return EXIT_OK


def cmd_config(args: argparse.Namespace) -> int:
    if args.config_command == "add":
        fields = ("host", "user", "port", "key", "proxy_jump", "known_hosts", "userdir")
        entry = config.set_cluster(args.name, {f: getattr(args, f) for f in fields})
        print(f"cluster {entry.name!r}: {entry.user or '(ssh config)'}@{entry.host}")
    elif args.config_command == "use":
        config.use(args.name)
        print(f"current cluster: {args.name}")
    else:
        rows = config.listing()
        if args.json:
            print(json.dumps(rows, indent=2))
        for row in [] if args.json else rows:
            mark = "*" if row["current"] else " "
            print(f"{mark} {row['name']:<12} {row['user'] or '-'}@{row['host']}")
    return EXIT_OK


def local_sbatch(path: Path, task) -> list[str]:
    """The sbatch line as the cluster will build it: sbatch options a task may not set
    are refused here, before anything is uploaded (exit 3)."""
    try:
        return sbatch_argv(task, Path("$TACC_WORKDIR"), AgentConfig())
    except AgentError as exc:
        field = getattr(exc, "field", "")
        error = TcloudError(f"{path}: {field}: {exc}" if field else f"{path}: {exc}")
        error.exit_code = EXIT_INVALID_TASK
        raise error from None


def unhashed(_path: Path, _stat: os.stat_result) -> str:
    """A hasher for checks that need the manifest's files but not their contents."""
    return ""


def check_locally(path: Path, task) -> list[str]:
    """Everything submit refuses before connecting, for validate and submit alike: the
    task's sbatch options as written and after the compile passes (exit 3). Returns the
    sbatch line as the cluster will read the task (after the compile passes, which do not
    depend on the files' contents)."""
    local_sbatch(path, task)
    compiled = parse(json.dumps(compile_task(task, unhashed).document), "instruction")
    return local_sbatch(path, compiled)


def submit_to_cluster(args: argparse.Namespace, task, instruction) -> int:
    cluster = config.cluster(args.cluster)
    with session(cluster) as client:
        # An impossible task (unknown partition, more GPUs than any node has) is refused
        # in the first round trip, before anything is uploaded.
        result = upload(client, instruction, cluster.userdir, submit=True)
    if not result.job:
        raise TcloudError("the cluster's tacc-agent did not submit the job (is it up to date?)")
    answer = result.job
    summary = {
        "job_id": answer["job_id"],
        "name": task.name,
        "partition": answer["partition"],
        "digest": instruction.digest,
        "workdir": result.workdir,
        "blobs_sent": result.blobs_sent,
        "bytes_sent": result.bytes_sent,
        "upload_seconds": round(result.seconds, 3),
        "plugins": {**instruction.document["plugins"]["shaped"], **answer.get("plugins", {})},
        "outside_paths": outside_paths(task),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"submitted job {answer['job_id']} ({task.name}) to partition "
            f"{answer['partition']}; sent {result.blobs_sent} file(s), {result.bytes_sent} "
            f"bytes; workdir {result.workdir}"
        )
        for name, what in sorted(summary["plugins"].items()):
            print(f"  plug-in {name}: {what}")
        print_outside(task)
    return EXIT_OK


def check_sweep_flag(path: Path, task, sweep: bool) -> None:
    """A sweep can start many jobs: it runs only when asked for with --sweep."""
    trials = len(trials_of(task))
    if trials and not sweep:
        error = TcloudError(
            f"{path}: sweep: this task is a sweep of {trials} trial(s); submit it with "
            "--sweep to run them (one Slurm job array), or remove the sweep section"
        )
        error.exit_code = EXIT_INVALID_TASK
        raise error
    if sweep and not trials:
        error = TcloudError(f"{path}: --sweep given, but the task file has no sweep section")
        error.exit_code = EXIT_INVALID_TASK
        raise error


def cmd_plugins(args: argparse.Namespace) -> int:
    task_words = load_task(find_task_file(args.path)).plugins if args.path else []
    try:
        rows = describe_plugins(available(), select(from_env(), task=task_words))
    except PluginError as exc:
        raise TcloudError(str(exc)) from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    for row in rows:
        state = "on " if row["on"] else "off"
        policy = " (cluster policy)" if row["policy"] else ""
        print(f"{state} {row['name']:<10} {'/'.join(row['layers']):<24} {row['summary']}{policy}")
    return EXIT_OK


def outside_paths(task) -> list[str]:
    """The local paths the task uploads from outside its directory (--allow-outside-paths)."""
    texts = [text for _, text in local_path_fields(task)]
    return [str(path) for path in local_paths.outside(task.base_dir, texts)]


def print_outside(task) -> None:
    for path in outside_paths(task):
        print(f"  uploads from outside the task's directory: {path}")


def cmd_submit(args: argparse.Namespace) -> int:
    path = find_task_file(args.path)
    task = load_task(path, allow_outside=args.allow_outside)
    check_sweep_flag(path, task, args.sweep)
    # As the cluster will read it (after the compile passes); the cluster's scheduling
    # plug-ins (shards, node ranges, arrays, predicted limits) shape it further.
    sbatch = check_locally(path, task)
    if not args.dry_run:
        with HashCache() as hasher:
            instruction = compile_task(task, hasher)
        return submit_to_cluster(args, task, instruction)
    instruction = compile_task(task)
    size = sum(entry.size for entry in instruction.manifest.values())
    if args.json:
        payload = {
            "digest": instruction.digest,
            "files": len(instruction.manifest),
            "bytes": size,
            "sbatch": sbatch,
            "instruction": instruction.document,
            "outside_paths": outside_paths(task),
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"digest: {instruction.digest}")
    print(f"files: {len(instruction.manifest)} ({size} bytes)")
    print_outside(task)
    print(f"sbatch (before the cluster's scheduling plug-ins): {shlex.join(sbatch)}")
    print("--- instruction.json ---")
    print(json.dumps(instruction.document["task"], indent=2, sort_keys=True))
    return EXIT_OK


def print_rows(rows: list[dict], as_json: bool, columns: tuple[str, ...]) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    widths = {c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        print("  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns).rstrip())


def check_cluster_args(args: argparse.Namespace) -> None:
    """What can be refused before connecting: job ids, paths, the upload's files."""
    for job in [args.job] if hasattr(args, "job") else getattr(args, "jobs", []):
        jobs.check_ids([job])
    if args.command == "upload":
        files.plan_upload(args.local, args.remote)
    if args.command in ("ls", "cat") and args.path:
        files.check_path(args.path)


def cmd_cluster(args: argparse.Namespace) -> int:
    """Every command that needs the cluster: one verified SSH connection each."""
    check_cluster_args(args)
    cluster = config.cluster(args.cluster)
    userdir = cluster.userdir
    with session(cluster) as client:
        if args.command == "ps":
            print_rows(jobs.ps(client, userdir), args.json, jobs.PS_FIELDS)
        elif args.command == "status":
            info = jobs.status(client, userdir, args.job)
            if args.json:
                print(json.dumps(info, indent=2))
            else:
                jobs.describe(info)
        elif args.command == "logs":
            return jobs.logs(client, userdir, args.job, args.follow, args.tail, args.node)
        elif args.command == "cancel":
            for row in jobs.cancel(client, userdir, args.jobs):
                done = "cancelled" if row["cancelled"] else f"already {row['state']}"
                print(f"job {row['job_id']}: {done}")
        elif args.command == "halt":
            print(halt_text(jobs.halt(client, userdir, args.job, args.grace)))
        elif args.command == "resume":
            jobs.resume(client, userdir, args.job)
            print(f"job {args.job} released")
        elif args.command == "rerun":
            answer = jobs.rerun(client, userdir, args.job)
            print(json.dumps(answer, indent=2) if args.json else jobs.rerun_text(answer))
        elif args.command == "quota":
            info = call(client, ["quota"], userdir)
            print(json.dumps(info, indent=2) if args.json else quota_text(info))
        elif args.command == "env":
            rows = [
                {"env": e["digest"], "requirements": " ".join(e["requirements"]),
                 "python": e.get("python", ""), "locked": len(e.get("lock", [])),
                 "built_by_job": e["built_by_job"], "path": e["path"]}
                for e in call(client, ["env"], userdir)
            ]  # fmt: skip
            columns = ("env", "requirements", "python", "locked", "built_by_job", "path")
            print_rows(rows, args.json, columns)
        elif args.command == "download":
            info = jobs.status(client, userdir, args.job)
            dest = args.dest or Path(args.job)
            with closing(client.open_sftp()) as sftp:
                count = files.download_job(sftp, info, dest)
            print(f"downloaded {count} file(s) to {dest}/")
        else:
            home = call(client, ["whoami"], userdir)["userdir"]
            with closing(client.open_sftp()) as sftp:
                sftp_command(args, sftp, home)
    return EXIT_OK


def grace_seconds(text: str) -> float:
    """--grace: 0 to 3600 seconds (the agent holds the SSH call that long at most)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0 to 3600 seconds, got {text!r}")
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
        done = (f"the program was still running {grace} after the checkpoint signal; "
                "Slurm stopped it")  # fmt: skip
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
        lines.append(f"  qos {name}: priority {q['Priority']}, "
                     f"{', '.join(limits) or 'no limits'}{extra}{factor}")  # fmt: skip
    return "\n".join(lines)


def sftp_command(args: argparse.Namespace, sftp, userdir: str) -> None:
    if args.command == "upload":
        count = files.upload(sftp, userdir, args.local, args.remote)
        print(f"uploaded {count} file(s) to files/{args.remote or args.local.name}")
    elif args.command == "ls":
        print_rows(files.ls(sftp, userdir, args.path or ""), args.json, ("name", "size", "mode"))
    else:
        sys.stdout.buffer.write(files.cat(sftp, userdir, args.path))


COMMANDS = {
    "init": cmd_init,
    "validate": cmd_validate,
    "submit": cmd_submit,
    "config": cmd_config,
    "plugins": cmd_plugins,
}
CLUSTER_COMMANDS = (
    "ps",
    "status",
    "logs",
    "cancel",
    "rerun",
    "halt",
    "resume",
    "upload",
    "download",
    "ls",
    "cat",
    "env",
    "quota",
)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
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
    except Exception as exc:  # a bug: one line, never a traceback
        print(f"tcloud: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
