"""Jinja filter: the inventory host that serves the users' workspace over NFS, and the
workspace's path on that host.

With root_squash (the nfs_server role's default) root on an NFS client is `nobody` on the
export, so a login node cannot create and chown /shared/tcloud/<user>: the role creates
those directories on the server itself, at the export's path.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath


def tacc_workspace_server(
    workspace: str, mounts: Iterable[Mapping], inventory_hosts: Iterable[str]
) -> dict[str, str]:
    """{"host": server, "path": workspace on the server} for the NFS mount (src
    "server:/export", path) that holds `workspace`, the deepest one when mounts nest;
    {} when none does or its server is not an inventory host."""
    where = PurePosixPath(workspace)
    hosts = set(inventory_hosts)
    best: tuple[PurePosixPath, str, str] | None = None
    for mount in mounts:
        mount_path = PurePosixPath(str(mount.get("path", "")))
        server, colon, export = str(mount.get("src", "")).partition(":")
        if not colon or server not in hosts or not export.startswith("/"):
            continue
        if where != mount_path and mount_path not in where.parents:
            continue
        if best is None or len(mount_path.parts) > len(best[0].parts):
            best = (mount_path, server, export)
    if best is None:
        return {}
    mount_path, server, export = best
    return {"host": server, "path": str(PurePosixPath(export) / where.relative_to(mount_path))}


class FilterModule:
    def filters(self) -> dict:
        return {"tacc_workspace_server": tacc_workspace_server}
