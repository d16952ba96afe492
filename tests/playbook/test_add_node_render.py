"""Adding a node changes only the controller and the new node (issue [15]): the files the
real run writes (playbooks/render-cluster-files.yml, slurm_render_dir/<host>/root/) for
the example inventory (8 GPU nodes) and for it with a ninth, rendered for a host of every
class. Without the cluster DNS every host's /etc/hosts changes too: the DNS is what makes
the difference. bench/render_scale.py --add-node does the same at 4,096 nodes.

The five inventory variants render in ONE ansible-playbook run (they were five runs at
once, 300-425 s each beside the labs of `make test`). Each variant is two plays: one on
this machine puts the variant's hosts.yml into the run's inventory directory and reloads
it (`meta: refresh_inventory`), then render-cluster-files.yml's play itself, read from
the file, on the variant's hosts (what `--limit` selected), with slurm_render_dir and the
variant's settings as play variables (they were extra variables: no role or inventory
file sets them above play variables, so they win the same way). The hosts keep their
real names and each variant sees its whole inventory, as site.yml would: `groups` and
`hostvars` are what the templates walk, and one inventory cannot give a host two sets of
them (prefixed host names, or several `-i` at once, would change the very names the
files hold). Only hosts.yml differs between the variants, so the group_vars and host_vars
Ansible keeps loaded are the same files; what a variant's tasks set (set_fact) is set
again for every host the next variant renders.

The run uses the mitogen_linear strategy (make demo's; test_mitogen_strategy.py keeps it
working): the same tasks and modules, in one Python per host instead of one per module.
Measured on a loaded 2-core machine: five linear runs at once 240 s, one linear run
282 s (the work is the 340 file tasks, a Python each for every module they run, not
the runs' start), one mitogen_linear run 55 s; all three wrote the same 276 files, byte
for byte and mode for mode."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env

NEW = "gpu09"
NEW_ADDRESS = "10.10.1.9"
# A host of every class: controller (+ DNS, Prometheus, accounting), login, compute;
# gpu08 only before the addition, to compare two compute nodes.
OLD_SAMPLE = ["ctl1", "login1", "gpu01"]
# A setting slurmd loads only as it starts: `scontrol reconfigure` would not apply it.
START_SETTING = {"slurm_task_plugin": "task/affinity"}
RENDER_GUARD_SECONDS = 1500
# label: (with the cluster DNS, with gpu09, the hosts rendered, settings changed)
VARIANTS = {
    "before": (True, False, [*OLD_SAMPLE, "gpu08"], {}),
    "after": (True, True, [*OLD_SAMPLE, NEW], {}),
    "before-no-dns": (False, False, ["ctl1", "gpu01"], {}),
    "after-no-dns": (False, True, ["ctl1", "gpu01"], {}),
    "before-new-plugin": (True, False, ["ctl1", "gpu01"], START_SETTING),
}


def example_hosts(dest: Path, *, with_new_node: bool, with_dns: bool) -> Path:
    """inventory/example/hosts.yml, with gpu09 in every group gpu08 is in, and/or without
    the cluster_dns group."""
    hosts = yaml.safe_load((ROOT / "inventory/example/hosts.yml").read_text())
    if with_new_node:
        hosts["all"]["hosts"][NEW] = {"ansible_host": NEW_ADDRESS}
        for group in hosts["all"]["children"].values():
            if "gpu08" in (group.get("hosts") or {}):
                group["hosts"] = {**group["hosts"], NEW: None}
    if not with_dns:
        del hosts["all"]["children"]["cluster_dns"]
    dest.write_text(yaml.safe_dump(hosts))
    return dest


def render_plays(inventory: Path, base: Path) -> list[dict]:
    """Per variant: its hosts.yml into the inventory directory, then the render play on
    its hosts, into base/<label>."""
    (render,) = yaml.safe_load((ROOT / "playbooks/render-cluster-files.yml").read_text())
    assert render["hosts"] == "all" and "vars" not in render, render
    plays = []
    for label, (dns, new, hosts, settings) in VARIANTS.items():
        variant = example_hosts(base / f"hosts-{label}.yml", with_new_node=new, with_dns=dns)
        copy = {"argv": ["cp", str(variant), str(inventory / "hosts.yml")]}
        switch = [
            {"name": "Its hosts.yml", "ansible.builtin.command": copy, "changed_when": False},
            {"name": "Reload the inventory", "ansible.builtin.meta": "refresh_inventory"},
        ]
        plays += [
            {
                "name": f"{label}: the inventory",
                "hosts": "localhost",
                "gather_facts": False,
                "tasks": switch,
            },
            {
                **render,
                "name": f"{label}: {render['name']}",
                "hosts": ",".join(hosts),
                "vars": {"slurm_render_dir": str(base / label), **settings},
            },
        ]
    return plays


def written_files(render_dir: Path, host: str) -> dict[str, bytes]:
    """What the run writes on host, by path."""
    root = render_dir / host / "root"
    return {
        "/" + str(path.relative_to(root)): path.read_bytes()
        for path in root.rglob("*")
        if path.is_file()
    }


def changed_paths(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, Path]:
    """Five renders in one run: with and without the cluster DNS, before and after gpu09
    joins, and before it with a setting slurmd loads only as it starts changed."""
    base = tmp_path_factory.mktemp("add-node")
    inventory = base / "inventory"
    shutil.copytree(ROOT / "inventory/example", inventory)
    playbook = base / "render-variants.yml"
    playbook.write_text(yaml.safe_dump(render_plays(inventory, base), sort_keys=False))
    env = ansible_env(base / "facts")
    # A guard against a hung run, not a timing: the run shares the CPUs with the labs
    # that converge beside this module in `make test`.
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(inventory),
            str(playbook),
            "-e",
            "vault_slurm_dbd_db_password=unit-test",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=RENDER_GUARD_SECONDS,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    return {label: base / label for label in VARIANTS}


def test_a_node_joining_changes_only_the_controller_and_itself(renders):
    for label, hosts in (("before", OLD_SAMPLE), ("after", [*OLD_SAMPLE, NEW])):
        assert all(written_files(renders[label], host) for host in hosts), label
    changed = {
        host: changed_paths(
            written_files(renders["before"], host), written_files(renders["after"], host)
        )
        for host in [*OLD_SAMPLE, NEW]
    }
    assert {host for host, paths in changed.items() if paths} == {"ctl1", NEW}
    # The controller: the node list (slurm.conf, gres.conf) and the DNS's records; not
    # Prometheus (it finds targets through the DNS).
    assert changed["ctl1"] == [
        "/etc/dnsmasq.d/tacc-cluster.conf",
        "/etc/slurm/gres.conf",
        "/etc/slurm/slurm.conf",
        "/etc/tacc-dns/hosts",
    ]
    assert (
        f"{NEW_ADDRESS}\t{NEW}.cluster.internal\t{NEW}"
        in (renders["after"] / "ctl1/root/etc/tacc-dns/hosts").read_text().splitlines()
    )


def test_the_new_node_gets_what_an_old_compute_node_gets(renders):
    old = written_files(renders["before"], "gpu08")
    new = written_files(renders["after"], NEW)
    assert sorted(new) == sorted(old)
    assert "/etc/slurm/slurm.conf" not in new  # configless: fetched from the controller
    assert b'SLURMD_OPTIONS="--conf-server ' in new["/etc/default/slurmd"]


def test_old_compute_nodes_differ_by_their_name_and_address_only(renders):
    """Why a sample of compute nodes stands for all of them (bench/render_scale.py)."""
    first = written_files(renders["before"], "gpu01")
    last = written_files(renders["before"], "gpu08")
    assert changed_paths(first, last) == ["/etc/hostname", "/etc/hosts"]
    swap = {"gpu01": "gpu08", "10.10.1.1": "10.10.1.8"}
    pattern = re.compile(r"(?<![\w.])gpu01(?!\w)|(?<![\d.])10\.10\.1\.1(?!\d)")
    as_last = {
        path: pattern.sub(lambda m: swap[m.group(0)], text.decode()).encode()
        for path, text in first.items()
    }
    assert as_last == last


def test_a_setting_slurmd_loads_as_it_starts_restarts_every_configless_slurmd(renders):
    """Configless nodes keep no slurm.conf to notice the change by: their slurmd options
    file carries a digest of those settings, and its change restarts slurmd."""
    for host, wanted in (("gpu01", ["/etc/default/slurmd"]), ("ctl1", ["/etc/slurm/slurm.conf"])):
        before = written_files(renders["before"], host)
        after = written_files(renders["before-new-plugin"], host)
        assert changed_paths(before, after) == wanted, host
    options = written_files(renders["before-new-plugin"], "gpu01")["/etc/default/slurmd"]
    assert re.search(rb"^# start settings: [0-9a-f]{64}$", options, re.M), options


def test_without_the_cluster_dns_every_hosts_etc_hosts_changes(renders):
    """The same addition with every node's /etc/hosts listing every host."""
    for host in ("ctl1", "gpu01"):
        before = written_files(renders["before-no-dns"], host)
        after = written_files(renders["after-no-dns"], host)
        assert "/etc/hosts" in changed_paths(before, after), host
        assert f"{NEW_ADDRESS}\t{NEW}" in after["/etc/hosts"].decode().splitlines()
        assert "/etc/resolv.conf" not in after


def test_secrets_are_written_for_the_operator_only(renders):
    root = renders["before"] / "ctl1/root/etc"
    for path in (root / "slurm/slurmdbd.conf", root / "prometheus/alertmanager.yml"):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_the_unit_drop_in_is_the_one_the_slurm_role_writes():
    """render_local writes vars/main.yml's slurm_configless_unit_dropin; configure.yml
    must write the same text."""
    tasks = yaml.safe_load((ROOT / "roles/slurm/tasks/configure.yml").read_text())
    dropin = yaml.safe_load((ROOT / "roles/slurm/vars/main.yml").read_text())
    (task,) = [t for t in tasks if t["name"] == "Let slurmd start without a local slurm.conf"]
    content = task["ansible.builtin.copy"]["content"]
    assert content in (dropin["slurm_configless_unit_dropin"], "{{ slurm_configless_unit_dropin }}")
    assert task["ansible.builtin.copy"]["dest"] in (
        f"{dropin['slurm_unit_dropin_dir']}/tacc-configless.conf",
        "{{ slurm_unit_dropin_dir }}/tacc-configless.conf",
    )
