#!/usr/bin/env python3
"""Simulated scale (issue [7]): slurm.conf and /etc/hosts for a generated inventory of N
GPU nodes (default 4,096 with 8 GPUs each, plus a controller and a login node), rendered
with the project's own templates and filters, timed, with file sizes and line counts.

Timed two ways, for the controller only (every host renders the same bytes):
  render   - the two templates through Ansible's templating engine, loaded in this process
             with the inventory, the slurm role's defaults and its filter plugin. Time
             spent rendering, hostvars lookups of all N nodes included; the inventory
             load is timed and printed separately. This is the number held to the target.
  playbook - `ansible-playbook playbooks/render-slurm-config.yml --limit ctl1`, wall
             clock, as ops would run it (start-up, inventory parsing, every task).
The playbook's slurm.conf and hosts must be byte-identical to the in-process ones.

--add-node (issue [15]): which hosts a node addition changes, with the cluster DNS and
Prometheus on the controller (groups cluster_dns and monitoring on ctl1, as in
inventory/example). The inventory of N nodes and of N+1 (one more GPU node) are rendered
by the real render playbook (`ansible-playbook playbooks/render-cluster-files.yml
--limit SAMPLE`), every file the run writes on a host (slurm_render_dir/<host>/root/),
for a sample that covers every class of host: ctl1 (controller, DNS, Prometheus,
accounting), login1, the first, a middle and the last old GPU node, and the new node.
Printed: the hosts whose files differ (the new node: every file is new); expected
{ctl1, new node}. A sample is enough because an old compute node's files are a function
of its own name and address and of cluster-wide values only (group variables, the
controller's and the DNS host's addresses): the bench checks it by showing, in both
inventories, that the first node's files become the middle node's once its name and
address are replaced by the middle node's. Then any compute node's files before and
after are the sampled node's with the names swapped, and change only if those do; the
first and last nodes cover a template that would single out an end of the list. What
the claim rests on is the inventory, not a host's state: `--check` against 4,096 real
hosts is impossible here (they do not exist, so every one would be unreachable); the lab
test tests/integration/test_slurm_cluster.py::
test_added_node_joins_without_disturbing_a_running_job (real site.yml, then --check
--diff, on 4 real nodes: login1, n2, n3 report changed=0, a job stays RUNNING) covers
the real run.

Usage: .venv/bin/python -u bench/render_scale.py [--nodes 4096] [--hetero] [--add-node]
       [--json PATH]
Needs no lab. The example inventory's group_vars supply everything but the host list
and the GPU nodes' hardware (224 CPUs, ~2 TB, 8 x H100 each).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import resource
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml
from benchlib import BIN, ROOT, Record, add_json_argument, sh

TARGET_S = 5.0
GPUS_PER_NODE = 8
HOST = "ctl1"


def gpu_name(index: int, nodes: int) -> str:
    """The name of GPU node `index` (from 1) in an inventory of `nodes` (+1 added later)."""
    return f"gpu{index:0{max(4, len(str(nodes)))}d}"


def gpu_address(index: int) -> str:
    """10.10.<rack>.<slot>, 250 nodes per rack."""
    return f"10.10.{1 + (index - 1) // 250}.{1 + (index - 1) % 250}"


def inventory(
    root: Path, nodes: int, hetero: bool, *, services: bool = False, added: int = 0
) -> Path:
    """The example inventory's variables, with N GPU nodes gpuNNNN at 10.10.<rack>.<slot>
    (250 per rack). --hetero: the last 1/32 of the nodes are an h200 group with more
    memory (a second NodeName line) and their own partition, listed by name. services:
    the cluster DNS and Prometheus on the controller (groups cluster_dns and monitoring,
    as in inventory/example). added: that many more GPU nodes after the N (named as in
    the N-node inventory)."""
    shutil.copytree(ROOT / "inventory/example/group_vars", root / "group_vars")
    hardware = {
        "slurm_node_cpus": 224,
        "slurm_node_memory_mb": 2_063_000,
        "slurm_node_gres": [f"gpu:h100:{GPUS_PER_NODE}"],
    }
    (root / "group_vars/gpu_nodes/hardware.yml").write_text(yaml.safe_dump(hardware))
    gpus = {
        gpu_name(i, nodes): {"ansible_host": gpu_address(i)} for i in range(1, nodes + added + 1)
    }
    children = {
        "slurm_controller": {"hosts": {HOST: None}},
        "slurm_dbd": {"hosts": {HOST: None}},
        "login": {"hosts": {"login1": None}},
        "slurm_compute": {"hosts": dict.fromkeys(gpus)},
        "gpu_nodes": {"hosts": dict.fromkeys(gpus)},
    }
    if services:
        children |= {group: {"hosts": {HOST: None}} for group in ("cluster_dns", "monitoring")}
    if hetero:
        h200 = list(gpus)[nodes - max(1, nodes // 32) :]
        children["h200_nodes"] = {"hosts": dict.fromkeys(h200)}
        (root / "group_vars/h200_nodes").mkdir()
        (root / "group_vars/h200_nodes/hardware.yml").write_text(
            yaml.safe_dump(
                {
                    "slurm_node_memory_mb": 3_095_000,
                    "slurm_node_gres": [f"gpu:h200:{GPUS_PER_NODE}"],
                }
            )
        )
        cluster = yaml.safe_load((root / "group_vars/all/cluster.yml").read_text())
        partitions = [*cluster["slurm_partitions"], {"name": "h200", "nodes": ",".join(h200)}]
        (root / "group_vars/all/zz_bench.yml").write_text(  # read after cluster.yml
            yaml.safe_dump({"slurm_partitions": partitions})
        )
    data = {
        "all": {
            "hosts": {
                HOST: {"ansible_host": "10.10.0.10"},
                "login1": {"ansible_host": "10.10.0.11"},
                **gpus,
            },
            "children": children,
        }
    }
    path = root / "hosts.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def render_in_process(hosts: Path, dest: Path) -> dict:
    """Render slurm.conf (slurm role) and hosts (common role) for HOST the way the template
    action does, in this process. Returns (wall s, CPU s) of loading the inventory, and
    (wall s, CPU s, text) of each file."""
    os.environ["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")  # read when ansible is imported
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import add_all_plugin_dirs, init_plugin_loader
    from ansible.template import Templar, generate_ansible_template_vars, trust_as_template
    from ansible.vars.hostvars import HostVars
    from ansible.vars.manager import VariableManager

    init_plugin_loader()
    add_all_plugin_dirs(str(ROOT / "roles/slurm"))  # what loading the role does
    start, start_cpu = time.monotonic(), time.process_time()
    loader = DataLoader()
    inv = InventoryManager(loader=loader, sources=[str(hosts)])
    manager = VariableManager(loader=loader, inventory=inv)
    HostVars(inventory=inv, variable_manager=manager, loader=loader)  # as the executor does
    host_vars = manager.get_vars(host=inv.get_host(HOST))
    result: dict = {"inventory": (time.monotonic() - start, time.process_time() - start_cpu)}

    def load(path: str) -> dict:
        return loader.load_from_file(str(ROOT / path), trusted_as_template=True) or {}

    # Precedence as in the play: role defaults < inventory < include_vars < extra vars.
    variables = {
        **load("roles/slurm/defaults/main.yml"),
        **load("roles/common/defaults/main.yml"),
        **host_vars,
        **load("roles/slurm/vars/Debian.yml"),
        "vault_slurm_dbd_db_password": "bench",
    }
    for name, src in (
        ("slurm.conf", "roles/slurm/templates/slurm.conf.j2"),
        ("hosts", "roles/common/templates/hosts.j2"),
    ):
        begin, begin_cpu = time.monotonic(), time.process_time()
        full = str(ROOT / src)
        templar = Templar(loader=loader).copy_with_new_env(
            searchpath=[str(Path(full).parent)],
            available_variables={
                **variables,
                **generate_ansible_template_vars(
                    path=Path(src).name, fullpath=full, dest_path=str(dest / name)
                ),
            },
        )
        text = templar.template(
            trust_as_template(Path(full).read_text()),
            escape_backslashes=False,
            overrides={"trim_blocks": True, "lstrip_blocks": False},
        )
        result[name] = (time.monotonic() - begin, time.process_time() - begin_cpu, text)
    return result


def describe(text: str) -> tuple[int, int]:
    return len(text.encode()), len(text.splitlines())


def verdict(wall: float, cpu: float) -> str:
    """PASS/FAIL of the wall time, and of the CPU time (what an idle core would take; on a
    loaded machine the wall time is larger)."""

    def mark(seconds: float) -> str:
        return "PASS" if seconds <= TARGET_S else "FAIL"

    return f"target <= {TARGET_S:g} s: {mark(wall)} (wall), {mark(cpu)} (CPU)"


def render_playbook(hosts: Path, dest: Path, limit: list[str]) -> tuple[float, float, str]:
    """Render every file of the hosts in `limit` into dest/<host>/ with the real render
    playbook: wall s, CPU s (its processes) and the command line."""
    argv = [
        str(BIN / "ansible-playbook"),
        "-i",
        str(hosts),
        "playbooks/render-cluster-files.yml",
        "--limit",
        ",".join(limit),
        "-e",
        f"slurm_render_dir={dest}",
        "-e",
        "vault_slurm_dbd_db_password=bench",
    ]
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_before = children.ru_utime + children.ru_stime
    start = time.monotonic()
    sh(argv, {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")})
    wall = time.monotonic() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, children.ru_utime + children.ru_stime - cpu_before, shlex.join(argv)


def written_files(render_dir: Path, host: str) -> dict[str, bytes]:
    """What the run writes on host, by path ({} for a host not rendered)."""
    root = render_dir / host / "root"
    return {
        "/" + str(path.relative_to(root)): path.read_bytes()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def changed_paths(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """Paths written differently (or only once) in two renders of a host."""
    return sorted(
        path for path in before.keys() | after.keys() if before.get(path) != after.get(path)
    )


def as_other_node(
    files: dict[str, bytes], this: tuple[str, str], other: tuple[str, str]
) -> dict[str, bytes]:
    """files with this node's (name, address) replaced by the other node's."""
    pattern = re.compile(
        rf"(?<![\w.]){re.escape(this[0])}(?!\w)|(?<![\d.]){re.escape(this[1])}(?![\d])"
    )
    swap = {this[0]: other[0], this[1]: other[1]}
    return {
        path: pattern.sub(lambda m: swap[m.group(0)], text.decode()).encode()
        for path, text in files.items()
    }


def unified_diff(a: dict[str, bytes], b: dict[str, bytes], a_name: str, b_name: str) -> list[str]:
    """The lines of a unified diff between two hosts' files, path by path."""
    lines: list[str] = []
    for path in changed_paths(a, b):
        a_lines = a.get(path, b"").decode().splitlines()
        b_lines = b.get(path, b"").decode().splitlines()
        lines += difflib.unified_diff(
            a_lines, b_lines, f"{a_name}:{path}", f"{b_name}:{path}", lineterm=""
        )
    return lines


def add_node(out: Record, tmp: Path, nodes: int, hetero: bool) -> None:
    """Render the sample for N and N+1 nodes; record and print the hosts whose files
    differ, and check that two old compute nodes' files differ by name and address only."""
    first, middle, last = (gpu_name(i, nodes) for i in (1, (nodes + 1) // 2, nodes))
    new = gpu_name(nodes + 1, nodes)
    old = [HOST, "login1", first, middle, last]
    renders = {}
    for label, added, limit in (("before", 0, old), ("after", 1, [*old, new])):
        hosts = inventory(tmp / f"inventory-{label}", nodes, hetero, services=True, added=added)
        wall, cpu, command = render_playbook(hosts, tmp / label, limit)
        renders[label] = tmp / label
        out[f"add_node_{label}_render_s"] = wall
        out[f"add_node_{label}_render_cpu_s"] = cpu
        print(
            f"{label}: {nodes + added} GPU nodes, {len(limit)} hosts rendered in {wall:.1f} s "
            f"({cpu:.1f} s CPU):\n  {command}",
            flush=True,
        )
    changed = {}
    for host in [*old, new]:
        before, after = (written_files(renders[label], host) for label in ("before", "after"))
        if not after:
            sys.exit(f"bench: nothing was rendered for {host} (see the playbook's output)")
        paths = changed_paths(before, after)
        print(
            f"  {host:8} {len(after):2} files, {len(paths):2} changed"
            + (f": {', '.join(paths)}" if paths else ""),
            flush=True,
        )
        if paths:
            changed[host] = paths
    expected = {HOST, new}
    out.update(
        add_node_sample=[*old, new],
        add_node_changed=changed,
        add_node_as_expected=set(changed) == expected,
    )
    print(
        f"hosts a node addition changes: {{{', '.join(changed)}}} "
        f"(expected {{{HOST}, {new}}}): {'PASS' if set(changed) == expected else 'FAIL'}",
        flush=True,
    )

    # Why the sample is enough: in both inventories an old compute node's files are
    # another's with the name and address swapped, so every compute node changes
    # exactly when the sampled ones do (and they did not).
    this, other = (first, gpu_address(1)), (middle, gpu_address((nodes + 1) // 2))
    diff: list[str] = []
    for label in ("before", "after"):
        files_this = written_files(renders[label], first)
        files_other = written_files(renders[label], middle)
        raw = changed_paths(files_this, files_other)
        swapped = as_other_node(files_this, this, other)
        label_diff = unified_diff(swapped, files_other, f"{label}/{first} as {middle}", middle)
        diff += label_diff
        print(
            f"{label}: {first} and {middle}: {len(raw)} of {len(files_this)} files differ "
            f"({', '.join(raw)}); with {first}/{this[1]} replaced by {middle}/{other[1]}: "
            f"{'identical' if not label_diff else 'STILL DIFFERENT'}",
            flush=True,
        )
        out[f"add_node_name_only_files_{label}"] = raw
    out["add_node_name_only"] = not diff
    for line in diff[:40]:
        print(f"    {line}", flush=True)
    if diff or set(changed) != expected:
        sys.exit("bench: a node addition changes more than the controller and the new node")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4096)
    parser.add_argument(
        "--hetero", action="store_true", help="make 1/32 of the nodes a second hardware group"
    )
    parser.add_argument(
        "--add-node",
        action="store_true",
        help="only: the hosts whose files a node addition changes (needs --nodes >= 3)",
    )
    add_json_argument(parser)
    args = parser.parse_args()
    if args.add_node and args.nodes < 3:
        parser.error("--add-node needs --nodes 3 or more (a first, a middle and a last node)")
    os.chdir(ROOT)
    with (
        Record(
            args.json,
            nodes=args.nodes,
            gpus=args.nodes * GPUS_PER_NODE,
            target_s=TARGET_S,
            hetero=args.hetero,
            load_avg=os.getloadavg(),
        ) as out,
        tempfile.TemporaryDirectory() as tmp,
    ):
        if args.add_node:
            add_node(out, Path(tmp), args.nodes, args.hetero)
            return 0
        hosts = inventory(Path(tmp), args.nodes, args.hetero)
        print(
            f"inventory: {args.nodes} GPU nodes x {GPUS_PER_NODE} GPUs = "
            f"{args.nodes * GPUS_PER_NODE} GPUs (+ {HOST}, login1), "
            f"{hosts.stat().st_size / 1024:.0f} KiB hosts.yml; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
            flush=True,
        )

        local = render_in_process(hosts, Path(tmp) / "local")
        conf_s, conf_cpu, conf = local["slurm.conf"]
        etc_s, etc_cpu, etc_hosts = local["hosts"]
        conf_bytes, conf_lines = describe(conf)
        node_lines = sum(line.startswith("NodeName=") for line in conf.splitlines())
        hosts_bytes, hosts_lines = describe(etc_hosts)
        out.update(
            inventory_s=local["inventory"][0],
            inventory_cpu_s=local["inventory"][1],
            slurm_conf_render_s=conf_s,
            hosts_render_s=etc_s,
            slurm_conf_bytes=conf_bytes,
            slurm_conf_lines=conf_lines,
            node_lines=node_lines,
            hosts_bytes=hosts_bytes,
            hosts_lines=hosts_lines,
        )
        print(
            f"in-process: inventory loaded in {local['inventory'][0]:.2f} s "
            f"({local['inventory'][1]:.2f} s CPU)",
            flush=True,
        )
        print(
            f"  slurm.conf rendered in {conf_s:.2f} s ({conf_cpu:.2f} s CPU): "
            f"{conf_bytes / 1024:.1f} KiB, {conf_lines} lines, {node_lines} NodeName lines",
            flush=True,
        )
        print(
            f"  /etc/hosts rendered in {etc_s:.2f} s ({etc_cpu:.2f} s CPU): "
            f"{hosts_bytes / 1024:.1f} KiB, {hosts_lines} lines",
            flush=True,
        )
        for line in conf.splitlines():
            if line.startswith(("NodeName=", "PartitionName=")):
                print(f"    {line if len(line) <= 160 else line[:157] + '...'}", flush=True)
        out["render_cpu_s"] = conf_cpu + etc_cpu
        out["render_s"] = conf_s + etc_s
        print(
            f"render (both templates): {out['render_s']:.2f} s, "
            f"{out['render_cpu_s']:.2f} s CPU; {verdict(out['render_s'], out['render_cpu_s'])}",
            flush=True,
        )

        render_dir = Path(tmp) / "render"
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu_before = children.ru_utime + children.ru_stime
        start = time.monotonic()
        sh(
            [
                str(BIN / "ansible-playbook"),
                "-i",
                str(hosts),
                "playbooks/render-slurm-config.yml",
                "--limit",
                HOST,
                "-e",
                f"slurm_render_dir={render_dir}",
                "-e",
                "vault_slurm_dbd_db_password=bench",
            ],
            {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
        )
        out["playbook_s"] = time.monotonic() - start
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["playbook_cpu_s"] = children.ru_utime + children.ru_stime - cpu_before
        files = [(render_dir / HOST / name).read_text() for name in ("slurm.conf", "hosts")]
        same = files == [conf, etc_hosts]
        out["playbook_matches_render"] = same
        print(
            f"ansible-playbook render-slurm-config.yml --limit {HOST}: "
            f"{out['playbook_s']:.1f} s wall, {out['playbook_cpu_s']:.1f} s CPU; "
            f"{verdict(out['playbook_s'], out['playbook_cpu_s'])}; its slurm.conf and hosts are "
            f"{'identical to' if same else 'DIFFERENT from'} the in-process render",
            flush=True,
        )
        if not same:
            sys.exit("bench: the playbook rendered different files than the in-process render")
    return 0


if __name__ == "__main__":
    sys.exit(main())
