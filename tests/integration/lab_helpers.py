"""Helpers for tests that boot real lab nodes."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import threading
import time
from pathlib import Path

from tacc_lab.config import STATE_ROOT
from tacc_lab.image import FLAVOR_ENV
from tests.conftest import BIN, ROOT, run_cli
from tests.integration.labs import LINEAR, MITOGEN, SHAPES, flavor_env

# The playbooks a factory lab converges with mitogen_linear (labs.py says why).
CONVERGES = ("playbooks/site.yml", "playbooks/agent.yml", "playbooks/directory.yml")


def lab_cli(
    name: str, *argv: str, timeout: int = 900, flavor: str = ""
) -> subprocess.CompletedProcess:
    """tacc-lab on lab `name`, booting (and growing) it from its shape's image, or the
    nodes it adds from `flavor`'s."""
    env = {FLAVOR_ENV: flavor} if flavor else flavor_env(name)
    return run_cli("tacc-lab", "--name", name, *argv, env=env, timeout=timeout)


def lab_status(name: str) -> dict:
    proc = lab_cli(name, "status", "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def ansible_env(inventory: Path) -> dict[str, str]:
    """The repo's ansible.cfg, the venv's tools, and a fact cache private to this lab:
    labs reuse node names (n1, n2, ...), so a shared cache would hand one lab's facts
    to another."""
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(inventory.parent / "facts"),
        "PATH": f"{BIN}:{os.environ['PATH']}",
    }


def converge_strategy(inventory: Path, path: str) -> str:
    """The strategy `path` runs with on the lab of `inventory` (the factory keeps each
    shape's inventory in a folder named after it): mitogen_linear for a factory lab's
    converge, else linear."""
    return MITOGEN if inventory.parent.name in SHAPES and path in CONVERGES else LINEAR


def ansible_tool(
    tool: str, inventory: Path, *argv: str, timeout: int, strategy: str = LINEAR
) -> subprocess.CompletedProcess:
    """Run `ansible` or `ansible-playbook` from the venv against a lab inventory."""
    return subprocess.run(
        [str(BIN / tool), "-i", str(inventory), *argv],
        capture_output=True,
        text=True,
        env={**ansible_env(inventory), "ANSIBLE_STRATEGY": strategy},
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


def ansible(inventory: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return ansible_tool("ansible", inventory, *argv, timeout=timeout)


def failure_summary(proc: subprocess.CompletedProcess) -> str:
    """What went wrong in an ansible-playbook run, failing lines first (a CI log keeps
    only the head of an assertion message)."""
    bad = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith(("fatal:", "failed:", "ERROR!", "[ERROR]")) or "UNREACHABLE!" in line
    ]
    recap = proc.stdout[proc.stdout.rfind("PLAY RECAP") :] if "PLAY RECAP" in proc.stdout else ""
    tail = ["--- stderr ---", proc.stderr[-2000:], "--- tail ---", proc.stdout[-3000:]]
    return "\n".join([f"rc={proc.returncode}", *bad, recap, *tail])


def playbook(
    inventory: Path, path: str, *extra: str, expect_ok: bool = True, strategy: str = ""
) -> tuple[subprocess.CompletedProcess, dict[str, int]]:
    """Run an ansible-playbook (with `strategy`, else converge_strategy's); return the run
    and changed= per host from the recap."""
    strategy = strategy or converge_strategy(inventory, path)
    proc = ansible_tool(
        "ansible-playbook", inventory, path, *extra, timeout=1200, strategy=strategy
    )
    if expect_ok:
        assert proc.returncode == 0, failure_summary(proc)
    changed = {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^(\S+)\s+: ok=\d+\s+changed=(\d+)", proc.stdout, re.M)
    }
    return proc, changed


def site(
    inventory: Path, *extra: str, strategy: str = ""
) -> tuple[subprocess.CompletedProcess, dict[str, int]]:
    """Run playbooks/site.yml; it must succeed."""
    return playbook(inventory, "playbooks/site.yml", *extra, strategy=strategy)


def node_sh(name: str, node: str, script: str) -> subprocess.CompletedProcess:
    # One command line for the node's shell, as with ssh: the script quoted for sh -c.
    return lab_cli(name, "ssh", node, shlex.join(["sh", "-c", script]), timeout=120)


def node_ok(name: str, node: str, script: str) -> str:
    """node_sh that must succeed: its standard output."""
    proc = node_sh(name, node, script)
    assert proc.returncode == 0, f"{node}: {script}\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def node_address(name: str, node: str) -> str:
    return next(n["address"] for n in lab_status(name)["nodes"] if n["name"] == node)


def lab_ssh_as(
    name: str, user: str, node: str, command: str, *, key_of: str = ""
) -> subprocess.CompletedProcess:
    """`ssh USER@NODE COMMAND` from this machine with the lab researcher's own key (or
    `key_of`'s), verifying the node's host key."""
    lab_dir = STATE_ROOT / name
    argv = [
        "ssh",
        "-i",
        str(lab_dir / "users" / (key_of or user) / "id_ed25519"),
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={lab_dir / 'ssh/known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        f"{user}@{node_address(name, node)}",
        command,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def host_leftovers(name: str, state_dir: Path) -> list[str]:
    """Everything a lab could leave on the host; empty when down was complete."""
    found = []
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    for line in links.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0]
        if ifname == f"tacc-{name}" or ifname.startswith(f"vb-{name}-"):
            found.append(f"interface {ifname}")
    mounts = Path("/proc/self/mounts").read_text()
    found += [f"mount {m}" for m in mounts.split() if m.startswith(str(state_dir))]
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(state_dir) in cmdline:
                found.append(f"process {proc.name}: {cmdline[:80]}")
    if state_dir.exists():
        found.append(f"directory {state_dir}")
    return found


def changed_by_role(stdout: str) -> dict[str, int]:
    """changed results per role in an ansible-playbook log (default callback):
    each "changed: [host]" line counts for the role of the TASK/HANDLER above it."""
    counts: dict[str, int] = {}
    role = None
    for line in stdout.splitlines():
        match = re.match(r"^(?:TASK|RUNNING HANDLER) \[(?:([\w-]+) : )?", line)
        if match:
            role = match.group(1) or "(play)"
            continue
        if role and line.startswith("changed: ["):
            counts[role] = counts.get(role, 0) + 1
    return counts


def changed_tasks(stdout: str) -> set[tuple[str, str]]:
    """(task title, host) of every changed result in an ansible-playbook log; handlers
    are titled "HANDLER <name>"."""
    found: set[tuple[str, str]] = set()
    title = None
    for line in stdout.splitlines():
        match = re.match(r"^(TASK|RUNNING HANDLER) \[(.+?)\] \*+$", line)
        if match:
            title = match.group(2) if match.group(1) == "TASK" else f"HANDLER {match.group(2)}"
            continue
        host = re.match(r"^changed: \[([^\]]+)\]", line)
        if title and host:
            found.add((title, host.group(1)))
    return found


def site_killed_at(
    inventory: Path, marker: str, timeout: int = 1200, strategy: str = LINEAR
) -> str:
    """Run site.yml and SIGKILL it (and every process it started) the moment its output
    shows `marker` (e.g. a TASK header: the task before it has finished on every host):
    an operator's laptop dying mid-run. Returns the output up to the kill."""
    proc = subprocess.Popen(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), "playbooks/site.yml"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**ansible_env(inventory), "ANSIBLE_STRATEGY": strategy},
        cwd=ROOT,
        start_new_session=True,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    # Reading the output waits for as long as the run prints nothing: a run that hangs
    # (an apt download that never ends) is killed at `timeout`, which ends the output.
    watchdog = threading.Timer(timeout, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        for line in proc.stdout:
            lines.append(line)
            if marker in line:
                break
    finally:
        watchdog.cancel()
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    output = "".join(lines)
    assert marker in output, f"site.yml ended (rc={proc.returncode}) before {marker!r}"
    return output


# ---------------------------------------------------------------- tcloud jobs
def resumed_log(tcloud, job: str, seconds: int = 180) -> str:
    """The job's log once it shows a run that resumed from a checkpoint (the counter of
    CHECKPOINTING_COUNTER printing `start at N on HOST`, N > 0)."""
    log = ""
    deadline = time.monotonic() + seconds
    while not re.search(r"start at [1-9]\d* on", log):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(3)
        log = tcloud("logs", job).stdout
    return log


def submit(tcloud, project: Path) -> str:
    """Submit with a researcher's tcloud (a function of argv); the job id."""
    proc = tcloud("submit", "--json", str(project))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def status(tcloud, job: str) -> dict:
    proc = tcloud("status", "--json", job)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_state(tcloud, job: str, states: tuple[str, ...], seconds: int = 90) -> dict:
    """The job's status once it is in one of `states`; fails with its log's tail."""
    deadline = time.monotonic() + seconds
    while (info := status(tcloud, job))["state"] not in states:
        if time.monotonic() > deadline:
            log = tcloud("logs", job).stdout[-3000:]
            raise AssertionError(f"job {job} stuck in {info['state']}: {info}\n{log}")
        time.sleep(0.5)
    return info


# A job's program that counts seconds (to $UNTIL, default 100000) and saves its count at
# the checkpoint signal (SIGUSR1; rank 0 of a job on several nodes, written beside and
# renamed); with STOP_AT_CHECKPOINT=1 it then stops, else it goes on. A run started again
# (requeued) goes on from the saved count.
CHECKPOINTING_COUNTER = """
import os, pathlib, signal, socket, sys, time
saved = pathlib.Path(os.environ["TACC_WORKDIR"]) / "outputs" / "count"
count = int(saved.read_text()) if saved.exists() else 0
print(f"start at {count} on {socket.gethostname()}", flush=True)
def checkpoint(*_):
    if os.environ.get("SLURM_PROCID", "0") == "0":  # one rank saves, whole or not at all
        saved.parent.mkdir(exist_ok=True)
        partial = saved.with_name(f"count.{os.getpid()}")
        partial.write_text(str(count))
        os.replace(partial, saved)
    print(f"checkpoint {count}", flush=True)
    if os.environ.get("STOP_AT_CHECKPOINT") == "1":
        sys.exit(0)
signal.signal(signal.SIGUSR1, checkpoint)
while count < int(os.environ.get("UNTIL", "100000")):
    count += 1
    time.sleep(1)
print(f"done at {count}", flush=True)
"""
