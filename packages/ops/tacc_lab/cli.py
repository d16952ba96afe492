"""`tacc-lab`: a virtual cluster of systemd-nspawn nodes for running the playbooks for real."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from pathlib import Path

from tacc_lab import public_registry
from tacc_lab.addressing import LOGIN_NAME
from tacc_lab.backup_controller import backup_node
from tacc_lab.config import DEFAULT_NAME, DEFAULT_SUBNET, LabConfig
from tacc_lab.errors import LabError
from tacc_lab.fakehw import FakeHardware, install
from tacc_lab.inventory import REGISTRY_PORT
from tacc_lab.lab import (
    down,
    find_login_node,
    find_node,
    lab_container_image,
    reimage,
    resolve_config,
    status,
    up,
)
from tacc_lab.nodes import NodePaths, cut_power, ssh_command_argv
from tacc_lab.releases import DEFAULT as DEFAULT_RELEASE
from tacc_lab.releases import OS_ENV, RELEASES, Release, release_named
from tacc_lab.researchers import (
    check_researcher,
    researcher_names,
    user_cache_dir,
    write_user_config,
)
from tacc_lab.state import NodeRecord, load_state

USAGE_EXIT = 2  # what argparse exits with on a usage error
NODE_NAME = re.compile(rf"n[1-9][0-9]*|{re.escape(LOGIN_NAME)}")
INVENTORY_SUFFIXES = (".yml", ".yaml")  # what Ansible's YAML inventory plugin reads


class UsageError(LabError):
    """A command line naming something that cannot be: exits 2, as argparse does."""


def node_argument(text: str) -> str:
    """A NODE argument: a lab node's name (n1, n2, ... or login1)."""
    if not NODE_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a lab node name; nodes are n1, n2, ... and {LOGIN_NAME}"
        )
    return text


def os_argument(text: str) -> Release:
    """--os: a release the lab builds node images of (releases.py)."""
    try:
        return release_named(text)
    except LabError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def inventory_argument(text: str) -> Path:
    """--inventory: a YAML file to write, not a directory, under a directory (or under
    directories still to create, never under a file)."""
    if not text:
        raise argparse.ArgumentTypeError("is empty; give the inventory file to write")
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give the file to write")
    if path.suffix not in INVENTORY_SUFFIXES:
        raise argparse.ArgumentTypeError(
            f"{text!r} must end in .yml or .yaml (Ansible's YAML inventory plugin reads only "
            "those), e.g. inventory/lab/hosts.yml"
        )
    for parent in path.absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise argparse.ArgumentTypeError(
                    f"{text!r} lies under {str(parent)!r}, which is a file, not a directory"
                )
            break
    return path


def default_inventory(name: str) -> Path:
    """inventory/<name>/hosts.yml in the project checkout (cwd with ansible.cfg), if any."""
    cwd = Path.cwd()
    if (cwd / "ansible.cfg").exists() and (cwd / "inventory").is_dir():
        return cwd / "inventory" / name / "hosts.yml"
    return Path("/var/lib/tacc-lab") / f"{name}-hosts.yml"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tacc-lab", description=__doc__)
    parser.add_argument(
        "--name",
        default=os.environ.get("TACC_LAB_NAME", DEFAULT_NAME),
        help="lab name, for several labs side by side (default: %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p_up = sub.add_parser("up", help="build the image if needed, boot nodes, write inventory")
    p_up.add_argument(
        "--nodes", type=int, default=3, help="numbered nodes n1.. (default: 3): head + compute"
    )
    p_up.add_argument(
        "--login-node",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a separate login node login1, as in production (default: from 2 nodes on, "
        "or as the lab already is); --no-login-node makes n1 the login node too",
    )
    p_up.add_argument(
        "--subnet",
        default=os.environ.get("TACC_LAB_SUBNET"),
        help=f"private IPv4 subnet for the bridge (default: {DEFAULT_SUBNET})",
    )
    p_up.add_argument(
        "--container-image",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="build the lab's container image (tacc/base:bookworm; once per machine) and "
        "seed it into an image registry on n1, with the container runtime on compute and "
        "login nodes (default: as the lab already is; none for a new lab)",
    )
    p_up.add_argument(
        "--directory",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="an LDAP directory (slapd, TLS) on n1 with researchers carol and dave, and "
        "SSSD on every node (default: as the lab already is; none for a new lab)",
    )
    p_up.add_argument(
        "--backup-controller",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the last node also runs a backup slurmctld and is a second login host; the "
        "controllers share their state through a host directory on every node (default: "
        "as the lab already is; none for a new lab)",
    )
    p_up.add_argument(
        "--os",
        type=os_argument,
        metavar="{" + ",".join(RELEASES) + "}",
        help=f"the nodes' Debian release (default: ${OS_ENV}, or as the lab already is, "
        f"or {DEFAULT_RELEASE.codename}); a running lab keeps its nodes' release",
    )
    p_up.add_argument(
        "--inventory",
        type=inventory_argument,
        help="where to write the Ansible inventory (a .yml file)",
    )
    sub.add_parser("down", help="stop every node, remove overlays, bridge, proxy and state")
    p_status = sub.add_parser("status", help="nodes, addresses and state")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_off = sub.add_parser(
        "poweroff",
        help="cut a node's power: every process dies at once; `up` boots it again",
    )
    p_off.add_argument("node", type=node_argument)
    p_reimage = sub.add_parser(
        "reimage",
        help="reinstall a node with another Debian release (its disk is wiped); the nodes "
        "`up` adds from then on run that release too",
        description="As a site re-provisions a server: the node keeps its name and address, "
        "loses its disk (a new SSH host key, nothing installed but the image's packages) "
        "and boots the release's image; the playbooks then set it up again.",
    )
    p_reimage.add_argument("node", type=node_argument)
    p_reimage.add_argument(
        "--os",
        type=os_argument,
        required=True,
        metavar="{" + ",".join(RELEASES) + "}",
        help="the release the node runs after",
    )
    p_ssh = sub.add_parser(
        "ssh",
        help="open a shell or run a command on a node",
        description="As with ssh, the words after NODE are joined with spaces and run by the "
        "node's shell: `tacc-lab ssh n1 'sinfo -N; squeue'` runs two commands; quote a "
        "word that holds spaces or shell characters (shlex.join from a program).",
    )
    p_ssh.add_argument("node", type=node_argument)
    p_ssh.add_argument(
        "cmd", nargs=argparse.REMAINDER, help="command line for the node's shell (none: a shell)"
    )
    p_user = sub.add_parser(
        "user",
        help="print export lines that point tcloud at the lab's login node as NAME",
        description='Use as: eval "$(tacc-lab user alice)"',
    )
    p_user.add_argument(
        "researcher", metavar="NAME", help=f"one of: {', '.join(researcher_names())}"
    )
    p_public = sub.add_parser(
        "public-registry",
        help="start or stop the lab's stand-in for nvcr.io on the head node",
        description="A registry with token auth holding the lab's container image as "
        f"{public_registry.REGISTRY}/{public_registry.IMAGE_PATH}:TAG, the upstream of the "
        "cluster's cache of nvcr.io (tacc_lab/public_registry.py). Start it after site.yml.",
    )
    p_public.add_argument("action", choices=["start", "stop"])
    p_fake = sub.add_parser(
        "fake-hw", help="give a node FAKE GPUs, NVSwitches, ConnectX NICs and RDMA devices"
    )
    p_fake.add_argument("node", type=node_argument)
    p_fake.add_argument("--gpus", type=int, default=0, help="GPU count (default: 0)")
    p_fake.add_argument("--gpu-model", default="h100", help="h100, a100 or l40s (default: h100)")
    p_fake.add_argument("--nvswitches", type=int, default=0, help="NVSwitch count (default: 0)")
    p_fake.add_argument("--nics", type=int, default=0, help="ConnectX-6 Dx count (default: 0)")
    p_fake.add_argument("--nic-fw", default="22.36.1010", help="their running firmware")
    p_fake.add_argument("--rdma", type=int, default=0, help="RDMA devices (mlx5_N) in sysfs")
    p_fake.add_argument(
        "--link-layer",
        choices=["InfiniBand", "Ethernet"],
        default="InfiniBand",
        help="link layer of the RDMA ports (Ethernet = RoCE)",
    )
    p_fake.add_argument(
        "--sockets", type=int, default=1, help="CPU sockets the GPUs are spread over (default: 1)"
    )
    p_fake.add_argument(
        "--cores-per-socket",
        type=int,
        default=0,
        help="cores per socket (default: the host's CPUs over the sockets)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        print(f"tacc-lab: error: {exc}", file=sys.stderr)
        return USAGE_EXIT
    except LabError as exc:
        print(f"tacc-lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tacc-lab: interrupted; run `tacc-lab down` to clean up", file=sys.stderr)
        return 130


def _lab_node(cfg: LabConfig, name: str) -> NodeRecord:
    """The lab's node `name`; a name the lab does not have is a usage error (exit 2), a
    lab that is not up is not (exit 1)."""
    state = load_state(cfg.state_file)
    if state is not None and name not in state.nodes:
        known = ", ".join(node.name for node in state.sorted_nodes())
        raise UsageError(f"no node {name!r} in lab {cfg.name!r}; nodes are: {known}")
    return find_node(cfg, name)


def _dispatch(args: argparse.Namespace) -> int:
    subnet = getattr(args, "subnet", None)
    cfg = resolve_config(args.name, subnet, DEFAULT_SUBNET)
    if args.command == "up":
        inventory = args.inventory or default_inventory(args.name)
        try:
            result = up(
                cfg,
                args.nodes,
                inventory.resolve(),
                login_node=args.login_node,
                container_image=args.container_image,
                release=args.os,
                directory=args.directory,
                backup_controller=args.backup_controller,
            )
        except LabError as exc:
            hint = "(what started is left for inspection; `tacc-lab down` removes it)"
            raise LabError(f"{exc}\n{hint}") from exc
        if result.image_build_seconds is not None:
            print(f"image built in {result.image_build_seconds:.1f} s")
        if result.container_image_build_seconds is not None:
            print(f"container image built in {result.container_image_build_seconds:.1f} s")
        if result.container_image is not None:
            image = result.container_image
            print(f"container image: {image.archive} (seeded as {image.name} on n1)")
        if result.started:
            print(f"started {', '.join(result.started)} in {result.seconds:.1f} s")
        else:
            print(f"lab {cfg.name!r} already up: nothing to do")
        print(f"inventory: {inventory}")
        return 0
    if args.command == "down":
        removed = down(cfg)
        print(f"lab {cfg.name!r} removed" + (f" ({', '.join(removed)})" if removed else ""))
        return 0
    if args.command == "status":
        return _print_status(cfg, as_json=args.json)
    if args.command == "poweroff":
        node = _lab_node(cfg, args.node)
        if cut_power(cfg, node):
            print(f"{node.name}: power cut (its disk is kept; `tacc-lab up` boots it again)")
        else:
            print(f"{node.name}: already off")
        return 0
    if args.command == "reimage":
        node = _lab_node(cfg, args.node)
        seconds = reimage(cfg, node.name, args.os)
        print(f"{node.name}: reinstalled with {args.os.codename} in {seconds:.1f} s")
        return 0
    if args.command == "public-registry":
        image = lab_container_image(cfg)
        if image is None:
            raise LabError(f"lab {cfg.name!r} has no container image (up --container-image)")
        head = _lab_node(cfg, "n1")
        if args.action == "stop":
            public_registry.stop(cfg, head)
            print(f"{public_registry.REGISTRY} stand-in stopped on {head.name}")
            return 0
        seeded = f"{head.name}:{REGISTRY_PORT}/{image.name}"
        print(public_registry.start(cfg, head, seeded))
        return 0
    if args.command == "fake-hw":
        node = _lab_node(cfg, args.node)
        hardware = FakeHardware(
            gpus=args.gpus,
            gpu_model=args.gpu_model,
            nvswitches=args.nvswitches,
            nics=args.nics,
            nic_fw=args.nic_fw,
            ib_devices=args.rdma,
            link_layer=args.link_layer,
            sockets=args.sockets,
            cores_per_socket=args.cores_per_socket,
        )
        installed = install(NodePaths(cfg, node.name).rootfs, node.name, hardware)
        print(f"{node.name}: FAKE hardware installed: {'; '.join(installed)}")
        return 0
    if args.command == "user":
        check_researcher(args.researcher)
        login = find_login_node(cfg)
        backup = backup_node(cfg)
        fallback = [find_node(cfg, backup).address] if backup and backup != login.name else []
        config = write_user_config(cfg, args.researcher, login.address, fallback)
        print(f"export TCLOUD_CONFIG={shlex.quote(str(config))}")
        print(f"export TCLOUD_CACHE_DIR={shlex.quote(str(user_cache_dir(cfg, args.researcher)))}")
        return 0
    if args.command == "ssh":
        node = _lab_node(cfg, args.node)
        argv = ssh_command_argv(cfg, node.address, args.cmd, tty=sys.stdin.isatty())
        os.execvp(argv[0], argv)  # noqa: S606 - replaces this process with ssh
    return 2


def _print_status(cfg, *, as_json: bool) -> int:
    state, rows, extra = status(cfg)
    if as_json:
        payload = {
            "lab": cfg.name,
            "up": state is not None,
            "subnet": str(cfg.subnet),
            "nodes": [
                {
                    "name": r.name,
                    "address": r.address,
                    "state": r.state,
                    "os": r.os,
                    "groups": list(r.groups),
                }
                for r in rows
            ],
            **extra,
        }
        print(json.dumps(payload, indent=2))
        return 0
    if state is None:
        print(f"lab {cfg.name!r} is down")
        return 0
    print(f"lab {cfg.name!r} on {cfg.subnet}")
    for key, value in extra.items():
        print(f"  {key:<9} {value}")
    print(f"  {'NODE':<6} {'ADDRESS':<15} {'STATE':<8} {'OS':<8} GROUPS")
    for row in rows:
        line = f"{row.name:<6} {row.address:<15} {row.state:<8} {row.os:<8}"
        print(f"  {line} {','.join(row.groups)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
