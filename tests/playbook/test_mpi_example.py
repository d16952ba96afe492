"""examples/mpi-allreduce and the MPI settings, without MPI: the example's checks (sum,
nodes, ranks per node) on given rank layouts, its main() with a stand-in for mpi4py, both
task files; slurm.conf's MpiDefault and the mpi role's MCA file rendered by Ansible.

The real runs (4 ranks, 2 per node, through srun and through mpirun) are on the lab:
docs/provisioning.md, "MPI".
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import types

import pytest
import yaml

from tcloud.compile.task_file import load_task
from tests.conftest import BIN, ROOT
from tests.playbook.local_ansible import ansible_env
from tests.playbook.slurm_render import SLURM_ONLY, render

EXAMPLE = ROOT / "examples" / "mpi-allreduce"


def load_allreduce():
    spec = importlib.util.spec_from_file_location("allreduce", EXAMPLE / "allreduce.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


allreduce = load_allreduce()


@pytest.mark.parametrize(("size", "total"), [(1, 1), (2, 3), (4, 10), (16, 136)])
def test_expected_sum_is_n_times_n_plus_1_over_2(size, total):
    assert allreduce.expected_sum(size) == total == sum(rank + 1 for rank in range(size))


def test_ranks_per_node_counts_each_host():
    assert allreduce.ranks_per_node(["n3", "n2", "n2", "n3"]) == {"n2": 2, "n3": 2}
    assert list(allreduce.ranks_per_node(["b", "a", "b"])) == ["a", "b"]  # sorted


def test_a_right_run_has_no_problems():
    hosts = ["n2", "n2", "n3", "n3"]
    assert allreduce.problems(4, 10, hosts, nodes=2, per_node=2) == []
    assert allreduce.problems(4, 10, hosts) == []  # nothing asked beyond the sum


def test_a_wrong_sum_is_a_problem():
    (problem,) = allreduce.problems(4, 9, ["n2", "n2", "n3", "n3"])
    assert problem == "allreduce sum 9, expected 10 for 4 ranks"


def test_one_rank_per_node_when_two_were_asked_is_a_problem():
    """What a launcher that ignores --ntasks-per-node gives: 2 ranks, sum right."""
    (problem,) = allreduce.problems(2, 3, ["n2", "n3"], nodes=2, per_node=2)
    assert problem == "expected 2 ranks on every node, got {'n2': 1, 'n3': 1}"


def test_all_ranks_on_one_node_is_a_problem():
    found = allreduce.problems(4, 10, ["n2"] * 4, nodes=2, per_node=2)
    assert found == [
        "ranks ran on 1 node(s), expected 2: {'n2': 4}",
        "expected 2 ranks on every node, got {'n2': 4}",
    ]


def test_rank_line():
    line = allreduce.rank_line(3, 4, "n3", 10)
    assert line == "rank 3/4 on n3: allreduce sum 10 (expected 10) OK"
    assert allreduce.rank_line(0, 4, "n2", 7).endswith("(expected 10) WRONG")


def fake_mpi4py(monkeypatch, rank: int, size: int, total: int, hosts: list[str]) -> None:
    """mpi4py as rank `rank` of a run whose allreduce gives `total` and whose ranks ran
    on `hosts`."""

    class Comm:
        def Get_rank(self):  # mpi4py's names
            return rank

        def Get_size(self):
            return size

        def allreduce(self, value, op):
            assert (value, op) == (rank + 1, "SUM")
            return total

        def allgather(self, value):
            return hosts

        def Barrier(self):
            pass

    mpi = types.SimpleNamespace(COMM_WORLD=Comm(), SUM="SUM")
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=mpi))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", mpi)
    monkeypatch.setattr(allreduce.socket, "gethostname", lambda: hosts[rank])


def test_main_rank_0_prints_the_layout_and_writes_the_json(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TACC_WORKDIR", str(tmp_path))
    fake_mpi4py(monkeypatch, 0, 4, 10, ["n2", "n2", "n3", "n3"])
    assert allreduce.main(["--nodes", "2", "--ranks-per-node", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "rank 0/4 on n2: allreduce sum 10 (expected 10) OK",
        "ranks per node: {'n2': 2, 'n3': 2}",
        "allreduce OK: 4 ranks on 2 node(s)",
    ]
    assert json.loads((tmp_path / "outputs" / "allreduce.json").read_text()) == {
        "size": 4,
        "sum": 10,
        "expected": 10,
        "per_node": {"n2": 2, "n3": 2},
    }


def test_main_fails_when_ranks_per_node_are_wrong(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TACC_WORKDIR", str(tmp_path))
    fake_mpi4py(monkeypatch, 0, 2, 3, ["n2", "n3"])
    assert allreduce.main(["--nodes", "2", "--ranks-per-node", "2"]) == 1
    captured = capsys.readouterr()
    assert "rank 0/2 on n2: allreduce sum 3 (expected 3) OK" in captured.out
    assert "FAILED: expected 2 ranks on every node, got {'n2': 1, 'n3': 1}" in captured.err
    assert "allreduce OK" not in captured.out


def test_main_other_ranks_print_one_line_and_write_nothing(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("TACC_WORKDIR", str(tmp_path))
    fake_mpi4py(monkeypatch, 3, 4, 10, ["n2", "n2", "n3", "n3"])
    assert allreduce.main([]) == 0
    assert capsys.readouterr().out == "rank 3/4 on n3: allreduce sum 10 (expected 10) OK\n"
    assert not (tmp_path / "outputs").exists()


# Real mpi4py runs in the lab (tests/integration/test_frameworks.py), never skipped.


@pytest.mark.parametrize(("name", "launcher"), [("tcloud.yaml", "mpirun"), ("srun.yaml", "srun")])
def test_task_files_ask_for_2_nodes_by_2_ranks(name, launcher):
    task = load_task(EXAMPLE / name)
    assert task.runtime["launcher"] == launcher
    assert task.resources["nodes"] == 2 and task.resources["processes_per_node"] == 2
    assert task.environment["requirements"] == []  # mpi4py comes from the OS
    assert task.run == ["python3 allreduce.py --nodes 2 --ranks-per-node 2"]
    assert "outputs/" in task.outputs


def test_the_readme_names_both_task_files():
    readme = (EXAMPLE / "README.md").read_text()
    assert "tcloud submit examples/mpi-allreduce" in readme
    assert "tcloud submit examples/mpi-allreduce/srun.yaml" in readme


def test_slurm_conf_mpi_default(tmp_path):
    """Default pmix (what Debian 12's OpenMPI works with), or the inventory's choice."""
    render(tmp_path / "default", "--limit", "ctl1", *SLURM_ONLY)
    render(tmp_path / "pmi2", "--limit", "ctl1", "-e", "slurm_mpi_default=pmi2", *SLURM_ONLY)
    default = (tmp_path / "default/ctl1/slurm.conf").read_text().splitlines()
    chosen = (tmp_path / "pmi2/ctl1/slurm.conf").read_text().splitlines()
    assert [line for line in default if line.startswith("Mpi")] == ["MpiDefault=pmix"]
    assert [line for line in chosen if line.startswith("Mpi")] == ["MpiDefault=pmi2"]


MCA_PLAY = """
- name: Render the mpi role's MCA file with each host's variables
  hosts: all
  gather_facts: false
  tasks:
    - name: Render
      ansible.builtin.template:
        src: "{root}/roles/mpi/templates/openmpi-mca-params.conf.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}.conf"
        mode: "0644"
    - name: Render Slurm's mpi.conf
      ansible.builtin.template:
        src: "{root}/roles/mpi/templates/mpi.conf.j2"
        dest: "{out}/{{{{ inventory_hostname }}}}.mpi.conf"
        mode: "0644"
"""


def test_mca_params_file(tmp_path):
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {
        "debian": local,
        "lab": {**local, "mpi_tcp_networks": ["10.77.0.0/24"]},
        "ib": {
            **local,
            "mpi_tcp_networks": ["ib0", "eth1"],
            "mpi_mca_extra_params": {"pml": "ucx", "osc": "ucx"},
            "mpi_pmix_env": {"PMIX_MCA_gds": "hash", "PMIX_DEBUG": 1},
        },
        "plain": {**local, "mpi_pmix_env": {}},
    }
    # The role's defaults as group variables: host variables win over them, as over
    # role defaults.
    defaults = yaml.safe_load((ROOT / "roles/mpi/defaults/main.yml").read_text())
    inventory = {"all": {"vars": defaults, "hosts": hosts}}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump(inventory))
    (tmp_path / "play.yml").write_text(MCA_PLAY.format(root=ROOT, out=tmp_path))
    proc = subprocess.run(
        [
            str(BIN / "ansible-playbook"),
            "-i",
            str(tmp_path / "hosts.yml"),
            str(tmp_path / "play.yml"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
        env=ansible_env(tmp_path / "facts"),
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr

    def params(host: str) -> list[str]:
        text = (tmp_path / f"{host}.conf").read_text()
        return [line for line in text.splitlines() if line and not line.startswith("#")]

    debian = [  # Debian's own openmpi-mca-params.conf: no RDMA components, no warning
        "btl = ^uct,openib,ofi",
        "btl_base_warn_component_unused = 0",
        "mtl = ^ofi",
        "osc = ^ucx,pt2pt",
        "pml = ^ucx",
    ]
    assert params("debian") == debian
    assert params("lab") == [
        *debian[:2],
        "btl_tcp_if_include = 10.77.0.0/24",
        "mtl = ^ofi",
        "oob_tcp_if_include = 10.77.0.0/24",
        *debian[3:],
    ]
    assert params("ib") == [
        *debian[:2],
        "btl_tcp_if_include = ib0,eth1",
        "mtl = ^ofi",
        "oob_tcp_if_include = ib0,eth1",
        "osc = ucx",
        "pml = ucx",
    ]
    # mpi.conf: the PMIx data store workaround by default, several variables joined by ';'.
    assert params("debian.mpi") == ["PMIxEnv=PMIX_MCA_gds=hash"]
    assert params("ib.mpi") == ["PMIxEnv=PMIX_DEBUG=1;PMIX_MCA_gds=hash"]
    assert params("plain.mpi") == []
