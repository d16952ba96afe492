"""tcloud's Python SDK; the `tcloud` CLI is a thin layer over it (parsing and printing).

    from tcloud import Cluster

    with Cluster() as cluster:                  # the current cluster of `tcloud config`
        job = cluster.submit("examples/hello")  # a task file, its directory, or a dict
        for line in job.logs(follow=True):      # every node's lines, until the job ends
            print(line)
        print(job.wait()["state"])
        job.download("hello-outputs")

A Cluster opens one verified SSH session on first use and reuses it for every call
until `close()` (or the end of the `with` block). Errors are tcloud.errors exceptions
(TcloudError, and TaskFileError for a task's problems; `.exit_code` is the CLI's);
nothing here prints or exits. `validate` and `dry_run` need no cluster.
"""

from __future__ import annotations

import os
from contextlib import closing
from pathlib import Path

from tcloud import config, core
from tcloud.compile.tasks import DryRun, Task, TaskLike, dry_run, validate
from tcloud.core import JobTimeout, Submission
from tcloud.errors import TcloudError, UsageError
from tcloud.local import add_cluster, clusters, init, plugins, use_cluster
from tcloud.transfer import files
from tcloud.transport.link import Direct
from tcloud.transport.ssh import host_keys_known, session

__all__ = [
    "Cluster",
    "DryRun",
    "Job",
    "JobTimeout",
    "Submission",
    "Task",
    "TaskLike",
    "add_cluster",
    "clusters",
    "dry_run",
    "init",
    "plugins",
    "use_cluster",
    "validate",
]

PathLike = str | os.PathLike[str]


def cluster_path(relative: str, what: str = "path") -> str:
    """A path in the user's cluster directory as typed (relative, no '..'); UsageError
    (exit 2) otherwise."""
    try:
        return files.check_path(relative, what)
    except TcloudError as exc:
        raise UsageError(str(exc)) from None


def download_dest(dest: PathLike) -> Path:
    """Where a download goes: a directory, or a new one in a directory that exists."""
    dest = Path(dest)
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest}: exists and is not a directory")
    parent = dest.absolute().parent
    if not parent.is_dir():
        raise UsageError(f"{dest}: no such directory {parent}")
    return dest


def open_direct(settings: config.Cluster):
    """The direct SSH connection (looked up at each call, so a test may stand in for it)."""
    return session(settings)


class Cluster(core.Cluster):
    """One cluster of tcloud's config (`tcloud config add`; None: the current one, or
    $TCLOUD_CLUSTER). The config is read and the SSH session opened on first use; agent
    calls go through the shared connection master (tcloud.transport.mux) unless multiplex=False,
    TCLOUD_MULTIPLEX=0 or the cluster's `multiplex: false`."""

    def __init__(self, name: str | None = None, *, multiplex: bool = True) -> None:
        super().__init__(name, direct=Direct(open_direct, host_keys_known), multiplex=multiplex)

    # --- files in your cluster directory -------------------------------------------------

    def upload(self, local: PathLike, name: str | None = None) -> int:
        """Copy a local file or tree to files/<name> (default: its own name) in your
        cluster directory; how many files were sent."""
        local = Path(local)
        cluster_path(name if name is not None else local.name, "NAME")
        files.plan_upload(local, name)  # refused here, before connecting
        with closing(self.client.open_sftp()) as sftp:
            return files.upload(sftp, self.home(), local, name)

    def ls(self, path: str = "") -> list[dict]:
        """A directory of your cluster directory: name, size, mode of each entry."""
        cluster_path(path)
        with closing(self.client.open_sftp()) as sftp:
            return files.ls(sftp, self.home(), path)

    def cat(self, path: str) -> bytes:
        """A file of your cluster directory."""
        cluster_path(path)
        with closing(self.client.open_sftp()) as sftp:
            return files.cat(sftp, self.home(), path)


class Job(core.Job):
    """One of your jobs (a sweep, or one trial of it as 1234_5) on a Cluster."""

    def download(self, dest: PathLike | None = None, *, best: bool = False) -> int:
        """Its outputs/ and logs/ (a whole sweep's: each trial's, into dest/trials/<i>/)
        into dest (default: ./<job id>); how many files were fetched. `best`: a sweep's
        best trial only (the highest rung, the best value there), into dest."""
        if best:
            return self.download_best(dest)[0]
        target = download_dest(dest if dest is not None else Path(self.id))
        info = self.status()
        with closing(self.cluster.client.open_sftp()) as sftp:
            return files.download_job(sftp, info, target)

    def download_best(self, dest: PathLike | None = None) -> tuple[int, dict]:
        """A sweep's best trial's outputs/ and logs/ into dest: (files fetched, the
        trial as `status` lists it: job_id, parameters, metric, value, rung). A
        UsageError, before anything is fetched, when it is not a sweep or no trial has
        reported its metric at a rung yet."""
        target = download_dest(dest if dest is not None else Path(self.id))
        info = self.status()
        files.best_trial(info)  # refused before a connection or a directory
        with closing(self.cluster.client.open_sftp()) as sftp:
            return files.download_best(sftp, info, target)


Cluster.job_class = Job
