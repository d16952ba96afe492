"""Mounts: present in mountinfo with the expected type and options, and alive.

Liveness is a statfs() in a forked child with a deadline: a hung NFS server blocks the
child, never the agent. A mount whose probe is still blocked is reported "stuck" and not
probed again until that child has finished (the probe's pid is kept in the state dir).
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from tacc_agent.health.checks.base import FAIL, OK, STUCK, Result, read_state, write_state
from tacc_agent.health.registry import Check, CheckContext
from tacc_agent.procfs import processes
from tacc_agent.procfs.mounts import mount_table


def probe_alive(path: str, timeout: float) -> bool | int:
    """True if statfs(path) answered in time, else the pid of the still-blocked child."""
    pid = os.fork()
    if pid == 0:  # child: one syscall, then leave without any cleanup
        try:
            os.statvfs(path)
            os._exit(0)
        except BaseException:
            os._exit(1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.005)
    return pid


def pid_alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)  # ours: reap it if it finished
        return done == 0
    except ChildProcessError:
        return processes.exists(pid)


def check_mounts(expected: list[dict], proc_root: str, state_dir: str, timeout: float) -> Result:
    if not expected:
        return Result("mounts", OK, "no mounts configured")
    table = mount_table(proc_root)
    problems, stuck = [], []
    for want in expected:
        point = want["path"]
        mount = table.get(point)
        if mount is None:
            problems.append(f"{point} not mounted")
            continue
        if want.get("fstype") and mount.fstype != want["fstype"]:
            problems.append(f"{point} is {mount.fstype}, expected {want['fstype']}")
        missing = set(want.get("options", [])) - mount.options
        if missing:
            problems.append(f"{point} lacks options {','.join(sorted(missing))}")
        marker = Path(state_dir, f"stuck-{hashlib.sha256(point.encode()).hexdigest()[:12]}.json")
        previous = read_state(marker)
        if previous and pid_alive(previous["pid"]):
            stuck.append(f"{point} stuck (statfs blocked since {previous['since']:.0f})")
            continue
        marker.unlink(missing_ok=True)
        alive = probe_alive(point, timeout)
        if alive is True:
            continue
        if alive is False:
            problems.append(f"{point}: statfs failed")
            continue
        write_state(marker, {"pid": alive, "since": time.time()})
        stuck.append(f"{point} stuck (statfs did not answer within {timeout:g} s)")
    if stuck:
        return Result("mounts", STUCK, "; ".join(stuck + problems))
    if problems:
        return Result("mounts", FAIL, "; ".join(problems))
    return Result("mounts", OK, f"{len(expected)} mount(s) present and alive")


def run(ctx: CheckContext) -> Result:
    config = ctx.config
    return check_mounts(
        [dict(m) for m in config.mounts], config.proc_root, str(ctx.state_dir), ctx.timeout
    )


CHECK = Check("mounts", run)  # no figures of its own: its status is tacc_agent_check_status
