"""`tcloud`: submit ML tasks to a TACC cluster over SSH.

Exit codes: 0 ok, 2 usage, 3 invalid task file, 4 cluster or connection error.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from tcloud import config
from tcloud.compiler import compile_task
from tcloud.errors import EXIT_OK, EXIT_USAGE, TcloudError
from tcloud.hashcache import HashCache
from tcloud.schema import TASK_FILE, find_task_file, load_task
from tcloud.ssh import run, session
from tcloud.template import render_template
from tcloud.upload import DEFAULT_USERDIR, upload


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
    p_submit = sub.add_parser("submit", help="compile a task and submit it")
    p_submit.add_argument("path", nargs="?", type=Path)
    p_submit.add_argument(
        "--dry-run", action="store_true", help="print the digest and batch script; no cluster"
    )
    p_submit.add_argument("--json", action="store_true", help="machine-readable output")
    p_submit.add_argument("--cluster", help="cluster name (default: the current one)")
    p_config = sub.add_parser("config", help="clusters: add, use, ls")
    config_sub = p_config.add_subparsers(dest="config_command", required=True)
    p_add = config_sub.add_parser("add", help="add or update a cluster")
    p_add.add_argument("name")
    p_add.add_argument("--host", help="login node address or ~/.ssh/config alias")
    p_add.add_argument("--user")
    p_add.add_argument("--port", type=int)
    p_add.add_argument("--key", help="private key file (default: ssh-agent, ~/.ssh/config)")
    p_add.add_argument("--proxy-jump", dest="proxy_jump", help="[user@]jumphost[:port]")
    p_add.add_argument("--known-hosts", dest="known_hosts", help="extra known_hosts file")
    p_add.add_argument("--userdir", help="your directory on the cluster (default ~/tcloud)")
    p_use = config_sub.add_parser("use", help="make NAME the current cluster")
    p_use.add_argument("name")
    p_ls = config_sub.add_parser("ls", help="list clusters")
    p_ls.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def cmd_init(args: argparse.Namespace) -> int:
    target = args.path / TASK_FILE if args.path.is_dir() or not args.path.suffix else args.path
    if target.exists() and not args.force:
        raise TcloudError(f"{target} exists; use --force to overwrite it")
    default = re.sub(r"[^A-Za-z0-9_.-]", "-", target.resolve().parent.name).strip("-.")
    name = args.name or default or "task"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template(name))
    print(f"wrote {target}; edit it, then `tcloud validate` and `tcloud submit`")
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    path = find_task_file(args.path)
    task = load_task(path)
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


def submit_to_cluster(args: argparse.Namespace, task, instruction) -> int:
    cluster = config.cluster(args.cluster)
    with session(cluster) as client:
        result = upload(client, task, instruction, cluster.userdir or DEFAULT_USERDIR)
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={result.workdir}",
            f"--export=ALL,TACC_WORKDIR={result.workdir},TACC_USERDIR={result.userdir}",
            f"{result.workdir}/job.sh",
        ]
        rc, out, err = run(client, argv)
    if rc != 0:
        raise TcloudError(f"sbatch failed: {err.strip()}")
    job = out.strip().split(";")[0]
    summary = {
        "job": job,
        "name": task.name,
        "digest": instruction.digest,
        "workdir": result.workdir,
        "blobs_sent": result.blobs_sent,
        "bytes_sent": result.bytes_sent,
        "upload_seconds": round(result.seconds, 3),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"submitted job {job} ({task.name}); sent {result.blobs_sent} file(s), "
            f"{result.bytes_sent} bytes; workdir {result.workdir}"
        )
    return EXIT_OK


def cmd_submit(args: argparse.Namespace) -> int:
    path = find_task_file(args.path)
    task = load_task(path)
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
            "script": instruction.script,
            "manifest": instruction.manifest_json(),
        }
        print(json.dumps(payload, indent=2, sort_keys=True))
        return EXIT_OK
    print(f"digest: {instruction.digest}")
    print(f"files: {len(instruction.manifest)} ({size} bytes)")
    print("--- batch script ---")
    print(instruction.script, end="")
    return EXIT_OK


COMMANDS = {"init": cmd_init, "validate": cmd_validate, "submit": cmd_submit, "config": cmd_config}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        try:
            print(version("tacc-stack"))
        except PackageNotFoundError:
            print("unknown")
        return EXIT_OK
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except TcloudError as exc:
        print(f"tcloud: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tcloud: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
