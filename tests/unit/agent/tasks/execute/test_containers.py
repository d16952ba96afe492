"""Lines inside the task's container, without a runtime: each runtime's argv (binds,
masking, cwd, the image's variables), the job's binds, and the batch step and the
wrapper composing every setup and run line with a fake ch-run on PATH that checks its
bind targets as ch-run does and then runs the line on the host."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import load_config
from tacc_agent.errors import AgentError, Rejected
from tacc_agent.tasks.execute import containers, envcache
from tacc_agent.tasks.execute import launch as execute
from tacc_agent.tasks.execute.containers import Bind
from tacc_agent.tasks.images import cache as imagecache
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.store import delta as store
from tcloud.compile.compiler import compile_task
from tcloud.compile.task_file import load_task
from tests.unit.agent.tasks.images.test_agent_images import PINNED, StubPuller
from tests.unit.agent_jobs import agent, agent_env

BINDS = [
    Bind("/shared", "/shared"),
    Bind("/u/images/.mask", "/shared/tcloud"),
    Bind("/shared/tcloud/alice", "/shared/tcloud/alice"),
]
ROOTFS = Path("/shared/tcloud/alice/images/abc/rootfs")
CWD = Path("/shared/tcloud/alice/jobs/j1/code")
IMAGE_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def test_charliecloud_argv():
    argv = containers.Charliecloud().command(
        ROOTFS, ["bash", "-c", "echo hi"], CWD, BINDS, IMAGE_ENV
    )
    assert argv == [
        "ch-run",
        "--env-no-expand",
        "--set-env=PATH=/usr/local/bin:/usr/bin:/bin",
        "--bind=/shared:/shared",
        "--bind=/u/images/.mask:/shared/tcloud",
        "--bind=/shared/tcloud/alice:/shared/tcloud/alice",
        f"--cd={CWD}",
        str(ROOTFS),
        "--",
        "bash",
        "-c",
        "echo hi",
    ]


def test_apptainer_argv():
    argv = containers.Apptainer().command(ROOTFS, ["python3", "x.py"], CWD, BINDS[:1], IMAGE_ENV)
    assert argv == [
        "apptainer",
        "exec",
        "--no-home",
        "--env=PATH=/usr/local/bin:/usr/bin:/bin",
        "--bind=/shared:/shared",
        f"--pwd={CWD}",
        str(ROOTFS),
        "python3",
        "x.py",
    ]


def test_enroot_argv_changes_into_the_directory_itself():
    argv = containers.Enroot().command(ROOTFS, ["python3", "x y.py"], CWD, BINDS[:1], {})
    assert argv == [
        "enroot",
        "start",
        "--mount=/shared:/shared",
        str(ROOTFS),
        "sh",
        "-c",
        f'cd {CWD} && exec "$@"',
        "sh",
        "python3",
        "x y.py",
    ]


@pytest.mark.bad_input
def test_an_unknown_runtime_is_refused_by_the_settings(tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("container_runtime: docker\n")
    with pytest.raises(AgentError, match="container_runtime: expected one of charliecloud"):
        load_config(config)
    config.write_text("container_binds: [shared]\n")
    with pytest.raises(AgentError, match="container_binds: expected absolute host directories"):
        load_config(config)
    config.write_text("container_binds: [/data, /scratch]\ncontainer_runtime: apptainer\n")
    loaded = load_config(config)
    assert loaded.container_binds == ("/data", "/scratch")
    assert containers.runtime_named(loaded.container_runtime).name == "apptainer"


@pytest.mark.bad_input
@pytest.mark.parametrize("entry", ["https://nvcr.io", "nvcr", "nvcr.io/nvidia", "n1:99999", "7"])
def test_a_registry_list_entry_that_is_not_host_port_is_refused(tmp_path, entry):
    """Issue [24]: image_registries names registries as references do (host[:port])."""
    config = tmp_path / "agent.yaml"
    config.write_text(f"image_registries: [nvcr.io, {json.dumps(entry)}]\n")
    with pytest.raises(AgentError, match=rf"image_registries: expected registries .*{entry!r}"):
        load_config(config)
    config.write_text("image_registries: [nvcr.io, 'n1:5000', localhost]\n")
    assert load_config(config).image_registries == ("nvcr.io", "n1:5000", "localhost")


@pytest.mark.security
def test_the_workspace_root_is_masked_where_an_extra_bind_shows_it(tmp_path):
    shared = tmp_path / "shared"
    user_dir = shared / "tcloud" / "alice"
    (shared / "tcloud" / "bob").mkdir(parents=True)
    user_dir.mkdir()
    (shared / "data" / "imagenet").mkdir(parents=True)
    spool = tmp_path / "spool"
    spool.mkdir()
    datasets = [
        str(shared / "data" / "imagenet"),
        str(user_dir / "mine"),
        str(shared / "tcloud" / "bob" / "public"),
    ]
    job = containers.job_binds(
        user_dir, str(shared / "tcloud"), datasets, [str(shared), "/no/such/dir"], str(spool)
    )
    mask = user_dir / "images" / containers.MASK
    assert job.binds == [
        Bind(str(shared), str(shared)),  # /no/such/dir: not on this node, left out
        Bind(str(mask), str(shared / "tcloud")),  # bob's directory is not visible
        Bind(str(user_dir), str(user_dir)),
        Bind(str(shared / "data" / "imagenet"), str(shared / "data" / "imagenet")),
        Bind(str(shared / "tcloud" / "bob" / "public"), str(shared / "tcloud" / "bob" / "public")),
        Bind(str(spool), str(spool)),
    ]  # the dataset under the user's own directory comes with it
    assert job.mount_points == [str(shared), str(spool)]
    assert job.mask_dirs == [mask / "alice", mask / "bob" / "public"]
    containers.prepare_mask(job, mask)
    assert sorted(p.name for p in mask.iterdir()) == ["alice", "bob"]
    assert (mask.stat().st_mode & 0o777) == 0o700


@pytest.mark.bad_input
@pytest.mark.parametrize("path", ["/", "/data/a:b", "/data/a,b", "/data/..", "/data/a\nb"])
def test_a_dataset_path_the_bind_syntax_cannot_carry_is_refused(tmp_path, path):
    with pytest.raises(Rejected, match=r"datasets: the cluster path .* cannot be bound") as caught:
        containers.job_binds(tmp_path, str(tmp_path), [path], [], "")
    assert caught.value.field == "datasets"


@pytest.mark.bad_input
def test_an_unbindable_dataset_of_an_image_task_is_refused_at_submit(tmp_path):
    task = execute.load(
        make_image_job(
            tmp_path,
            {
                "name": "t",
                "run": ["true"],
                "datasets": [{"name": "d", "cluster": "/data/a:b"}],
            },
        )[1]
    )
    with pytest.raises(Rejected, match="'/data/a:b' cannot be bound") as caught:
        schedule.check_container(task)
    assert caught.value.field == "datasets"
    plain = dataclasses.replace(task, image=None)
    schedule.check_container(plain)  # without an image the path is only linked


def test_a_dataset_path_is_bound_normalised(tmp_path):
    job = containers.job_binds(tmp_path / "u", str(tmp_path), ["/data/x/../y/"], [], "")
    assert Bind("/data/y", "/data/y") in job.binds


def test_without_an_extra_bind_over_it_nothing_is_masked(tmp_path):
    user_dir = tmp_path / "tcloud" / "alice"
    user_dir.mkdir(parents=True)
    job = containers.job_binds(user_dir, str(tmp_path / "tcloud"), [], [], "")
    assert job.binds == [Bind(str(user_dir), str(user_dir))]
    assert job.mount_points == [str(user_dir)] and job.mask_dirs == []


def test_the_tasks_own_variables_win_over_the_images():
    image = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    assert containers.container_env(image, {"LANG": "de_DE.UTF-8"}) == {"PATH": "/usr/bin:/bin"}
    # an image whose config sets no PATH gets the usual one, not the node's
    assert containers.container_env({}, {}) == {"PATH": containers.DEFAULT_PATH}
    assert containers.container_env({}, {"PATH": "/opt/x/bin"}) == {}
    # the runtime's defaults, unless the task sets them
    cma = "OMPI_MCA_btl_vader_single_copy_mechanism"
    defaults = containers.Charliecloud.defaults
    assert containers.container_env({}, {}, defaults)[cma] == "none"
    assert cma not in containers.container_env({}, {cma: "cma"}, defaults)


def test_mpirun_stays_on_the_host_and_each_rank_runs_in_the_image():
    container = containers.Container(containers.Charliecloud(), ROOTFS, BINDS[:1], {}, CWD)

    def command(line: str) -> list[str]:
        return ["bash", "-euo", "pipefail", "-c", f"mpirun --tag-output {line}"]

    srun = execute.in_container(command, container, "srun")
    assert srun("echo 'a b'")[:1] == ["ch-run"]
    assert srun("echo 'a b'")[-6:] == ["--", *command("echo 'a b'")]
    mpirun = execute.in_container(command, container, "mpirun")("echo 'a b'")
    assert mpirun[:4] == ["bash", "-euo", "pipefail", "-c"]
    assert mpirun[4].startswith("mpirun --tag-output ch-run ")
    assert mpirun[4].endswith(f"{ROOTFS} -- bash -euo pipefail -c 'echo '\"'\"'a b'\"'\"''")
    assert execute.in_container(command, None, "srun") is command


def test_torchrun_runs_inside_the_image_with_its_workers():
    """torchrun is the node's one program: the whole launch runs in the image (torch
    is there, not on the node), and its workers are its children inside it."""
    container = containers.Container(containers.Charliecloud(), ROOTFS, BINDS[:1], {}, CWD)

    def command(line: str) -> list[str]:
        return ["torchrun", "--nnodes=2", "--nproc-per-node=2", "--", "bash", "-c", line]

    argv = execute.in_container(command, container, "torchrun")("python3 train.py")
    assert argv[:1] == ["ch-run"] and argv[argv.index("--") + 1 :] == command("python3 train.py")


# ---------------------------------------------------------------- with the agent
FAKE_CH_RUN = r"""#!PYTHON
import json, os, sys
args = sys.argv[1:]
split = args.index("--")
options, rootfs, argv = args[:split - 1], args[split - 1], args[split + 1:]
if not os.environ.get("USER"):
    sys.exit("ch-run: error: $USER not set")
binds, env, cwd = [], {}, None
for option in options:
    if option.startswith("--bind="):
        source, target = option[len("--bind="):].split(":")
        # ch-run: the target must exist in the image, or below an earlier bind
        covering = [(s, t) for s, t in binds if target == t or target.startswith(t + "/")]
        if covering:
            s, t = covering[-1]
            there = os.path.join(s, os.path.relpath(target, t))
        else:
            there = os.path.join(rootfs, target.lstrip("/"))
        if not os.path.isdir(there):
            sys.exit(f"ch-run: error: can't bind: destination not found: {there}")
        binds.append((source, target))
    elif option.startswith("--set-env="):
        key, value = option[len("--set-env="):].split("=", 1)
        env[key] = value
    elif option.startswith("--cd="):
        cwd = option[len("--cd="):]
with open(os.environ["FAKE_CH_RUN_LOG"], "a") as log:
    log.write(json.dumps({"rootfs": rootfs, "binds": binds, "env": env, "cwd": cwd,
                          "argv": argv}) + "\n")
os.environ.update(env)
os.chdir(cwd)
program = argv[0]
for source, target in binds:  # a program the line names under a bind: run the source
    if program.startswith(target + "/") and target != source:
        program = os.path.join(source, os.path.relpath(program, target))
os.execvp(program, argv)
"""
FAKE_SRUN = r"""#!PYTHON
import os, sys
argv = [a for a in sys.argv[1:] if not a.startswith("--")]
os.execvp(argv[0], argv)
"""


def fake_tools(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, text in (("ch-run", FAKE_CH_RUN), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text.replace("PYTHON", sys.executable))
        (bin_dir / name).chmod(0o755)
    return bin_dir


def make_image_job(tmp_path: Path, task: dict) -> tuple[Path, Path]:
    """(user_dir, job_dir) of `task` with its image resolved to PINNED, as at submit."""
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    (project / "tcloud.yaml").write_text(
        yaml.safe_dump({"image": "n1:5000/tacc/base:bookworm", **task})
    )
    instruction = compile_task(load_task(project / "tcloud.yaml"), resolve_image=lambda _r: PINNED)
    user_dir = tmp_path / "workspace" / "user"
    user_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return user_dir, Path(store.commit_local(user_dir, instruction)["workdir"])


def image_agent_env(tmp_path: Path) -> dict[str, str]:
    spool = tmp_path / "spool"
    spool.mkdir(exist_ok=True)
    env = agent_env(
        tmp_path,
        container_binds=[str(tmp_path)],
        slurm_spool_dir=str(spool),
        image_lock_timeout_seconds=5,
    )
    env["PATH"] = f"{fake_tools(tmp_path)}{os.pathsep}{env['PATH']}"
    env["FAKE_CH_RUN_LOG"] = str(tmp_path / "ch-run.log")
    return env


def ch_runs(tmp_path: Path) -> list[dict]:
    log = tmp_path / "ch-run.log"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_the_batch_step_runs_setup_and_run_lines_in_the_image(tmp_path):
    user_dir, job_dir = make_image_job(
        tmp_path,
        {
            "name": "t",
            "setup": ["echo setup in $PATH"],
            "run": ["echo run in $PWD as $USER"],
            "environment": {"env": {"GREETING": "hi"}},
        },
    )
    image = imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    env = image_agent_env(tmp_path)
    env.pop("USER", None)  # the wrapper gives ch-run the user's name itself
    proc = agent("batch", str(job_dir), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reused (pulled by job 1)" in proc.stdout
    assert "setup in /usr/local/bin:/usr/bin:/bin" in proc.stdout
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert f"run in {job_dir}/code as " in log
    setup, run = ch_runs(tmp_path)
    assert setup["rootfs"] == run["rootfs"] == image["path"]
    assert setup["cwd"] == run["cwd"] == str(job_dir / "code")
    assert run["env"] == {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    }
    mask = user_dir / "images" / containers.MASK
    assert run["binds"] == [
        [str(tmp_path), str(tmp_path)],
        [str(mask), str(tmp_path / "workspace")],
        [str(user_dir), str(user_dir)],
        [str(tmp_path / "spool"), str(tmp_path / "spool")],
    ]
    assert run["argv"] == ["bash", "-euo", "pipefail", "-c", "echo run in $PWD as $USER"]
    recorded = imagecache.job_image(job_dir)
    assert recorded["reference"] == PINNED and recorded["runtime"] == "charliecloud"
    assert records.last_state(job_dir) == "COMPLETED"


@pytest.mark.fault
def test_a_failed_pull_is_a_failed_job_with_the_reason(tmp_path):
    _, job_dir = make_image_job(tmp_path, {"name": "t", "run": ["echo never"]})
    env = image_agent_env(tmp_path)
    skopeo = tmp_path / "bin" / "skopeo"
    skopeo.write_text("#!/bin/sh\necho 'level=fatal msg=\"connection refused\"' >&2\nexit 1\n")
    skopeo.chmod(0o755)
    proc = agent("batch", str(job_dir), env=env)
    assert proc.returncode == 1
    event = records.history(job_dir)[-1]
    assert event["state"] == "FAILED"
    assert event["reason"] == f"{PINNED}: the registry answered: connection refused"
    assert ch_runs(tmp_path) == [] and imagecache.job_image(job_dir) is None
    hex_digest = PINNED.rsplit(":", 1)[1]
    left = sorted(p.name for p in (job_dir.parent.parent / "images").iterdir())
    assert left == [f"{hex_digest}.lock"]


def test_the_wrapper_runs_a_rank_in_the_image_with_the_tasks_variables(tmp_path):
    user_dir, job_dir = make_image_job(
        tmp_path,
        {
            "name": "t",
            "run": ["echo $RANK/$WORLD_SIZE $GREETING $TACC_WORKDIR; exit 3"],
            "environment": {"env": {"GREETING": "hi"}},
        },
    )
    imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    env = image_agent_env(tmp_path)
    # the batch step made the mount points; the wrapper finds them in place
    execute.job_container(
        execute.load(job_dir),
        job_dir,
        load_config(Path(env["TACC_AGENT_CONFIG"])),
        prepare=True,
        job_id="1",
    )
    proc = agent("exec", str(job_dir), env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text().splitlines()
    assert f"0/1 hi {job_dir}" in log and log[-1] == "tacc: exited 3"
    assert ch_runs(tmp_path)[0]["argv"][-1].startswith("echo $RANK/$WORLD_SIZE")


@pytest.mark.fault
def test_a_wrapper_without_the_pulled_image_says_so(tmp_path):
    _, job_dir = make_image_job(tmp_path, {"name": "t", "run": ["echo never"]})
    proc = agent("exec", str(job_dir), env=image_agent_env(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert "the image is not in the cache on this node" in log
    rank = records.ranks(job_dir)[0]
    assert rank["state"] == "EXITED" and rank["exit_code"] == 1
    assert ch_runs(tmp_path) == []


# --- a venv on top of the image (issue [24]) --------------------------------------------
FAKE_UV = r"""#!PYTHON
import json, os, pathlib, sys
args = sys.argv[1:]
if os.environ.get("UV_NATIVE_TLS"):  # as uv in an image without a CA store
    sys.exit("error: No CA certificates were loaded from the system")
with open(os.environ["FAKE_UV_LOG"], "a") as log:
    log.write(json.dumps(args) + "\n")
if args == ["--version"]:
    print("uv 0.0.0 (FAKE)")
elif args[0] == "venv":
    (pathlib.Path(args[-1]) / "bin").mkdir(parents=True, exist_ok=True)
elif args[:2] == ["pip", "compile"]:
    pathlib.Path(args[args.index("-o") + 1]).write_text("tacc-probe==1.0\n")
"""


def test_a_venv_on_top_of_the_image_is_built_in_it_and_first_on_its_path(tmp_path):
    user_dir, job_dir = make_image_job(
        tmp_path,
        {
            "name": "t",
            "run": ["echo venv=$VIRTUAL_ENV path=$PATH"],
            "environment": {"requirements": ["tacc-probe"]},
        },
    )
    imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    uv = tmp_path / "uv-bin" / "uv"
    uv.parent.mkdir()
    uv.write_text(FAKE_UV.replace("PYTHON", sys.executable))
    uv.chmod(0o755)
    env = image_agent_env(tmp_path)
    config = Path(env["TACC_AGENT_CONFIG"])
    config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "uv": str(uv)}))
    env["FAKE_UV_LOG"] = str(tmp_path / "uv.log")
    proc = agent("batch", str(job_dir), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = ch_runs(tmp_path)
    # Every uv step and the interpreter probe ran in the image, uv's directory bound in.
    in_image = [run["argv"] for run in runs]
    assert in_image[0][:2] == ["python3", "-I"]
    assert [argv[1] for argv in in_image[1:4]] == ["venv", "pip", "pip"]
    # uv at a place of its own in the image (it hides nothing of the image's), bound
    # for the build only: the ranks' containers do not have it
    assert all(argv[0] == f"{containers.TOOLS_TARGET}/uv" for argv in in_image[1:4])
    assert [str(uv.parent.resolve()), containers.TOOLS_TARGET] in runs[1]["binds"]
    assert all(containers.TOOLS_TARGET not in dict(run["binds"]).values() for run in runs[4:])
    venv_args = in_image[1]
    assert venv_args[venv_args.index("--python") + 1] == "python3"  # the image's Python
    environment = json.loads((job_dir / "status" / "environment.json").read_text())
    assert environment["image"] == PINNED.rsplit(":", 1)[1]
    assert environment["lock"] == ["tacc-probe==1.0"]
    venv = environment["path"]
    assert venv.startswith(str(user_dir / "envs"))
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert f"venv={venv} path={venv}/bin:/usr/local/bin:/usr/bin:/bin" in log, log


def test_the_venv_of_an_image_is_keyed_by_the_image_too():
    python = envcache.Interpreter("cpython", "3.11.2", "linux-x86_64")
    plain = envcache.env_digest(["numpy"], [], python)
    assert plain == envcache.env_digest(["numpy"], [], python, "")  # the old keys stay
    one, other = (envcache.env_digest(["numpy"], [], python, image) for image in ("a1", "b2"))
    assert len({plain, one, other}) == 3
