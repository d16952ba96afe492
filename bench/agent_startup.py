#!/usr/bin/env python3
"""Python starts on a user's wait (issue [23]): how long the agent's entry points take to
start on a lab node, and `tcloud`'s on this machine, at an older commit and at this
checkout, side by side.

Every submit starts the agent twice on a compute node (the batch step, then each rank's
wrapper: `tacc-agent batch|exec JOBDIR`); `tcloud exec` and `shell` start it on the login
node (`job attach`) and again on the node (`enter`); each forwarded connection starts it
on the login node (`job connect`) and on the node (`relay`). What each of those imports
before it does anything is measured here as a `python3 -I -c "import ..."` of the same
modules, with the node's own agent venv and interpreter:

  new - the agent installed on the node (the tacc_agent role, from this checkout); where
        the new way starts no Python at all (exec/shell on the login node), 0;
  old - the same three packages (agent, contract, plugins) at --before (default HEAD~1),
        `git archive`d into /tmp/agent-startup/REF on the node, first on sys.path.

`tcloud`: `import tcloud.cli` with this checkout's venv, old from a `git archive` of the
client and contract packages first on sys.path. Each case runs --runs times per side, the
sides taking turns, after two unmeasured runs each (byte-code caches warm). Prints the
median and min of each, and new / old.

Usage: .venv/bin/python -u bench/agent_startup.py [--lab bench] [--node n2] [--runs 15]
       [--before REF] [--json PATH]
Needs the lab up and converged (site.yml) with this checkout's agent.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from benchlib import BIN, ROOT, Record, add_json_argument

AGENT_PYTHON = "/opt/tacc-agent/venv/bin/python3"
AGENT_CLI = ["tacc_agent.cli"]
ATTACH = [*AGENT_CLI, "tacc_agent.tasks.interactive.attach"]
# case -> (old's modules, new's modules; None: the new way starts no Python there)
CASES: dict[str, tuple[list[str], list[str] | None]] = {
    "interpreter alone (`python3 -I -c pass`)": ([], []),
    "batch step and each rank's wrapper (`batch`/`exec JOBDIR`)": (
        [*AGENT_CLI, "tacc_agent.tasks.execute.launch"],
        [*AGENT_CLI, "tacc_agent.tasks.execute.launch"],
    ),
    "exec/shell, on the login node: `job attach` (new: tcloud runs the step itself)": (
        ATTACH,
        None,
    ),
    "exec/shell, on the node: `enter` (new: its quick way, a job without an image)": (
        ATTACH,
        ["tacc_agent.tasks.interactive.quick_enter"],
    ),
    "forward: `job connect` on the login node": (
        [*AGENT_CLI, "tacc_agent.tasks.interactive.connect"],
        [*AGENT_CLI, "tacc_agent.tasks.interactive.connect"],
    ),
    "forward: `relay` on the node": (
        [*AGENT_CLI, "tacc_agent.tasks.interactive.relay"],
        [*AGENT_CLI, "tacc_agent.tasks.interactive.relay"],
    ),
}
NODE_SCRIPT = r"""
import json, subprocess, sys, time
python, root, runs, cases = sys.argv[1], sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4])
def code(modules, old):
    head = f"import sys; sys.path.insert(0, {root!r}); " if old else ""
    return head + ("; ".join(f"import {m}" for m in modules) or "pass")
out = {}
for name, (old, new) in cases.items():
    sides = {"old": code(old, True)}
    if new is not None:
        sides["new"] = code(new, False)
    times = {"old": [], "new": [0.0] * runs if new is None else []}
    for round_ in range(runs + 2):
        for side, text in sides.items():
            start = time.perf_counter()
            subprocess.run([python, "-I", "-c", text], check=True)
            if round_ >= 2:
                times[side].append(time.perf_counter() - start)
    out[name] = times
print(json.dumps(out))
"""


def lab_ssh(lab: str, node: str, command: str, stdin: bytes | None = None) -> bytes:
    argv = [str(BIN / "tacc-lab"), "--name", lab, "ssh", node, command]
    proc = subprocess.run(argv, input=stdin, capture_output=True, check=False, timeout=1800)
    if proc.returncode != 0:
        sys.exit(f"bench: `{shlex.join(argv)}` failed:\n{proc.stderr.decode()[-2000:]}")
    return proc.stdout


def archive(ref: str, paths: list[str]) -> bytes:
    argv = ["git", "-C", str(ROOT), "archive", "--format=tar", ref, *paths]
    return subprocess.run(argv, capture_output=True, check=True).stdout


def node_side(lab: str, node: str, ref: str, runs: int) -> dict[str, dict[str, list[float]]]:
    """The agent's cases on the node: old from `git archive`, new as installed."""
    root = f"/tmp/agent-startup/{ref}"
    packages = ["packages/agent/tacc_agent", "packages/contract/tacc_contract"]
    packages.append("packages/plugins/tacc_plugins")
    tar = archive(ref, packages)
    strip = "--strip-components=2"
    lab_ssh(lab, node, f"rm -rf {root} && mkdir -p {root} && tar -x -C {root} {strip}", tar)
    script = shlex.join(["python3", "-c", NODE_SCRIPT, AGENT_PYTHON, root, str(runs)])
    answer = lab_ssh(lab, node, f"{script} {shlex.quote(json.dumps(CASES))}")
    lab_ssh(lab, node, f"rm -rf {root}")
    return json.loads(answer)


def client_side(ref: str, runs: int) -> dict[str, list[float]]:
    """`import tcloud.cli` here: old from `git archive` first on sys.path, new as
    installed in this checkout's venv."""
    with tempfile.TemporaryDirectory() as tmp:
        tar = archive(ref, ["packages/client/tcloud", "packages/contract/tacc_contract"])
        subprocess.run(["tar", "-x", "-C", tmp, "--strip-components=2"], input=tar, check=True)
        sides = {
            "old": f"import sys; sys.path.insert(0, {tmp!r}); import tcloud.cli",
            "new": "import tcloud.cli",
        }
        times: dict[str, list[float]] = {"old": [], "new": []}
        for round_ in range(runs + 2):
            for side, text in sides.items():
                start = time.perf_counter()
                subprocess.run([sys.executable, "-I", "-c", text], check=True)
                if round_ >= 2:
                    times[side].append(time.perf_counter() - start)
        return times


def row(name: str, times: dict[str, list[float]]) -> dict:
    old, new = statistics.median(times["old"]), statistics.median(times["new"])  # new 0: none
    line = {
        "case": name,
        "old_median_s": round(old, 4),
        "old_min_s": round(min(times["old"]), 4),
        "new_median_s": round(new, 4),
        "new_min_s": round(min(times["new"]), 4),
        "ratio": round(new / old, 3) if old else None,
    }
    print(
        f"  {name}: old {old * 1000:.1f} ms (min {line['old_min_s'] * 1000:.1f}), "
        f"new {new * 1000:.1f} ms (min {line['new_min_s'] * 1000:.1f}), "
        f"new/old {line['ratio']}x",
        flush=True,
    )
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lab", default="bench")
    parser.add_argument("--node", default="n2")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--before", default="HEAD~1", help="the older commit (git ref)")
    add_json_argument(parser)
    args = parser.parse_args()
    before = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.before],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with Record(args.json, before=before, lab=args.lab, node=args.node) as record:
        print(f"agent on {args.node} of lab {args.lab}, old = {before}:", flush=True)
        rows = [row(n, t) for n, t in node_side(args.lab, args.node, before, args.runs).items()]
        print("tcloud on this machine:", flush=True)
        rows.append(row("`import tcloud.cli`", client_side(before, args.runs)))
        record["rows"] = rows
    return 0


if __name__ == "__main__":
    sys.exit(main())
