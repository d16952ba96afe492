#!/usr/bin/env python3
"""Client start-up (issue [11]): wall time of `tcloud --help` and `tcloud validate
examples/hello` before the split into five distributions and after, side by side, and
what `import tcloud.cli` loads (`python -X importtime`).

Installs compared:
  before        - the single tacc-stack distribution of an older commit (default cb9fef2,
                  the last before issue [11]): a git worktree with its own venv, made in a
                  temporary directory and removed at the end (or --before-venv PATH).
  after         - this checkout's .venv (`make venv`: all five distributions, editable).
  client alone  - tacc-contract, tacc-plugins and tacc-client pip-installed from this tree
                  into an empty venv, as on a laptop (--client-alone).
Each command runs N times per install, the installs taking turns (round-robin), after
two unmeasured runs each so byte-code caches are warm. Prints median and min, and the
ratio to `before` (below 1: faster).

Usage: .venv/bin/python -u bench/cli_startup.py [--runs 20] [--before-commit cb9fef2]
       [--before-venv PATH] [--client-alone] [--json PATH]
Needs no lab; the before venv and the client-alone venv are installed from the package
index (a minute or two).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

from benchlib import ROOT, Record, add_json_argument

EXAMPLE = ROOT / "examples" / "hello"
COMMANDS = {
    "tcloud --help": ["--help"],
    "tcloud validate examples/hello": ["validate", str(EXAMPLE)],
}
WARMUP = 2
TOP_IMPORTS = 8
CLIENT_DISTRIBUTIONS = ("contract", "plugins", "client")
WATCHED = ("ansible", "tacc_agent", "tacc_lab", "prometheus_client", "paramiko", "yaml")


def check(argv: list[str], what: str, cwd: Path = ROOT) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    if proc.returncode != 0:
        sys.exit(f"bench: {what} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")


def make_before(commit: str, work: Path, stack: ExitStack) -> Path:
    """A worktree of COMMIT with its own venv (the old single distribution, editable)."""
    tree = work / f"before-{commit}"
    check(["git", "worktree", "add", "--detach", str(tree), commit], f"git worktree {commit}")
    stack.callback(
        subprocess.run,
        ["git", "worktree", "remove", "--force", str(tree)],
        cwd=ROOT,
        capture_output=True,
        check=False,
    )
    check([sys.executable, "-m", "venv", str(tree / ".venv")], "venv (before)")
    print(f"installing {commit} into {tree}/.venv ...", flush=True)
    check([str(tree / ".venv/bin/pip"), "install", "-q", "-e", str(tree)], "pip (before)")
    return tree / ".venv"


def make_client_alone(work: Path) -> Path:
    """An empty venv with the client's three distributions, not editable."""
    venv = work / "client-alone"
    check([sys.executable, "-m", "venv", str(venv)], "venv (client alone)")
    sources = []
    for dist in CLIENT_DISTRIBUTIONS:
        target = work / "src" / dist
        shutil.copytree(
            ROOT / "packages" / dist,
            target,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
        )
        sources.append(str(target))
    print(f"installing the client alone into {venv} ...", flush=True)
    check([str(venv / "bin/pip"), "install", "-q", *sources], "pip (client alone)")
    return venv


class CommandFailed(Exception):
    """A measured command exited non-zero: its last line of error output."""


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise CommandFailed(f"exit {proc.returncode}: {last_line(proc.stderr)}")
    return seconds


def measure(venvs: dict[str, Path], runs: int) -> dict[str, dict[str, list[float] | str]]:
    """Seconds per run, per command and install; an install whose command fails gets the
    reason instead and is left out of the later rounds."""
    times: dict[str, dict[str, list[float] | str]] = {}
    for command, args in COMMANDS.items():
        times[command] = {label: [] for label in venvs}
        for round_ in range(WARMUP + runs):
            for label, venv in venvs.items():
                samples = times[command][label]
                if isinstance(samples, str):
                    continue
                try:
                    seconds = time_once([str(venv / "bin" / "tcloud"), *args])
                except CommandFailed as exc:
                    times[command][label] = str(exc)
                    continue
                if round_ >= WARMUP:
                    samples.append(seconds)
    return times


IMPORTTIME = re.compile(r"import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def import_profile(venv: Path) -> dict:
    """What `import tcloud.cli` loads: module count, total, the top entries by cumulative
    time (nested ones included), and which heavy or foreign packages are among them."""
    proc = subprocess.run(
        [str(venv / "bin/python"), "-X", "importtime", "-c", "import tcloud.cli"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if proc.returncode != 0:
        return {"error": last_line(proc.stderr)}
    rows = [
        {"module": m.group(4), "self_us": int(m.group(1)), "cumulative_us": int(m.group(2))}
        for m in map(IMPORTTIME.match, proc.stderr.splitlines())
        if m
    ]
    loaded = {row["module"].split(".")[0] for row in rows}
    total = next(row["cumulative_us"] for row in rows if row["module"] == "tcloud.cli")
    return {
        "modules": len(rows),
        "total_us": total,
        "top": sorted(rows, key=lambda row: -row["cumulative_us"])[:TOP_IMPORTS],
        "watched_loaded": [name for name in WATCHED if name in loaded],
    }


def summarize(values: list[float] | str) -> dict:
    if isinstance(values, str):
        return {"error": values}
    return {"median": statistics.median(values), "min": min(values), "n": len(values)}


def cell(summary: dict) -> str:
    if "error" in summary:
        return f"fails ({summary['error']})"
    return f"{summary['median']:.3f} ({summary['min']:.3f})"


def ratio(summary: dict, before: dict) -> str:
    if "error" in summary or "error" in before:
        return "-"
    return f"{summary['median'] / before['median']:.2f}x"


def print_tables(record: Record, labels: list[str]) -> None:
    load = " ".join(str(x) for x in record["load_average_before"])
    print(f"\nwall time, median (min) of {record['runs']} runs, seconds (load {load}):")
    header = ["command", *labels, *(f"{label} / before" for label in labels[1:])]
    print(" | ".join(header))
    for command, by_label in record["times"].items():
        cells = [cell(by_label[label]) for label in labels]
        ratios = [ratio(by_label[label], by_label["before"]) for label in labels[1:]]
        print(" | ".join([command, *cells, *ratios]))
    for label, profile in record["imports"].items():
        if "error" in profile:
            print(f"\n{label}: import tcloud.cli fails: {profile['error']}")
            continue
        print(
            f"\n{label}: import tcloud.cli loads {profile['modules']} modules in "
            f"{profile['total_us'] / 1000:.1f} ms (-X importtime); of "
            f"{', '.join(WATCHED)}: {', '.join(profile['watched_loaded']) or 'none'}"
        )
        for row in profile["top"]:
            print(f"  {row['cumulative_us'] / 1000:8.1f} ms  {row['module']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="measured runs per command")
    parser.add_argument("--before-commit", default="cb9fef2", help="the commit to compare")
    parser.add_argument("--before-venv", type=Path, help="an existing venv of that commit")
    parser.add_argument(
        "--client-alone", action="store_true", help="also a venv with the client alone"
    )
    add_json_argument(parser)
    args = parser.parse_args()
    with ExitStack() as stack, Record(args.json, runs=args.runs) as record:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="cli-startup-")))
        venvs = {
            "before": args.before_venv or make_before(args.before_commit, work, stack),
            "after": Path(sys.executable).parent.parent,
        }
        if args.client_alone:
            venvs["client alone"] = make_client_alone(work)
        record["installs"] = {label: str(venv) for label, venv in venvs.items()}
        record["before_commit"] = args.before_commit
        record["load_average_before"] = [round(x, 2) for x in os.getloadavg()]
        times = measure(venvs, args.runs)
        record["times"] = {
            command: {label: summarize(values) for label, values in by_label.items()}
            for command, by_label in times.items()
        }
        record["imports"] = {label: import_profile(venv) for label, venv in venvs.items()}
        print_tables(record, list(venvs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
