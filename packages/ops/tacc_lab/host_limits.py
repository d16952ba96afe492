"""The host's kernel limits every lab node draws on, raised (never lowered) before nodes
boot. All nodes' systemd, journald and services run as the host's root, so they share
root's inotify instances: Debian's default of 128 ran out with five labs up at once on
Debian 13 nodes ("Failed to create control group inotify object: Too many open files"
as a node booted, and services that timed out starting)."""

from __future__ import annotations

from pathlib import Path

PROC_SYS = Path("/proc/sys")
# name under /proc/sys -> the least a host running several labs needs
MINIMUMS = {
    "fs/inotify/max_user_instances": 8192,
    "fs/inotify/max_user_watches": 524288,
}


def raise_host_limits(proc_sys: Path = PROC_SYS, log=print) -> list[str]:
    """Raise each of MINIMUMS that is lower on this host, until the next reboot (nothing
    is written to /etc/sysctl.d); the settings raised, as `name: old -> new` (logged).
    One that cannot be read or raised (a read-only /proc/sys) is logged as a warning and
    left as it is: the nodes may still boot."""
    raised = []
    for name, least in MINIMUMS.items():
        path = proc_sys / name
        try:
            now = int(path.read_text().split()[0])
            if now < least:
                path.write_text(f"{least}\n")
                raised.append(f"{name.replace('/', '.')}: {now} -> {least}")
        except (OSError, ValueError) as exc:
            log(
                f"warning: {path}: cannot read or raise it to {least} ({exc}); many nodes at "
                "once may fail to boot with 'Too many open files'"
            )
    if raised:
        log(f"raised host limits for the lab's nodes until reboot: {'; '.join(raised)}")
    return raised
