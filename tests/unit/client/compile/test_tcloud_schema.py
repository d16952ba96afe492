"""tcloud layer 1: task files are validated with file:line:column, field and expectation."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tcloud.compile.task_file import find_task_file, load_task
from tcloud.compile.template import render_template
from tcloud.errors import TaskFileError
from tests.conftest import run_cli

FILES = Path(__file__).parent / "tcloud_files"


def write(tmp_path: Path, text: str, name: str = "tcloud.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(TaskFileError) as caught:
        load_task(path)
    return [str(p) for p in caught.value.problems]


def test_init_template_is_a_valid_task(tmp_path):
    task = load_task(write(tmp_path, render_template("demo")))
    assert task.name == "demo"
    assert task.resources["gpus_per_node"] == 1
    assert task.runtime == {
        "launcher": "srun",
        "transport": "auto",
        "mpi": "none",
        "workdir": "job",
    }


def test_minimal_task_gets_defaults(tmp_path):
    task = load_task(write(tmp_path, "name: t\nrun: [echo hi]\n"))
    assert task.resources["nodes"] == 1 and task.resources["time"] is None
    assert task.code == {"workdir": ".", "include": ["**"], "exclude": []}
    assert task.base_dir == tmp_path.resolve()


def test_unknown_key_names_line_column_and_suggests(tmp_path):
    path = write(tmp_path, "name: t\nresources:\n  gpu_per_node: 2\nrun: [x]\n")
    [message] = problems(path)
    assert message.startswith(f"{path}:3:3: resources.gpu_per_node: unknown key")
    assert "did you mean 'gpus_per_node'?" in message


def test_every_problem_is_reported_in_file_order(tmp_path):
    path = write(
        tmp_path,
        "name: bad name\nresources:\n  nodes: zero\n  time: soon\n"
        "runtime: {transport: infiniband}\nrun: []\n",
    )
    found = problems(path)
    assert found == [
        f"{path}:1:7: name: expected a name of letters, digits, _.-, got 'bad name'",
        f"{path}:3:10: resources.nodes: expected a node count >= 1, or a range like 2-4"
        ", got 'zero'",
        f"{path}:4:9: resources.time: expected a Slurm time, got 'soon'",
        f"{path}:5:22: runtime.transport: expected one of auto, rdma, tcp, got 'infiniband'",
        f"{path}:6:6: run: expected at least one entry, got []",
    ]


def test_missing_required_field(tmp_path):
    [message] = problems(write(tmp_path, "name: t\n"))
    assert message.endswith("run: missing; expected a list of shell lines")


def test_yaml_syntax_error_has_a_position(tmp_path):
    [message] = problems(write(tmp_path, "name: t\nrun: [a\n"))
    assert ":3:1: not valid YAML" in message


def test_datasets_need_exactly_one_source_and_unique_names(tmp_path):
    path = write(
        tmp_path,
        "name: t\nrun: [x]\ndatasets:\n  - {name: a, local: ./a, cluster: /a}\n"
        "  - {name: b, cluster: relative}\n  - {name: c}\n  - {name: c, cluster: /c}\n",
    )
    text = "\n".join(problems(path))
    assert "datasets[0]: expected exactly one of 'local' or 'cluster'" in text
    assert "datasets[1].cluster: expected an absolute path on the cluster" in text
    assert "datasets[2]: expected exactly one of 'local' or 'cluster'" in text
    assert "datasets[3].name: 'c' is used twice" in text


def test_env_names_must_be_shell_names(tmp_path):
    path = write(tmp_path, "name: t\nrun: [x]\nenvironment:\n  env: {1X: a, OK_1: b}\n")
    [message] = problems(path)
    assert ":4:9: environment.env.1X: expected a shell variable name" in message


def test_legacy_tuxiv_conf(tmp_path):
    shutil.copy(FILES / "tuxiv.conf", tmp_path / "tuxiv.conf")
    task = load_task(find_task_file(tmp_path))
    assert task.name == "legacy-job"
    assert task.run == ["python train.py --epochs 2"]
    assert task.resources["nodes"] == 2 and task.resources["gpus_per_node"] == 2
    assert task.resources["time"] == "1:00:00"
    assert task.resources["sbatch"] == {"exclusive": ""}
    assert task.environment["requirements"] == ["numpy==1.26", "tqdm==4.66.1"]
    assert task.environment["modules"] == ["cuda/12.2"]
    assert task.environment["env"] == {"FOO": "bar"}
    assert task.outputs == ["./log"]
    assert [(d.name, d.local) for d in task.datasets] == [("data", "./data")]


def test_legacy_errors_are_positioned_too(tmp_path):
    path = write(tmp_path, "entrypoint: [x]\njob:\n  nme: j\n", name="tuxiv.conf")
    text = "\n".join(problems(path))
    assert f"{path}:3:3: job.nme: unknown key (did you mean 'name'?)" in text
    assert "job.name: missing" in text


def test_cli_validate_exit_codes_and_no_traceback(tmp_path):
    write(tmp_path, "name: t\nresources: {nodes: 0}\nrun: [x]\n")
    proc = run_cli("tcloud", "validate", str(tmp_path))
    assert proc.returncode == 3
    assert "resources.nodes: expected a node count >= 1, or a range like 2-4, got 0" in proc.stderr
    assert "Traceback" not in proc.stderr
    missing = run_cli("tcloud", "validate", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr  # usage: no such path


def test_cli_init_writes_a_valid_file_once(tmp_path):
    proc = run_cli("tcloud", "init", str(tmp_path / "proj"))
    assert proc.returncode == 0, proc.stderr
    assert run_cli("tcloud", "validate", str(tmp_path / "proj")).returncode == 0
    again = run_cli("tcloud", "init", str(tmp_path / "proj"))
    assert again.returncode == 4 and "--force" in again.stderr


@pytest.mark.parametrize(
    ("resources", "per_node"),
    [
        (
            "{gpus_per_node: 8}",
            "CPUs: the partition's DefCpuPerGPU x 8 GPU(s), or 1 if it has none; "
            "memory: the partition's DefMemPerGPU x 8 GPU(s), or 4G if it has none",
        ),
        (
            "{gpus_per_node: 2, cpus_per_gpu: 6, mem: 100G}",
            "CPUs: 6 per GPU x 2; memory: 100G per node",
        ),
        ("{}", "CPUs: 1 per process; memory: 4G per node"),
        ("{gpus_per_node: 0.5}", "CPUs: 1 per process; memory: 4G per node"),  # a share
    ],
)
def test_validate_says_what_cpus_and_memory_the_job_will_get(tmp_path, resources, per_node):
    """Issue [22]: a task that names GPUs but not CPUs or memory gets the per-GPU
    defaults, never 1 CPU; `tcloud validate` says which."""
    (tmp_path / "tcloud.yaml").write_text(f"name: t\nrun: [x]\nresources: {resources}\n")
    proc = run_cli("tcloud", "validate", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert f"  per node: {per_node}\n" in proc.stdout
    as_json = run_cli("tcloud", "validate", "--json", str(tmp_path))
    assert f'"per_node": "{per_node}"' in as_json.stdout
