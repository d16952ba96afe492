"""`tacc-lab`: a virtual cluster of systemd-nspawn nodes for running the playbooks for real."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from tacc_lab.config import DEFAULT_NAME, DEFAULT_SUBNET
from tacc_lab.errors import LabError
from tacc_lab.fakehw import FakeHardware, install
from tacc_lab.lab import down, find_login_node, find_node, resolve_config, status, up
from tacc_lab.nodes import NodePaths, cut_power, ssh_base_args
from tacc_lab.researchers import (
    check_researcher,
    researcher_names,
    user_cache_dir,
    write_user_config,
)


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
    p_up.add_argument("--inventory", type=Path, help="where to write the Ansible inventory")
    sub.add_parser("down", help="stop every node, remove overlays, bridge, proxy and state")
    p_status = sub.add_parser("status", help="nodes, addresses and state")
    p_status.add_argument("--json", action="store_true", help="machine-readable output")
    p_off = sub.add_parser(
        "poweroff",
        help="cut a node's power: every process dies at once; `up` boots it again",
    )
    p_off.add_argument("node")
    p_ssh = sub.add_parser("ssh", help="open a shell or run a command on a node")
    p_ssh.add_argument("node")
    p_ssh.add_argument("cmd", nargs=argparse.REMAINDER, help="command and arguments to run")
    p_user = sub.add_parser(
        "user",
        help="print export lines that point tcloud at the lab's login node as NAME",
        description='Use as: eval "$(tacc-lab user alice)"',
    )
    p_user.add_argument(
        "researcher", metavar="NAME", help=f"one of: {', '.join(researcher_names())}"
    )
    p_fake = sub.add_parser(
        "fake-hw", help="give a node FAKE GPUs, NVSwitches, ConnectX NICs and RDMA devices"
    )
    p_fake.add_argument("node")
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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except LabError as exc:
        print(f"tacc-lab: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("tacc-lab: interrupted; run `tacc-lab down` to clean up", file=sys.stderr)
        return 130


def _dispatch(args: argparse.Namespace) -> int:
    subnet = getattr(args, "subnet", None)
    cfg = resolve_config(args.name, subnet, DEFAULT_SUBNET)
    if args.command == "up":
        inventory = args.inventory or default_inventory(args.name)
        try:
            result = up(cfg, args.nodes, inventory.resolve(), login_node=args.login_node)
        except LabError as exc:
            hint = "(what started is left for inspection; `tacc-lab down` removes it)"
            raise LabError(f"{exc}\n{hint}") from exc
        if result.image_build_seconds is not None:
            print(f"image built in {result.image_build_seconds:.1f} s")
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
        node = find_node(cfg, args.node)
        if cut_power(cfg, node):
            print(f"{node.name}: power cut (its disk is kept; `tacc-lab up` boots it again)")
        else:
            print(f"{node.name}: already off")
        return 0
    if args.command == "fake-hw":
        node = find_node(cfg, args.node)
        hardware = FakeHardware(
            gpus=args.gpus,
            gpu_model=args.gpu_model,
            nvswitches=args.nvswitches,
            nics=args.nics,
            nic_fw=args.nic_fw,
            ib_devices=args.rdma,
            link_layer=args.link_layer,
        )
        installed = install(NodePaths(cfg, node.name).rootfs, node.name, hardware)
        print(f"{node.name}: FAKE hardware installed: {'; '.join(installed)}")
        return 0
    if args.command == "user":
        check_researcher(args.researcher)
        login = find_login_node(cfg)
        config = write_user_config(cfg, args.researcher, login.address)
        print(f"export TCLOUD_CONFIG={shlex.quote(str(config))}")
        print(f"export TCLOUD_CACHE_DIR={shlex.quote(str(user_cache_dir(cfg, args.researcher)))}")
        return 0
    if args.command == "ssh":
        node = find_node(cfg, args.node)
        argv = [*ssh_base_args(cfg), "-t" if sys.stdin.isatty() else "-T", f"root@{node.address}"]
        if args.cmd:
            # ssh joins its arguments with spaces for the remote shell: quote each one.
            argv.append(shlex.join(args.cmd))
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
                {"name": r.name, "address": r.address, "state": r.state, "groups": list(r.groups)}
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
    print(f"  {'NODE':<6} {'ADDRESS':<15} {'STATE':<8} GROUPS")
    for row in rows:
        print(f"  {row.name:<6} {row.address:<15} {row.state:<8} {','.join(row.groups)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
