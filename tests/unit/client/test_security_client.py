"""Security, issue [10]: what a task file, an instruction or a cluster's answer may make
tcloud and the agent do. Points 4 (plug-in modules), 5 (local paths), 11 (the agent
re-checks every instruction) and 12 (trial names in downloads); point 6 (known_hosts) is
in test_security_client_ssh.py. Each test fails on the code before the fix."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tacc_agent import slurm
from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.slurm.nodes import node_of, partition_of
from tacc_agent.slurm.oneliner import parse_oneliner
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.schedule.cluster_shape import scheduling_nodes, scheduling_partitions
from tacc_agent.tasks.schedule.instruction import parse
from tacc_agent.tasks.store import delta as store
from tacc_contract.instruction import InvalidInstruction, digest_of
from tacc_contract.registry import PluginError, select
from tacc_plugins.sweep import MAX_TRIALS
from tcloud.compile import local_paths
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tcloud.errors import TaskFileError, TcloudError
from tcloud.transfer import files
from tests.unit.client.test_bad_input_tcloud import Sentinel, Tcloud, task_dir
from tests.unit.client.transfer.test_bad_input_transfer import FakeSFTP, everything_under
from tests.unit.plugins.test_plugins import NODES, PARTITIONS

pytestmark = pytest.mark.security

CANARY_MODULE = '''
"""Writes a canary file when imported: a task file must never get this far."""
import os
from pathlib import Path

from tacc_contract.plugins import Plugin

Path(os.environ["CANARY_FILE"]).write_text("imported")


class Canary(Plugin):
    name = "canary"
'''


@pytest.fixture
def tcloud(tmp_path):
    sentinel = Sentinel()
    yield Tcloud(tmp_path, sentinel)
    sentinel.close()


@pytest.fixture
def canary(tmp_path, monkeypatch) -> Path:
    """A module `canary_pkg.plugin` on sys.path; the path of the file its import writes."""
    package = tmp_path / "modules" / "canary_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(CANARY_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "modules"))
    monkeypatch.setenv("CANARY_FILE", str(tmp_path / "CANARY"))
    monkeypatch.delenv("TACC_PLUGINS", raising=False)
    yield tmp_path / "CANARY"
    sys.modules.pop("canary_pkg.plugin", None)
    sys.modules.pop("canary_pkg", None)


def write_task(directory: Path, task: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tcloud.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return directory / "tcloud.yaml"


def base(**extra) -> dict:
    return {"name": "t", "run": ["python train.py"], **extra}


# ------------------------------------------------------------ 4: plug-in modules
@pytest.mark.bad_input
def test_p4_task_file_cannot_import_an_arbitrary_module(tcloud, tmp_path, canary):
    """`plugins: [module.path]` in a task file: `tcloud validate` names the file, line
    and field and the known plug-ins, and imports nothing."""
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\nplugins: [canary_pkg.plugin]\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "modules"), *sys.path])}
    proc = tcloud("validate", env={**env, "CANARY_FILE": str(canary)}, cwd=project)
    stderr = tcloud.refused(
        proc, 3, "tcloud.yaml:3:11: plugins[0]: unknown plug-in 'canary_pkg.plugin'"
    )
    assert "available: allox, duration, elastic, fluid, gpu_share" in stderr
    assert not canary.exists()
    assert sorted(p.name for p in project.iterdir()) == ["tcloud.yaml"]


@pytest.mark.bad_input
def test_p4_venv_main_in_a_task_file_creates_nothing(tcloud, tmp_path):
    """The issue's own case: `plugins: ["venv.__main__"]` + `tcloud validate`."""
    project = task_dir(tmp_path / "p", 'name: t\nrun: [x]\nplugins: ["venv.__main__"]\n')
    tcloud.refused(tcloud("validate", cwd=project), 3, "plugins[0]: unknown plug-in")
    assert not (project / "validate").exists()


def test_p4_load_task_refuses_a_module_path_before_importing_it(tmp_path, canary):
    path = write_task(tmp_path / "p", base(plugins=["-duration", "+canary_pkg.plugin"]))
    with pytest.raises(
        TaskFileError,
        match=r"tcloud.yaml:\d+:\d+: plugins\[1\]: unknown "
        r"plug-in 'canary_pkg.plugin'; available: allox, duration",
    ):
        load_task(path, [])
    assert not canary.exists() and "canary_pkg.plugin" not in sys.modules


def test_p4_the_agent_refuses_a_module_path_in_an_instruction(tmp_path, canary):
    """The cluster side: an instruction naming a module is refused by `parse` and by the
    scheduling layer's selection, and nothing is imported on the cluster either."""
    document = compile_task(load_task(write_task(tmp_path / "p", base()), [])).document
    document["task"]["plugins"] = ["canary_pkg.plugin"]
    with pytest.raises(InvalidInstruction, match=r"task\.plugins: unknown plug-in 'canary_pkg"):
        parse(json.dumps(document), "instruction.json")
    task = parse(json.dumps({**document, "task": {**document["task"], "plugins": []}}), "i")
    crafted = dataclasses.replace(task, plugins=["canary_pkg.plugin"])
    with pytest.raises(Rejected, match=r"unknown plug-in 'canary_pkg\.plugin'"):
        schedule.cluster_plugins(crafted, AgentConfig())
    assert not canary.exists()


def test_p4_module_paths_still_come_from_the_operator_and_the_environment(canary):
    with pytest.raises(PluginError, match="a task names registered plug-ins only"):
        select([], task=["canary_pkg.plugin"])
    assert not canary.exists()
    on = {p.name for p in select(["canary_pkg.plugin"], task=["canary"])}
    assert "canary" in on and canary.exists()


# ------------------------------------------------------------ 5: local paths
@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """A home directory with an SSH key, as HOME."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.bad_input
def test_p5_a_dataset_outside_the_task_directory_needs_the_flag(tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.csv").write_text("1,2\n")
    path = write_task(tmp_path / "p", base(datasets=[{"name": "d", "local": "../data"}]))
    with pytest.raises(TaskFileError) as caught:
        load_task(path, [])
    message = str(caught.value)
    assert f"{path}:6:10: datasets[0].local: " in message
    assert "outside the task's directory" in message and "--allow-outside-paths" in message
    assert load_task(path, [], allow_outside=True).datasets[0].local == "../data"


@pytest.mark.bad_input
def test_p5_code_workdir_outside_needs_the_flag_and_submit_names_it(tcloud, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "train.py").write_text("print(1)\n")
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ncode: {workdir: ../src}\n")
    tcloud.refused(
        tcloud("submit", "--dry-run", str(project)),
        3,
        f"{project}/tcloud.yaml:3:",
        "code.workdir: ",
        "pass --allow-outside-paths",
    )
    proc = tcloud("submit", "--dry-run", "--allow-outside-paths", str(project))
    assert proc.returncode == 0, proc.stderr
    assert f"uploads from outside the task's directory: {tmp_path / 'src'}" in proc.stdout


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "local", ["~/.ssh", "~/.ssh/id_ed25519", "../home/.ssh", "./keys", "~", "/etc", "/"]
)
def test_p5_secret_places_are_refused_even_with_the_flag(tmp_path, home, local):
    """~/.ssh by its name, by a relative path, through a symlink in the task's
    directory, inside it, or a directory holding it (the home directory); /etc."""
    project = tmp_path / "p"
    project.mkdir()
    (project / "keys").symlink_to(home / ".ssh")
    path = write_task(project, base(datasets=[{"name": "d", "local": local}]))
    with pytest.raises(TaskFileError, match=r"datasets\[0\].local: .*a place of secrets"):
        load_task(path, [], allow_outside=True)


@pytest.mark.security
def test_p5_a_case_blind_file_system_does_not_hide_a_secret_place(tmp_path, home, monkeypatch):
    """On macOS ~/.SSH is ~/.ssh: the check compares without case there."""
    monkeypatch.setattr(local_paths, "CASE_BLIND", True)
    path = write_task(tmp_path / "p", base(datasets=[{"name": "d", "local": str(home) + "/.SSH"}]))
    with pytest.raises(TaskFileError, match=r"a place of secrets"):
        load_task(path, [], allow_outside=True)


@pytest.mark.bad_input
def test_p5_a_task_in_the_home_directory_does_not_upload_it(tmp_path, home):
    """code.workdir `.` in a home directory would upload ~/.ssh with the code."""
    path = write_task(home, base())
    with pytest.raises(TaskFileError, match=r"code.workdir: .* holds .*\.ssh"):
        load_task(path, [], allow_outside=True)


@pytest.mark.bad_input
def test_p5_the_cli_refuses_a_secret_place_with_the_flag(tcloud, tmp_path):
    tcloud_home = tmp_path / "home"  # the fixture's HOME
    (tcloud_home / ".ssh").mkdir()
    (tcloud_home / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    project = task_dir(tmp_path / "p", "name: t\nrun: [x]\ndatasets: [{name: k, local: ~/.ssh}]\n")
    tcloud.refused(
        tcloud("submit", "--dry-run", "--allow-outside-paths", str(project)),
        3,
        "datasets[0].local:",
        "a place of secrets",
    )


# ------------------------------------------------- 11: the agent checks every instruction
def crafted_sweep(tmp_path: Path, trials: list[dict], values: list[str]) -> str:
    """An instruction as a hostile client could send it: a small grid, any trials."""
    spec = load_task(write_task(tmp_path / "p", base(sweep={"parameters": {"X": ["1"]}})), [])
    document = compile_task(spec).document
    document["task"]["sweep"] = {"parameters": {"X": values}, "trials": trials}
    return json.dumps(document)


def commit_refused(user_dir: Path, text: str) -> str:
    """store.commit of `text`: the refusal's message; nothing may be made for it."""
    digest = digest_of(json.loads(text))
    with pytest.raises(Rejected) as caught:
        store.commit(user_dir, [], {}, digest, {"instruction.json": text})
    jobs = user_dir / "jobs"
    assert not jobs.exists() or list(jobs.iterdir()) == []
    return str(caught.value)


def test_p11_trials_over_the_cap_are_refused_before_a_directory_is_made(tmp_path):
    text = crafted_sweep(tmp_path, [{"X": "1"}] * (MAX_TRIALS + 1), ["1"])
    with pytest.raises(InvalidInstruction, match=r"task.sweep.trials: the 1 trial\(s\) of"):
        parse(text, "instruction.json")
    user_dir = tmp_path / "workspace" / "u"
    assert "sweep.trials" in commit_refused(user_dir, text)


def test_p11_a_nul_in_a_sweep_value_is_refused(tmp_path):
    text = crafted_sweep(tmp_path, [{"X": "a\0b"}], ["a\0b"])
    with pytest.raises(InvalidInstruction, match=r"task\.sweep\.parameters: expected text wi"):
        parse(text, "instruction.json")
    assert "NUL" in commit_refused(tmp_path / "workspace" / "u", text)


def test_p11_a_nul_in_a_sweep_value_of_a_task_file_is_refused(tmp_path):
    path = tmp_path / "tcloud.yaml"
    path.write_text('name: t\nrun: [x]\nsweep:\n  parameters: {X: ["a\\0b"]}\n')
    with pytest.raises(TaskFileError, match=r":4:15: sweep.parameters: expected text without NUL"):
        load_task(path, [])


def test_p11_submit_of_a_crafted_job_directory_makes_no_trials(tmp_path, monkeypatch):
    """A job directory whose instruction.json never went through the checks (written
    before this fix, or by hand): submit refuses it before making a trial or calling
    sbatch, and removes it."""
    user_dir = tmp_path / "workspace" / "u"
    job_dir = user_dir / "jobs" / "0123456789ab-1"
    for sub in ("code", "logs", "outputs", "status"):
        (job_dir / sub).mkdir(parents=True)
    (job_dir / "instruction.json").write_text(
        crafted_sweep(tmp_path, [{"X": "1"}] * (MAX_TRIALS + 1), ["1"])
    )
    calls = []
    monkeypatch.setattr(slurm.run, "output", lambda argv, timeout: calls.append(argv) or "1\n")
    nodes = scheduling_nodes([node_of(parse_oneliner(line)) for line in NODES])
    partitions = [partition_of(parse_oneliner(p)) for p in PARTITIONS]
    shape = (scheduling_partitions(partitions, nodes), nodes)
    monkeypatch.setattr(schedule, "cluster_shape", lambda timeout: shape)
    with pytest.raises(Rejected, match=r"sweep\.trials"):
        schedule.submit(user_dir, job_dir, AgentConfig())
    assert calls == [] and not job_dir.exists()


def test_p11_trials_that_do_not_fit_the_grid_are_refused(tmp_path):
    cases = [
        [{"X": "1"}, {"X": "2"}],  # more trials than combinations
        [{"Y": "1"}],  # a variable the grid does not have
        [{"X": "1", "LD_PRELOAD": "/tmp/x.so"}],  # one more
        [{"X": 1}],  # not text
    ]
    for trials in cases:
        with pytest.raises(InvalidInstruction, match=r"sweep\.trials"):
            parse(crafted_sweep(tmp_path, trials, ["1"]), "instruction.json")
    assert parse(crafted_sweep(tmp_path, [{"X": "1"}], ["1"]), "i").extensions["sweep"]


# ------------------------------------------------- 12: trial names in a download
WORKDIR = "/w/job"


def sweep_info(*names: object) -> dict:
    return {"sweep": True, "workdir": WORKDIR, "trials": [{"trial": n} for n in names]}


@pytest.mark.bad_input
@pytest.mark.parametrize("name", ["../../x", "..", ".", "a/b", "/abs", "x\0y", "", None])
def test_p12_download_refuses_trial_names_that_leave_the_destination(tmp_path, name):
    """Every name is checked before anything is written; plain names still download."""
    tree = {f"{WORKDIR}/trials/{n}/outputs": None for n in (0, 1, name)}
    tree |= {f"{WORKDIR}/trials/{n}/outputs/r.txt": b"r" for n in (0, 1, name)}
    dest = tmp_path / "dest"
    with pytest.raises(TcloudError, match=r"refusing the trial name .* \(not a plain name"):
        files.download_job(FakeSFTP(tree), sweep_info(0, name), dest)
    assert everything_under(tmp_path) == []
    assert files.download_job(FakeSFTP(tree), sweep_info(0, "1"), dest) == 2
    assert (dest / "trials" / "1" / "outputs" / "r.txt").read_bytes() == b"r"


@pytest.mark.bad_input
def test_p12_download_does_not_write_through_a_trials_symlink(tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "trials").symlink_to(elsewhere)
    remote = f"{WORKDIR}/trials/0/outputs"
    sftp = FakeSFTP({remote: None, f"{remote}/evil.txt": b"evil"})
    with pytest.raises(TcloudError, match="trials is a symlink"):
        files.download_job(sftp, sweep_info(0), dest)
    assert list(elsewhere.iterdir()) == []
