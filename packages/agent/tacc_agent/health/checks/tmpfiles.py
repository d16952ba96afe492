"""What departed users left in the job tmp dirs (issue [10], point 18). A job that fills
/tmp and ends would otherwise keep its node drained by the disk check until someone
cleans up. When a watched filesystem runs low, the disk check removes the files there of
every regular user (UID 1000 and up) who has neither a process nor a Slurm job on this
node: what is left cannot belong to a running job. Nothing is removed when either list
cannot be read. The walk holds each directory open and never follows a symbolic link
nor crosses into another filesystem."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Collection
from contextlib import suppress
from dataclasses import dataclass

from tacc_agent import slurm
from tacc_agent.procfs.processes import process_uids

FIRST_USER_UID = 1000  # Debian's UID_MIN: below it, system accounts
NOBODY = 65534
MAX_DEPTH = 64  # deeper directories are left alone (no unbounded recursion)
MAX_ENTRIES = 200_000  # one sweep looks at no more than this
# Job states during which a job holds its nodes.
HOLDING = "CONFIGURING,RUNNING,COMPLETING,SUSPENDED,STOPPED"


def job_uids(timeout: float, node: str = "") -> set[int] | None:
    """UIDs of the users with a job on this node (squeue); None when Slurm did not say."""
    return slurm.queue.uids_on_node(node or socket.gethostname(), HOLDING, timeout)


@dataclass
class Sweep:
    """One removal pass: whose files stay, and how much it did."""

    keep: Collection[int]
    removed: int = 0
    looked_at: int = 0

    def departed(self, uid: int) -> bool:
        return uid >= FIRST_USER_UID and uid != NOBODY and uid not in self.keep

    def directory(self, dir_fd: int, device: int, depth: int) -> None:
        with os.scandir(dir_fd) as listing:
            entries = list(listing)
        for entry in entries:
            self.looked_at += 1
            if self.looked_at > MAX_ENTRIES:
                return
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode):
                if info.st_dev == device and depth < MAX_DEPTH:
                    self.subdirectory(dir_fd, entry.name, info, depth)
            elif self.departed(info.st_uid):
                with suppress(OSError):
                    os.unlink(entry.name, dir_fd=dir_fd)
                    self.removed += 1

    def subdirectory(self, parent_fd: int, name: str, info: os.stat_result, depth: int) -> None:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent_fd)
        except OSError:
            return
        try:
            opened = os.fstat(fd)
            if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                return  # replaced since it was listed
            self.directory(fd, info.st_dev, depth + 1)
        finally:
            os.close(fd)
        if self.departed(info.st_uid):
            with suppress(OSError):  # not empty: something of a user who stays
                os.rmdir(name, dir_fd=parent_fd)
                self.removed += 1


def remove_leftovers(tmp_dirs: Collection[str], keep: Collection[int]) -> int:
    """Remove the entries below these directories owned by regular users not in `keep`;
    how many were removed. The directories themselves stay."""
    sweep = Sweep(keep)
    for top in tmp_dirs:
        try:
            fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            sweep.directory(fd, os.fstat(fd).st_dev, 0)
        finally:
            os.close(fd)
    return sweep.removed


def clean_departed(tmp_dirs: Collection[str], proc_root: str, timeout: float) -> str:
    """Remove departed users' leftovers from these tmp dirs; what was done, in words."""
    running = process_uids(proc_root)  # None: nobody can be called departed
    if running is None:
        return f"leftovers kept: no process readable under {proc_root}"
    holding = job_uids(timeout)
    if holding is None:
        return "leftovers kept: squeue did not say whose jobs run here"
    removed = remove_leftovers(tmp_dirs, running | holding)
    return f"removed {removed} leftover(s) of departed users from {', '.join(tmp_dirs)}"
