"""tcloud: submit, watch and fetch ML jobs on a TACC cluster over SSH, as the `tcloud`
CLI and as a Python SDK (tcloud.sdk; the CLI is a thin layer over it):

    from tcloud import Cluster

    with Cluster() as cluster:
        job = cluster.submit("examples/hello")
        print(job.wait()["state"])

The SDK's names load with their first use (PEP 562), so that importing one of tcloud's
own modules (tcloud.errors, tcloud.config, tcloud.compile.task_file) does not load paramiko and
the SSH stack with it.
"""

from __future__ import annotations

import importlib

from tcloud.errors import TaskFileError, TcloudError, UsageError

SDK_NAMES = ("Cluster", "DryRun", "Job", "JobTimeout", "Submission", "Task", "dry_run", "validate")
__all__ = [*SDK_NAMES, "TaskFileError", "TcloudError", "UsageError"]


def __getattr__(name: str) -> object:
    if name in SDK_NAMES:
        sdk = importlib.import_module("tcloud.sdk")  # lazy SDK import
        return getattr(sdk, name)
    raise AttributeError(f"module 'tcloud' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *SDK_NAMES])
