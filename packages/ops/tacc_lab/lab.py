"""Lab lifecycle: up (idempotent, grows by whole nodes), down (leaves nothing), status."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tacc_lab import backup_controller as backup_controllers
from tacc_lab import public_registry
from tacc_lab.addressing import LOGIN_INDEX, node_address, node_name
from tacc_lab.config import NODE_PACKAGE_CACHE, LabConfig
from tacc_lab.directory import (
    directory_dir,
    directory_vars,
    ensure_directory,
    has_directory,
    remove_directory,
)
from tacc_lab.errors import LabError
from tacc_lab.files import ensure_secret, write_private
from tacc_lab.host_limits import raise_host_limits
from tacc_lab.image import FLAVOR_ENV, ensure_image
from tacc_lab.inventory import (
    ContainerImage,
    InventoryNode,
    NodeHardware,
    groups_for,
    head_node,
    numbered_count,
    render_inventory,
)
from tacc_lab.network import bridge_exists, clear_stale_veth, ensure_bridge, remove_bridge
from tacc_lab.nodes import (
    Boot,
    NodePaths,
    configure_node,
    ensure_ssh_key,
    host_public_key,
    is_mounted,
    mount_overlay,
    node_alive,
    start_node,
    stop_node,
    wait_for_ssh,
    write_known_hosts,
)
from tacc_lab.oci_image import archive_path, ensure_oci_image
from tacc_lab.prereqs import check_prerequisites
from tacc_lab.processes import stop_process
from tacc_lab.proxy import proxy_alive, proxy_url, start_proxy, stop_proxy
from tacc_lab.releases import DEFAULT as DEFAULT_RELEASE
from tacc_lab.releases import Release, requested_release
from tacc_lab.researchers import LOCAL_USERS, ensure_researcher_keys
from tacc_lab.runner import run
from tacc_lab.state import LabState, NodeRecord, load_state, locked, save_state
from tacc_lab.wheels import host_find_links_wheels


@dataclass
class UpResult:
    started: list[str]
    image_build_seconds: float | None
    seconds: float
    container_image: ContainerImage | None = None
    container_image_build_seconds: float | None = None


def resolve_config(name: str, subnet: str | None, default_subnet: str) -> LabConfig:
    """A running lab keeps its subnet; a different explicit --subnet is an error."""
    probe = LabConfig.create(name, subnet or default_subnet)
    state = load_state(probe.state_file)
    if state is None:
        return probe
    if subnet is not None and probe.subnet != LabConfig.create(name, state.subnet).subnet:
        raise LabError(
            f"lab {name!r} already runs on {state.subnet}; run `tacc-lab down` before "
            f"changing --subnet to {subnet}"
        )
    return LabConfig.create(name, state.subnet)


def up(
    cfg: LabConfig,
    node_count: int,
    inventory_path: Path,
    log=print,
    *,
    login_node: bool | None = None,
    container_image: bool | None = None,
    release: Release | None = None,
    directory: bool | None = None,
    backup_controller: bool | None = None,
) -> UpResult:
    """Boot n1..n`node_count` (and the separate login node `login1` when `login_node`;
    None: yes from two nodes on, or as the lab already is). With `container_image` the
    lab's container image is built (once per machine) and the inventory seeds it into an
    image registry on n1 (None: as the lab already is; False: no containers). The nodes
    run `release` (None: TACC_LAB_OS, or as the lab already is, or releases.DEFAULT).
    With `directory` n1 runs the lab's LDAP directory and every node reads users from it
    (tacc_lab/directory.py; None: as the lab already is; False: none). With
    `backup_controller` the last numbered node also runs a backup slurmctld
    (tacc_lab/backup_controller.py; None: as the lab already is; False: none)."""
    if node_count < 1:
        raise LabError(f"--nodes must be at least 1, got {node_count}")
    check_prerequisites(container_image=bool(container_image))
    start = time.monotonic()
    with locked(cfg.state_dir):
        state = load_state(cfg.state_file) or LabState(subnet=str(cfg.subnet))
        have = numbered_count([node.index for node in state.nodes.values()])
        if node_count < have:
            raise LabError(
                f"lab {cfg.name!r} has {have} nodes; `up` only adds nodes "
                f"(asked for {node_count}). Run `tacc-lab down` first to start smaller."
            )
        has_login = any(node.index == LOGIN_INDEX for node in state.nodes.values())
        if login_node is False and has_login:
            raise LabError(
                f"lab {cfg.name!r} has a login node; `up` only adds nodes. "
                "Run `tacc-lab down` first to start without one."
            )
        if login_node is None:
            login_node = has_login or (not state.nodes and node_count >= 2)
        first = LOGIN_INDEX if login_node else 1
        # Validate every new address before touching the host.
        wanted = [
            NodeRecord(name=node_name(i), index=i, address=str(node_address(cfg.subnet, i)))
            for i in range(first, node_count + 1)
        ]
        release = _release_for(cfg, state, release)
        image, built = _image_for(cfg, state, release, log)
        seeded, seeded_built = _container_image_for(cfg, container_image, log)
        if directory is True:
            directory_dir(cfg).mkdir(mode=0o700, parents=True, exist_ok=True)
        elif directory is False:
            remove_directory(cfg)
        ensure_ssh_key(cfg)
        cfg.shared_dir.mkdir(parents=True, exist_ok=True)
        cfg.package_cache_dir.mkdir(parents=True, exist_ok=True)
        ensure_bridge(cfg)
        if not proxy_alive(cfg, state.proxy_pid):
            state.proxy_pid = start_proxy(cfg)
        state.image = str(image)
        state.os = release.codename
        state.inventory = str(inventory_path)
        save_state(cfg.state_file, state)

        for record in wanted:
            state.nodes.setdefault(record.name, record)
        nodes = state.sorted_nodes()
        if backup_controller is True:
            backup_controllers.choose(cfg, [n.name for n in nodes if n.index != LOGIN_INDEX])
        elif backup_controller is False:
            backup_controllers.remove(cfg)
        to_start = [node for node in nodes if not node_alive(cfg, node)]
        for node in to_start:
            paths = NodePaths(cfg, node.name)
            mount_overlay(paths, Path(node.image) if node.image else image)
            if not paths.configured.exists():
                configure_node(cfg, node, paths, nodes)
                paths.configured.touch()
        write_lab_known_hosts(cfg, state)
        boots: dict[str, Boot] = {}
        boot = booter(cfg, state)
        if to_start:
            raise_host_limits(log=log)
        for node in to_start:
            boots[node.name] = boot(node)
        if to_start:
            log(f"booting {', '.join(n.name for n in to_start)} ...")
        wait_for_ssh(cfg, boots, to_start, boot_again=boot)
        write_inventory(cfg, state, inventory_path)
    return UpResult(
        [n.name for n in to_start], built, time.monotonic() - start, seeded, seeded_built
    )


def reimage(cfg: LabConfig, name: str, release: Release, log=print) -> float:
    """Reinstall node `name` with `release`, as a site re-provisions a server: its disk
    (overlay and SSH host key) is wiped, it boots the release's image with the same name
    and address, and the nodes `up` adds from now on run that release too. Returns the
    seconds it took; the node comes back unconfigured (the playbooks set it up)."""
    start = time.monotonic()
    with locked(cfg.state_dir):
        state = load_state(cfg.state_file)
        node = node_of(cfg, state, name)
        image, _ = ensure_image(cfg, log=log, release=release)
        stop_node(cfg, node)
        record_reimage(state, node, image, release)
        save_state(cfg.state_file, state)
        paths = NodePaths(cfg, node.name)
        mount_overlay(paths, image)
        configure_node(cfg, node, paths, state.sorted_nodes())
        paths.configured.touch()
        write_lab_known_hosts(cfg, state)
        boot = booter(cfg, state)
        log(f"booting {name} ({release.codename}) ...")
        wait_for_ssh(cfg, {name: boot(node)}, [node], boot_again=boot)
        if state.inventory:
            write_inventory(cfg, state, Path(state.inventory))
    return time.monotonic() - start


def record_reimage(state: LabState, node: NodeRecord, image: Path, release: Release) -> None:
    """`node` boots `image` of `release`, which becomes the lab's (the nodes `up` adds);
    every other node keeps the image it runs."""
    pin_images(state)
    node.pid, node.image, node.os = None, str(image), release.codename
    state.image, state.os = str(image), release.codename


def pin_images(state: LabState) -> None:
    """Name on each node's record the image it runs (a None there would follow the lab's
    image, and release, at the node's next boot): before the lab's image changes."""
    for node in state.nodes.values():
        if node.image is None:
            node.image, node.os = state.image, state.release.codename


def write_lab_known_hosts(cfg: LabConfig, state: LabState) -> None:
    """The lab's known_hosts: every node's address and its host key as it is now."""
    write_known_hosts(
        cfg, {n.name: (n.address, host_public_key(cfg, n.name)) for n in state.sorted_nodes()}
    )


def booter(cfg: LabConfig, state: LabState) -> Callable[[NodeRecord], Boot]:
    """Boots a node of `state` and records its BMC's pid there (wait_for_ssh's
    boot_again boots with it too)."""

    def boot(node: NodeRecord) -> Boot:
        clear_stale_veth(cfg.machine_name(node.name))
        started = start_node(cfg, node, NodePaths(cfg, node.name))
        node.pid = started.process.pid
        save_state(cfg.state_file, state)
        return started

    return boot


def _container_image_for(
    cfg: LabConfig, wanted: bool | None, log
) -> tuple[ContainerImage | None, float | None]:
    """The container image the lab seeds (built first if this machine lacks it), kept in
    the lab's state so a later `up` without the option keeps it. A kept archive that is
    not the current build's (the build changed since) or is gone is built again."""
    if wanted is None:
        kept = lab_container_image(cfg)
        if kept is None or (kept.archive == archive_path() and kept.archive.is_file()):
            return kept, None
        wanted = True  # the cache was cleared or the build changed since: build it again
    if not wanted:
        cfg.container_image_file.unlink(missing_ok=True)
        return None, None
    built = ensure_oci_image(log=log)
    image = ContainerImage(built.archive, built.seed_name)
    _save_container_image(cfg, image)
    return image, built.build_seconds


def _save_container_image(cfg: LabConfig, image: ContainerImage) -> None:
    """Written next to its name and renamed into place: never half a file."""
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    target = cfg.container_image_file
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(json.dumps({"archive": str(image.archive), "name": image.name}) + "\n")
    os.replace(partial, target)


def lab_container_image(cfg: LabConfig) -> ContainerImage | None:
    """The container image the lab seeds, if it was brought up with one."""
    where = cfg.container_image_file
    try:
        saved = json.loads(where.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise LabError(f"{where}: unreadable ({exc}); run `tacc-lab down`") from exc
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("archive"), str)
        or not isinstance(saved.get("name"), str)
    ):
        raise LabError(
            f'{where}: expected {{"archive": PATH, "name": NAME}}, found '
            f"{json.dumps(saved)[:80]}; run `tacc-lab down`"
        )
    return ContainerImage(Path(saved["archive"]), saved["name"])


def _release_for(cfg: LabConfig, state: LabState, asked: Release | None) -> Release:
    """The nodes' release: a lab keeps the one it was brought up with (older labs' state
    names none: they run bookworm); a new lab runs what was asked, or TACC_LAB_OS, or
    releases.DEFAULT."""
    if not state.nodes:
        return asked or requested_release() or DEFAULT_RELEASE
    running = state.release
    if asked is not None and asked != running:
        raise LabError(
            f"lab {cfg.name!r} runs {running.codename} nodes; `up` keeps its nodes' OS "
            f"(asked for {asked.codename}). Run `tacc-lab down` first to change it."
        )
    return running


def _image_for(cfg: LabConfig, state: LabState, release: Release, log) -> tuple[Path, float | None]:
    """The image the nodes `up` adds boot: a running lab's, unless TACC_LAB_IMAGE_FLAVOR
    names a flavor (a server racked later is installed from the site's image of the
    day): then that flavor's, and the running nodes keep theirs (pinned on their
    records). A new lab's is built, or found cached."""
    running = Path(state.image) if state.nodes and state.image else None
    if running is not None and running.is_dir() and not os.environ.get(FLAVOR_ENV):
        return running, None
    image, built = ensure_image(cfg, log=log, release=release)
    if running is not None and image != running:
        pin_images(state)
    return image, built


def write_inventory(cfg: LabConfig, state: LabState, path: Path) -> None:
    nodes = [InventoryNode(n.name, n.address, n.index) for n in state.sorted_nodes()]
    keys = ensure_researcher_keys(cfg)
    directory = None
    if has_directory(cfg):
        head = head_node(nodes)
        files = ensure_directory(cfg, head.name, head.address)
        directory = directory_vars(files, head.name, keys)
    text = render_inventory(
        nodes,
        ssh_key=cfg.ssh_key,
        known_hosts=cfg.known_hosts,
        proxy_url=proxy_url(cfg),
        lab_name=cfg.name,
        hardware=host_hardware(),
        subnet=str(cfg.subnet),
        researchers={name: keys[name] for name, _uid in LOCAL_USERS},
        package_cache_wheels=host_find_links_wheels(state.release),
        container_image=lab_container_image(cfg),
        accounting_password=ensure_accounting_password(cfg),
        public_registry_password=public_registry.password(cfg),
        directory=directory,
        backup_controller=backup_controllers.backup_node(cfg),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        write_private(path, text)  # it holds the accounting database's password
    path.chmod(0o600)


def ensure_accounting_password(cfg: LabConfig) -> str:
    """The lab's Slurm accounting database password: made once, kept in the lab's state
    directory (mode 0600), never on a command line."""
    return ensure_secret(cfg.state_dir / "secrets" / "slurmdbd-db-password")


def host_hardware() -> NodeHardware:
    meminfo = Path("/proc/meminfo").read_text().split()
    memory_kb = int(meminfo[meminfo.index("MemTotal:") + 1])
    return NodeHardware(cpus=os.cpu_count() or 1, memory_mb=memory_kb // 1024)


def down(cfg: LabConfig) -> list[str]:
    """Stop and remove everything the lab created; safe to run twice or after a crash."""
    check_prerequisites()
    removed: list[str] = []
    with locked(cfg.state_dir):
        state = load_state(cfg.state_file)
        if state is not None:
            for node in state.sorted_nodes():
                stop_node(cfg, node)
                removed.append(node.name)
            for node in state.sorted_nodes():
                clear_stale_veth(cfg.machine_name(node.name))
            stop_proxy(cfg, state.proxy_pid)
            if state.inventory:
                Path(state.inventory).unlink(missing_ok=True)
        for pid, marker in leftover_processes(cfg):
            stop_process(pid, marker, timeout=15)
        for mount in mounts_under(cfg.state_dir):
            run(["umount", "--lazy", mount])
        remove_bridge(cfg)
    shutil.rmtree(cfg.state_dir, ignore_errors=True)
    return removed


def leftover_processes(cfg: LabConfig) -> list[tuple[int, str]]:
    """(pid, marker) of node or proxy processes of this lab the state file does not know."""
    markers = (f"--directory={cfg.nodes_dir}/", str(cfg.proxy_dir))
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found += [(int(proc.name), marker) for marker in markers if marker in cmdline][:1]
    return found


def mounts_under(directory: Path) -> list[str]:
    prefix = str(directory) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return sorted((p for p in points if p.startswith(prefix)), reverse=True)


@dataclass
class NodeStatus:
    name: str
    address: str
    state: str
    groups: tuple[str, ...]
    os: str = ""  # the node's release (a reimaged node's may differ from the lab's)


def status(cfg: LabConfig) -> tuple[LabState | None, list[NodeStatus], dict[str, str]]:
    state = load_state(cfg.state_file)
    if state is None:
        return None, [], {}
    indexes = [node.index for node in state.nodes.values()]
    count = numbered_count(indexes)
    login_node = LOGIN_INDEX in indexes
    container_image = lab_container_image(cfg)
    rows = []
    for node in state.sorted_nodes():
        running = node_alive(cfg, node) and is_mounted(NodePaths(cfg, node.name).rootfs)
        rows.append(
            NodeStatus(
                node.name,
                node.address,
                "running" if running else "stopped",
                groups_for(
                    node.index,
                    count,
                    login_node=login_node,
                    image_registry=container_image is not None,
                ),
                node.os or state.release.codename,
            )
        )
    proxy_state = "running" if proxy_alive(cfg, state.proxy_pid) else "stopped"
    extra = {
        "bridge": f"{cfg.bridge} ({'up' if bridge_exists(cfg.bridge) else 'missing'})",
        "proxy": f"{proxy_url(cfg)} ({proxy_state})",
        "shared": f"{cfg.shared_dir} -> /shared",
        "pkgcache": f"{cfg.package_cache_dir} -> n1:{NODE_PACKAGE_CACHE} (kept by down)",
        "os": state.release.codename,
        "image": state.image or "-",
        "container": (
            f"{container_image.name} <- {container_image.archive}" if container_image else "-"
        ),
        "inventory": state.inventory or "-",
    }
    return state, rows, extra


def find_login_node(cfg: LabConfig) -> NodeRecord:
    """The node researchers log in to: login1, or n1 in a lab without a login node."""
    state = load_state(cfg.state_file)
    has_login = state is not None and node_name(LOGIN_INDEX) in state.nodes
    return find_node(cfg, node_name(LOGIN_INDEX if has_login else 1))


def find_node(cfg: LabConfig, name: str) -> NodeRecord:
    return node_of(cfg, load_state(cfg.state_file), name)


def node_of(cfg: LabConfig, state: LabState | None, name: str) -> NodeRecord:
    """Node `name` of the lab whose state this is; an error naming the lab's nodes."""
    if state is None:
        raise LabError(f"lab {cfg.name!r} is not up; run `tacc-lab up` first")
    node = state.nodes.get(name)
    if node is None:
        known = ", ".join(n.name for n in state.sorted_nodes())
        raise LabError(f"no node {name!r} in lab {cfg.name!r}; nodes are: {known}")
    return node
