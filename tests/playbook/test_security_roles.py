"""Issue [10] points 1, 2 and 18 (first half), checked on what the roles render and do
without a lab (real ansible-playbook runs on this machine, files in a temporary
directory, --tags so no role task touches the machine):

1. shared storage is exported only to the cluster's own hosts, root squashed, and
   mounted nosuid,nodev; the users' workspaces are made on the NFS server (root on a
   client is nobody there); every login and compute node of the example mounts it;
2. compute nodes admit a user's SSH only while the user has a job there
   (pam_slurm_adopt after an admins rule; pam_systemd kept out of adopted sessions),
   slurm.conf has PrologFlags=Contain and PrivateData;
18. the accounting database password reaches slurmdbd.conf so that Slurm's parser reads
   back exactly it, or is refused naming the variable and never printed.
"""

from __future__ import annotations

import importlib.util
import json
import random
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import jinja2
import pytest
import yaml

from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env
from tests.playbook.security_role_readers import (
    PAM_FILES,
    Login,
    pam_decision,
    pam_stack,
    slurm_value,
)

EXAMPLE = ROOT / "inventory/example"
LOCAL = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
# Test passwords: '#', spaces, backslashes, a double quote (without whitespace).
PASSWORDS = {
    "hash_space_backslash": "pa#ss wo\\rd \\#  tail\\",
    "hash_quote": 'p#a"ss\\\\#x"',
    "plain": "unit-test",
}
UNREADABLE_PASSWORD = 'has "quote and space'  # noqa: S105 (a test value)
CLUSTER_HOSTS = ["10.10.0.11"] + [f"10.10.1.{n}" for n in range(1, 9)]  # login1, gpu01-08


def ansible_playbook(
    inventory: Path, play: list[dict], tmp: Path, *extra: str
) -> subprocess.CompletedProcess:
    path = tmp / f"play-{len(list(tmp.glob('play-*')))}.yml"
    path.write_text(yaml.safe_dump(play, sort_keys=False))
    env = ansible_env(tmp / "facts")
    return subprocess.run(
        [str(BIN / "ansible-playbook"), "-i", str(inventory), str(path), *extra],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=600,
        check=False,
    )


def render_task(template: str, dest: str, **task: object) -> dict:
    """A play-level task rendering one role template into the output directory."""
    return {
        "name": f"Render {template}",
        "ansible.builtin.template": {
            "src": str(ROOT / "roles" / template),
            "dest": dest,
            "mode": "0644",
        },
        "delegate_to": "localhost",
        "tags": ["render"],
        **task,
    }


def render_play(hosts: str, role: str, tasks: list[dict]) -> dict:
    """The role's defaults and filters in scope; only its validation runs (--tags render)."""
    return {
        "name": f"Render {role}",
        "hosts": hosts,
        "gather_facts": False,
        "roles": [{"role": role}],
        "tasks": tasks,
    }


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    """The example inventory's files, rendered by the roles' own templates: out/<host>/."""
    tmp = tmp_path_factory.mktemp("security-roles")
    out = tmp / "out"
    host_dir = f"{out}/{{{{ inventory_hostname }}}}"
    mkdir = {
        "name": "Output directory",
        "ansible.builtin.file": {"path": host_dir, "state": "directory", "mode": "0755"},
        "delegate_to": "localhost",
        "tags": ["render"],
    }
    plays = [
        render_play(
            "nfs_server",
            "nfs_server",
            [
                mkdir,
                render_task("nfs_server/templates/exports.j2", f"{host_dir}/exports"),
                render_task("nfs_server/templates/ganesha.conf.j2", f"{host_dir}/ganesha.conf"),
            ],
        ),
        render_play(
            "nfs_clients",
            "nfs_client",
            [
                mkdir,
                render_task(
                    "nfs_client/templates/nfs.mount.j2",
                    f"{host_dir}/{{{{ item.path | tacc_systemd_path_unit('mount') }}}}",
                    loop="{{ nfs_client_mounts + [{'src': 'ctl1:/srv/scratch', "
                    "'path': '/scratch', 'options': ['vers=3', 'hard']}] }}",
                ),
            ],
        ),
        render_play(
            "login",
            "tacc_agent",
            [
                mkdir,
                {
                    "name": "Where the workspaces are made",
                    "ansible.builtin.copy": {
                        "content": "{{ {'server': tacc_agent_workspace_server,"
                        " 'path': tacc_agent_workspace_server_path} | to_json }}",
                        "dest": f"{host_dir}/workspace.json",
                        "mode": "0644",
                    },
                    "delegate_to": "localhost",
                    "tags": ["render"],
                },
            ],
        ),
        render_play(
            "slurm_controller",
            "slurm",
            [
                mkdir,
                {
                    "name": "OS names",
                    "tags": ["render"],
                    "ansible.builtin.include_vars": str(ROOT / "roles/slurm/vars/Debian.yml"),
                },
                render_task("slurm/templates/slurm.conf.j2", f"{host_dir}/slurm.conf"),
                render_task(
                    "slurm/templates/slurmdbd.conf.j2",
                    f"{host_dir}/slurmdbd-{{{{ item.key }}}}.conf",
                    loop="{{ test_passwords | dict2items }}",
                    vars={"slurm_dbd_db_password": "{{ item.value }}"},
                    no_log=True,
                ),
            ],
        ),
        render_play(
            "slurm_compute[0]",
            "slurm_pam_adopt",
            [
                mkdir,
                render_task("slurm_pam_adopt/templates/access.conf.j2", f"{host_dir}/access.conf"),
                render_task(
                    "slurm_pam_adopt/templates/sshd_config.conf.j2", f"{host_dir}/sshd.conf"
                ),
            ],
        ),
    ]
    extra = tmp / "extra.json"
    extra.write_text(
        json.dumps({"vault_slurm_dbd_db_password": "unit-test", "test_passwords": PASSWORDS})
    )
    proc = ansible_playbook(EXAMPLE, plays, tmp, "--tags", "render", "-e", f"@{extra}")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return out


def role_filter(role: str, name: str) -> ModuleType:
    """roles/<role>/filter_plugins/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(
        name, ROOT / f"roles/{role}/filter_plugins/{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- 1: shared storage


@pytest.mark.security
def test_p1_the_export_admits_only_the_cluster_hosts_with_root_squashed(rendered):
    exports = [
        line
        for line in (rendered / "ctl1/exports").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert len(exports) == 1
    path, *clients = exports[0].split()
    assert path == "/srv/shared"
    assert clients == [
        f"{host}(rw,sync,no_subtree_check,root_squash,secure)" for host in CLUSTER_HOSTS
    ]
    ganesha = (rendered / "ctl1/ganesha.conf").read_text()
    assert f"Clients = {', '.join(CLUSTER_HOSTS)};" in ganesha
    assert "Squash = Root_Squash;" in ganesha and "No_Root_Squash" not in ganesha
    # Anyone else reaching port 2049 gets nothing: the export itself admits no one.
    assert "    Access_Type = None;" in ganesha


@pytest.mark.security
def test_p1_every_export_answers_only_privileged_ports(rendered):
    """AUTH_SYS believes the uid a call claims: only calls from a port below 1024 (which
    only root on a client binds) are answered, so a user's userspace NFS client cannot
    claim another uid. Ganesha: PrivilegedPort on the defaults (the NFSv4 pseudo root),
    every EXPORT and every CLIENT block; the kernel server: `secure` on every client."""
    ganesha = (rendered / "ctl1/ganesha.conf").read_text()
    blocks = re.findall(r"^\s*(EXPORT_DEFAULTS|EXPORT|CLIENT) \{", ganesha, re.MULTILINE)
    settings = re.findall(r"^\s*PrivilegedPort = (\w+);", ganesha, re.MULTILINE)
    assert blocks and len(settings) == len(blocks), (blocks, settings)
    assert set(settings) == {"true"}, settings
    exports = (rendered / "ctl1/exports").read_text()
    assert "insecure" not in exports
    for line in exports.splitlines():
        if line and not line.startswith("#"):
            assert all("secure" in client.split("(")[1] for client in line.split()[1:]), line


@pytest.mark.security
def test_p1_the_roles_default_export_is_root_squashed_to_inventory_hosts():
    defaults = yaml.safe_load((ROOT / "roles/nfs_server/defaults/main.yml").read_text())
    (export,) = defaults["nfs_server_exports"]
    assert "root_squash" in export["options"] and "no_root_squash" not in export["options"]
    assert export["clients"] == "{{ nfs_server_clients }}"
    assert defaults["nfs_server_client_groups"] == ["nfs_clients"]
    addresses = role_filter("nfs_server", "nfs_clients").tacc_nfs_group_addresses
    hostvars = {"a": {"ansible_host": "10.0.0.1"}, "b": {}, "c": {"ansible_host": "10.0.0.3"}}
    groups = {"nfs_clients": ["a", "b"], "login": ["c", "a"]}
    assert addresses(["nfs_clients", "login", "absent"], groups, hostvars) == [
        "10.0.0.1",
        "b",
        "10.0.0.3",
    ]


@pytest.mark.security
def test_p1_clients_mount_shared_storage_nosuid_nodev(rendered):
    for host in ("gpu01", "login1"):
        for unit in ("shared.mount", "scratch.mount"):  # the default options, and a mount's own
            options = next(
                line
                for line in (rendered / host / unit).read_text().splitlines()
                if line.startswith("Options=")
            )
            assert {"nosuid", "nodev"} <= set(options.removeprefix("Options=").split(",")), (
                host,
                unit,
            )


@pytest.mark.security
def test_p1_every_login_and_compute_node_of_the_example_mounts_shared_storage():
    children = yaml.safe_load((EXAMPLE / "hosts.yml").read_text())["all"]["children"]
    clients = set(children["nfs_clients"]["hosts"])
    for group in ("login", "slurm_compute"):
        missing = set(children[group]["hosts"]) - clients
        assert not missing, f"{group} hosts not in nfs_clients: {sorted(missing)}"


@pytest.mark.security
def test_p1_users_workspaces_are_made_on_the_nfs_server(rendered):
    """Root on login1 is nobody on the export: the directories are made on ctl1, at the
    export's path."""
    where = json.loads((rendered / "login1/workspace.json").read_text())
    assert where == {"server": "ctl1", "path": "/srv/shared/tcloud"}
    tasks = yaml.safe_load((ROOT / "roles/tacc_agent/tasks/main.yml").read_text())
    block = next(t for t in tasks if t["name"] == "Create the users' workspaces on shared storage")
    assert (
        block["delegate_to"]
        == "{{ tacc_agent_workspace_server | default(inventory_hostname, true) }}"
    )
    paths = [task["ansible.builtin.file"]["path"] for task in block["block"]]
    assert all(path.startswith("{{ tacc_agent_workspace_server_path }}") for path in paths)


def test_p1_the_workspace_server_follows_the_mount_that_holds_it():
    server = role_filter("tacc_agent", "workspace_server").tacc_workspace_server
    mounts = [
        {"src": "ctl1:/srv/shared", "path": "/shared"},
        {"src": "fs2:/export/tc", "path": "/shared/tcloud"},
    ]
    assert server("/shared/tcloud", mounts, ["ctl1", "fs2"]) == {
        "host": "fs2",
        "path": "/export/tc",
    }
    assert server("/shared/tcloud", mounts, ["ctl1"]) == {
        "host": "ctl1",
        "path": "/srv/shared/tcloud",
    }
    assert server("/shared2/tcloud", mounts, ["ctl1", "fs2"]) == {}
    assert (
        server("/shared/tcloud", [{"src": "nas.example.org:/x", "path": "/shared"}], ["ctl1"]) == {}
    )


@dataclass(frozen=True)
class Refused:
    proc: subprocess.CompletedProcess

    @property
    def output(self) -> str:
        return self.proc.stdout + self.proc.stderr

    def failed_task(self, host: str) -> str:
        task = ""
        for line in self.proc.stdout.splitlines():
            if line.startswith("TASK ["):
                task = line[len("TASK [") : line.rfind("]")]
            elif line.startswith((f"fatal: [{host}]", f"failed: [{host}]")):
                return task
        return "(none: the host did not fail)"


@pytest.fixture(scope="module")
def refused(tmp_path_factory) -> Refused:
    """The roles on this machine in check mode with variables they must refuse; each
    refusal comes before any task that installs or writes anything."""
    tmp = tmp_path_factory.mktemp("security-refused")
    hosts = {
        "badpass": {
            **LOCAL,
            "refused_role": "slurm",
            "slurm_accounting_enabled": True,
            "slurm_dbd_db_password": UNREADABLE_PASSWORD,
        },
        "noclients": {
            **LOCAL,
            "refused_role": "nfs_server",
            "nfs_server_client_groups": ["nfs_clients"],
        },
        # SSSD answering for IDs an inventory user has (alice, 2001).
        "idrange": {
            **LOCAL,
            "refused_role": "identity",
            "identity_ldap_uri": "ldap://ldap.example.org",
            "identity_ldap_base_dn": "dc=example,dc=org",
            "identity_ldap_bind_dn": "uid=sssd,ou=services,dc=example,dc=org",
            "identity_ldap_bind_password": "a-bind-password-of-the-test",
            "identity_ldap_ca_file": "/nonexistent/ca.pem",
            "identity_min_id": 2000,
            "common_cluster_users": [{"name": "alice", "uid": 2001}],
        },
        # A directory user named like an inventory user.
        "dirname": {
            **LOCAL,
            "refused_role": "directory_server",
            "directory_server_tls_ca_file": "/nonexistent/ca.pem",
            "directory_server_tls_cert_file": "/nonexistent/server.pem",
            "directory_server_tls_key_file": "/nonexistent/server.key",
            "directory_server_bind_password": "a-bind-password-of-the-test",
            "directory_server_users": [{"name": "alice", "uid": 20001}],
            "common_cluster_users": [{"name": "alice", "uid": 2001}],
        },
    }
    inventory = {
        "all": {
            "hosts": hosts,
            "children": {
                "slurm_controller": {"hosts": {"badpass": None}},
                "nfs_server": {"hosts": {"noclients": None}},
            },
        }
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    apply = {
        "name": "Apply the role",
        "ansible.builtin.include_role": {"name": "{{ refused_role }}"},
    }
    plays = [
        {
            "name": "Apply each host's role",
            "hosts": "all",
            "gather_facts": True,
            "gather_subset": ["min"],
            "tasks": [apply],
        }
    ]
    return Refused(ansible_playbook(tmp / "hosts.yml", plays, tmp, "--check"))


@pytest.mark.security
@pytest.mark.bad_input
def test_p1_an_export_that_names_no_clients_is_refused(refused):
    """Without a host in nfs_clients the default export would have no clients, which
    exportfs reads as everybody."""
    assert refused.proc.returncode != 0
    assert refused.failed_task("noclients") == "nfs_server : Refuse an export that names no clients"
    assert "nfs_server_exports: /srv/shared names no clients" in refused.output
    assert "Traceback" not in refused.output


@pytest.mark.security
@pytest.mark.bad_input
def test_d1_an_id_range_holding_an_inventory_users_uid_is_refused(refused):
    """A directory user numbered like alice would own her files."""
    assert refused.failed_task("idrange") == (
        "identity : Refuse an ID range that holds an inventory user's uid or gid"
    )
    assert "holds uids or gids of common_cluster_users (['alice'])" in refused.output
    assert "a-bind-password-of-the-test" not in refused.output


@pytest.mark.security
@pytest.mark.bad_input
def test_d1_a_directory_user_named_like_an_inventory_user_is_refused(refused):
    """Such an entry would lend the local account its password (pam_sss by name)."""
    assert refused.failed_task("dirname") == (
        "directory_server : Refuse a user or group the directory would get wrong"
    )
    assert '"alice" needs a name of' in refused.output
    assert "a-bind-password-of-the-test" not in refused.output


# ------------------------------------------------------------- 2: SSH only with a job


@pytest.mark.security
def test_p2_slurm_conf_contains_the_extern_step_and_private_data(rendered):
    conf = (rendered / "ctl1/slurm.conf").read_text().splitlines()
    assert "PrologFlags=Contain" in conf
    assert "PrivateData=accounts,events,jobs,reservations,usage,users" in conf
    dbd = (rendered / "ctl1/slurmdbd-plain.conf").read_text().splitlines()
    assert "PrivateData=accounts,events,jobs,reservations,usage,users" in dbd


def test_p2_the_daemon_that_reads_everyones_queue_runs_as_root():
    """LAS queue ticks (tacc_agent/queue_ticks.py) list every user's jobs from the agent
    daemon: as root it is exempt from PrivateData=jobs."""
    unit = (ROOT / "roles/tacc_agent/templates/tacc-agent.service.j2").read_text()
    assert not [line for line in unit.splitlines() if line.startswith(("User=", "DynamicUser=yes"))]


@dataclass(frozen=True)
class PamRuns:
    check: subprocess.CompletedProcess
    first: subprocess.CompletedProcess
    again: subprocess.CompletedProcess
    disabled: subprocess.CompletedProcess
    pam_after_check: str
    pam_enabled: str  # with accessfile= pointing at access_rules, the rules it wrote
    pam_disabled: str


@pytest.fixture(scope="module")
def pam_runs(tmp_path_factory) -> PamRuns:
    """The slurm_pam_adopt role run for real on this machine against a copy of Debian 12's
    /etc/pam.d/sshd (package and sshd tasks skipped): in check mode, twice, then off."""
    tmp = tmp_path_factory.mktemp("security-pam")
    pam_file, access_file = tmp / "sshd", tmp / "access.conf"
    shutil.copy(PAM_FILES / "debian12-pam.d-sshd", pam_file)
    node = {
        **LOCAL,
        "slurm_pam_adopt_admit_users": ["opsbot"],
        "slurm_pam_adopt_admit_groups": ["tacc_admins"],
        "slurm_proctrack_type": "proctrack/linuxproc",
    }
    inventory = {
        "all": {"hosts": {"gpu01": node}, "children": {"slurm_compute": {"hosts": {"gpu01": None}}}}
    }
    (tmp / "hosts.yml").write_text(yaml.safe_dump(inventory))
    play = [
        {
            "name": "Apply slurm_pam_adopt",
            "hosts": "slurm_compute",
            "gather_facts": True,
            "gather_subset": ["min"],
            "roles": [{"role": "slurm_pam_adopt"}],
        }
    ]
    common = (
        "-e",
        f"slurm_pam_adopt_pam_file={pam_file}",
        "-e",
        f"slurm_pam_adopt_access_file={access_file}",
        "--skip-tags",
        "slurm_pam_adopt_packages,slurm_pam_adopt_sshd",
    )

    def run(*extra: str) -> subprocess.CompletedProcess:
        proc = ansible_playbook(tmp / "hosts.yml", play, tmp, *common, *extra)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        return proc

    check = run("--check", "--diff")
    after_check = pam_file.read_text()
    first, again = run(), run()
    rules = tmp / "access.conf.kept"  # the "off" run removes access.conf
    shutil.copy(access_file, rules)
    enabled = pam_file.read_text().replace(f"accessfile={access_file} ", f"accessfile={rules} ")
    disabled = run("-e", "slurm_pam_adopt_enabled=false")
    return PamRuns(check, first, again, disabled, after_check, enabled, pam_file.read_text())


def recap_changed(proc: subprocess.CompletedProcess) -> int:
    line = next(line for line in proc.stdout.splitlines() if line.startswith("gpu01 "))
    return int(line.split("changed=")[1].split()[0])


def verdicts(pam_text: str, *logins: Login) -> list[bool]:
    stack = pam_stack(pam_text, "account")
    return [pam_decision(stack, login) for login in logins]


@pytest.mark.security
def test_p2_compute_nodes_admit_ssh_only_to_admins_and_users_with_a_job_there(pam_runs):
    no_job = Login("bob")
    idle_node = Login("bob", jobs_on_node=False)
    admitted = verdicts(
        pam_runs.pam_enabled,
        Login("root"),
        Login("opsbot"),
        Login("carol", groups=("tacc_admins",)),
        Login("alice", has_job_here=True),
        no_job,
        idle_node,
        Login("root", jobs_on_node=False),
        Login("carol", groups=("tacc_admins",), jobs_on_node=False),
    )
    assert admitted == [True, True, True, True, False, False, True, True]
    assert no_job.messages == [
        "Access denied by pam_slurm_adopt: you have no active jobs on this node"
    ]
    assert idle_node.messages == ["No Slurm jobs found on node."]
    # The stock file lets everyone in: what the role changed is what decides.
    stock = (PAM_FILES / "debian12-pam.d-sshd").read_text()
    assert pam_decision(pam_stack(stock, "account"), Login("bob"))


@pytest.mark.security
def test_p2_adopted_sessions_get_no_pam_systemd(pam_runs):
    """pam_systemd would move an adopted session out of the job's cgroup (SchedMD:
    disable it in every file sshd includes)."""
    modules = [line.module for line in pam_stack(pam_runs.pam_enabled, "session")]
    assert "pam_systemd.so" not in modules
    assert {"pam_loginuid.so", "pam_unix.so", "pam_limits.so", "pam_env.so"} <= set(modules)
    stock = [
        line.module
        for line in pam_stack((PAM_FILES / "debian12-pam.d-sshd").read_text(), "session")
    ]
    assert "pam_systemd.so" in stock


@pytest.mark.security
def test_p2_pam_changes_work_in_check_mode_are_idempotent_and_reversible(pam_runs):
    stock = (PAM_FILES / "debian12-pam.d-sshd").read_text()
    assert pam_runs.pam_after_check == stock  # check mode wrote nothing
    assert "+account    required     pam_slurm_adopt.so" in pam_runs.check.stdout  # --diff shows it
    assert recap_changed(pam_runs.first) > 0
    assert recap_changed(pam_runs.again) == 0, pam_runs.again.stdout[-3000:]
    assert "ProctrackType is proctrack/linuxproc" in pam_runs.first.stdout
    assert pam_runs.pam_disabled == stock  # slurm_pam_adopt_enabled: false restores it


@pytest.mark.security
def test_p2_sshd_runs_pam_and_admins_are_named_in_the_access_rules(rendered):
    assert "UsePAM yes" in (rendered / "gpu01/sshd.conf").read_text().splitlines()
    rules = [
        line
        for line in (rendered / "gpu01/access.conf").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert rules == ["+:root (tacc_admins):ALL", "-:ALL:ALL"]


@pytest.mark.security
def test_p2_site_playbook_applies_pam_slurm_adopt_to_compute_nodes():
    plays = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    slurm = next(i for i, p in enumerate(plays) if {"role": "slurm"} in p.get("roles", []))
    adopt = next(
        i for i, p in enumerate(plays) if {"role": "slurm_pam_adopt"} in p.get("roles", [])
    )
    assert plays[adopt]["hosts"] == "slurm_compute:!login" and adopt > slurm


# ------------------------------------------------------ 18: StoragePass in slurmdbd.conf


@pytest.mark.security
@pytest.mark.parametrize("name", sorted(PASSWORDS))
def test_p18_storage_pass_reads_back_through_slurms_parser(rendered, name):
    conf = (rendered / f"ctl1/slurmdbd-{name}.conf").read_text().splitlines()
    (line,) = [line for line in conf if line.startswith("StoragePass=")]
    assert slurm_value(line) == ("StoragePass", PASSWORDS[name])


@pytest.mark.security
def test_p18_every_value_reads_back_or_is_refused():
    conf_value = role_filter("slurm", "conf_value")
    alphabet = 'ab# \t\\"=\x01\u00e9\u2028\n'
    rng = random.Random(18)  # noqa: S311 (reproducible samples, not secrets)
    samples = ["", " ", "#", "\\", '"', "a b", "x\\#", *PASSWORDS.values()]
    samples += [
        "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)
    ]
    written = 0
    for value in samples:
        problem = conf_value.tacc_slurm_conf_value_problem(value)
        if problem:
            with pytest.raises(ValueError):
                conf_value.tacc_slurm_conf_value(value)
            continue
        line = f"StoragePass={conf_value.tacc_slurm_conf_value(value)}"
        assert slurm_value(line) == ("StoragePass", value), repr(value)
        written += 1
    assert written > 500


@pytest.mark.security
@pytest.mark.bad_input
def test_p18_a_password_slurmdbd_cannot_read_is_refused_and_never_printed(refused):
    assert refused.proc.returncode != 0
    assert (
        refused.failed_task("badpass")
        == "slurm : Refuse a database password slurmdbd.conf cannot hold"
    )
    assert "slurm_dbd_db_password contains both whitespace and a double quote" in refused.output
    assert UNREADABLE_PASSWORD not in refused.output
    assert "Traceback" not in refused.output


@pytest.mark.security
@pytest.mark.parametrize(("login", "admitted"), [("deploy", "deploy"), ("root", "root")])
def test_p2_the_account_ansible_logs_in_as_stays_admitted(login, admitted):
    """Ansible logging in as ssh's default user (no ansible_user set) must not be locked
    out by the rules it writes: the account the node saw (`id -un`) is admitted."""
    template = (ROOT / "roles/slurm_pam_adopt/templates/access.conf.j2").read_text()
    text = (
        jinja2.Environment(autoescape=False)  # noqa: S701
        .from_string(template)
        .render(
            ansible_managed="managed",
            slurm_pam_adopt_login={"stdout": login},
            slurm_pam_adopt_admit_users=["opsbot"],
            slurm_pam_adopt_admit_groups=["tacc_admins"],
        )
    )
    rules = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert rules[0].split(":")[1].split() == [
        "root",
        *([admitted] if admitted != "root" else []),
        "opsbot",
        "(tacc_admins)",
    ]
    assert rules[-1] == "-:ALL:ALL"


@pytest.mark.security
def test_p2_a_login_node_that_is_also_a_compute_node_keeps_admitting_researchers():
    """pam_slurm_adopt on a login node would refuse every researcher without a job, so
    nobody could submit one (a one-node lab is login and compute at once)."""
    site = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    play = next(p for p in site if {"role": "slurm_pam_adopt"} in p.get("roles", []))
    assert play["hosts"].split(":") == ["slurm_compute", "!login"]
