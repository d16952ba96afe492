"""What tcloud does without a cluster: write a task file, list plug-ins, keep the
cluster list of tcloud's config (validate and dry_run are in tcloud.compile.tasks). Part of the
SDK (tcloud.sdk re-exports it); kept apart so that `tcloud --help`, `validate`, `init`
and `submit --dry-run` never load paramiko and the SSH stack."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tacc_contract.registry import PluginError, available, from_env, select
from tacc_contract.registry import describe as describe_plugins
from tacc_contract.schema import NAME, TASK_FILE
from tcloud import config
from tcloud.compile import tasks
from tcloud.compile.tasks import TaskLike
from tcloud.compile.template import render_template
from tcloud.errors import TcloudError, UsageError

PathLike = str | os.PathLike[str]


def init(path: PathLike = ".", name: str | None = None, force: bool = False) -> Path:
    """Write a commented tcloud.yaml (into PATH when it is a directory); its path."""
    path = Path(path)
    target = path / TASK_FILE if path.is_dir() or not path.suffix else path
    if target.exists() and not force:
        raise TcloudError(f"{target} exists; use --force to overwrite it")
    default = re.sub(r"[^A-Za-z0-9_.-]", "-", target.resolve().parent.name).strip("-.")
    name = name or default[:64] or "task"
    if not re.fullmatch(NAME, name):
        raise UsageError(f"--name {name!r}: expected a name of letters, digits, _.- (<= 64)")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(render_template(name))
    return target


def plugins(task: TaskLike | None = None, *, base_dir: PathLike | None = None) -> list[dict]:
    """Every plug-in, its layers and whether it is on (for this task's selection too)."""
    words = tasks.read(task, base_dir=base_dir).spec.plugins if task is not None else []
    try:
        return describe_plugins(available(), select(from_env(), task=words))
    except PluginError as exc:
        raise TcloudError(str(exc)) from None


def add_cluster(name: str, **settings: str | int | list[str] | None) -> config.Cluster:
    """Add or update a cluster of tcloud's config (host, user, port, key, proxy_jump,
    known_hosts, userdir, fallback_hosts); the first one added becomes the current one."""
    return config.set_cluster(name, settings)


def use_cluster(name: str) -> None:
    """Make NAME the current cluster."""
    config.use(name)


def clusters() -> list[dict]:
    """The clusters of tcloud's config, with which one is current."""
    return config.listing()
