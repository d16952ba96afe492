"""GPUs into the container: the node's NVIDIA driver directory (assembled by the
nvidia_gpu role) is bound at /usr/local/nvidia and put at the end of PATH and
LD_LIBRARY_PATH (the image's or the task's own), only for a job Slurm gave GPUs
(SLURM_JOB_GPUS / SLURM_STEP_GPUS, never CUDA_VISIBLE_DEVICES alone), on a node that has
the directory.
NOT TESTED on a real GPU: these are the binds and the environment, without a runtime."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tacc_agent.errors import AgentError
from tacc_agent.tasks.execute import containers
from tacc_agent.tasks.execute.containers import Bind
from tacc_agent.tasks.images import cache as imagecache
from tacc_contract.images import parse_reference
from tests.unit.agent.tasks.execute.test_containers import ch_runs, image_agent_env, make_image_job
from tests.unit.agent.tasks.images.test_agent_images import PINNED, StubPuller
from tests.unit.agent_jobs import agent

TARGET = containers.GPU_DRIVER_TARGET
GPU_JOB = {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "2,3"}


def driver_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "tacc-nvidia"
    (directory / "lib64").mkdir(parents=True)
    (directory / "bin").mkdir()
    return directory


def binds_for(
    tmp_path: Path, environ: dict[str, str], gpu_driver_dir: str | None, extra: tuple[str, ...] = ()
) -> containers.JobBinds:
    user_dir = tmp_path / "tcloud" / "alice"
    user_dir.mkdir(parents=True, exist_ok=True)
    return containers.job_binds(
        user_dir,
        str(tmp_path / "tcloud"),
        [],
        list(extra),
        "",
        gpu_driver_dir=gpu_driver_dir,
        environ=environ,
    )


def test_a_gpu_job_gets_the_driver_directory_at_usr_local_nvidia(tmp_path):
    driver = driver_dir(tmp_path)
    job = binds_for(tmp_path, GPU_JOB, str(driver))
    user_dir = str(tmp_path / "tcloud" / "alice")
    assert job.binds == [Bind(user_dir, user_dir), Bind(str(driver), TARGET)]
    assert job.mount_points == [user_dir, TARGET]  # made in the image like the others
    assert job.search_paths == {"PATH": f"{TARGET}/bin", "LD_LIBRARY_PATH": f"{TARGET}/lib64"}


@pytest.mark.parametrize(
    "environ",
    [
        {"SLURM_STEP_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"},  # a step's GPUs (srun)
        {"SLURM_STEP_GPUS": "1"},
        {"SLURM_JOB_GPUS": "0,1"},  # the batch step
        {"CUDA_VISIBLE_DEVICES": "", "SLURM_JOB_GPUS": "3"},
    ],
)
def test_either_of_slurms_gpu_variables_means_gpus(environ):
    assert containers.given_gpus(environ)


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "NoDevFiles", "SLURM_JOB_GPUS": ""},  # a Gres without devices
        {"GPU_DEVICE_ORDINAL": "0"},  # not Slurm's word for the job's GPUs
        {"SLURM_JOB_GPUS": "NoDevFiles", "SLURM_STEP_GPUS": ""},
    ],
)
def test_a_job_without_gpus_gets_nothing_of_the_driver(tmp_path, environ):
    driver = driver_dir(tmp_path)
    assert not containers.given_gpus(environ)
    job = binds_for(tmp_path, environ, str(driver))
    assert all(b.target != TARGET for b in job.binds)
    assert TARGET not in job.mount_points and job.search_paths == {}


def test_without_the_setting_nothing_changes(tmp_path):
    for setting in (None, ""):
        job = binds_for(tmp_path, GPU_JOB, setting)
        assert all(b.target != TARGET for b in job.binds)
        assert TARGET not in job.mount_points and job.search_paths == {}


def test_a_node_without_the_directory_binds_nothing_but_keeps_the_mount_point(tmp_path):
    """The batch step makes the mount points for every node of the job: a node that
    lacks the directory (no driver there) must not leave the image without the mount
    point the other nodes' wrappers bind onto."""
    job = binds_for(tmp_path, GPU_JOB, str(tmp_path / "no-such-dir"))
    assert all(b.target != TARGET for b in job.binds)
    assert TARGET in job.mount_points and job.search_paths == {}


def test_the_process_environment_is_the_default(tmp_path, monkeypatch):
    driver = driver_dir(tmp_path)
    user_dir = tmp_path / "u"
    for name in containers.GPU_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    job = containers.job_binds(user_dir, str(tmp_path), [], [], "", gpu_driver_dir=str(driver))
    assert job.search_paths == {}
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    job = containers.job_binds(user_dir, str(tmp_path), [], [], "", gpu_driver_dir=str(driver))
    assert Bind(str(driver), TARGET) in job.binds


def test_the_old_call_without_the_keyword_binds_no_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_GPUS", "0")
    job = containers.job_binds(tmp_path / "u", str(tmp_path), [], [], "")
    assert all(b.target != TARGET for b in job.binds) and job.search_paths == {}


def test_under_an_extra_bind_no_mount_point_is_made(tmp_path):
    """ops' bind of /usr/local (whatever for) already brings a directory there: ch-run
    binds onto what that shows, nothing to make in the image."""
    driver = driver_dir(tmp_path)
    assert Path("/usr/local").is_dir()
    job = binds_for(tmp_path, GPU_JOB, str(driver), extra=("/usr/local",))
    assert job.binds[-1] == Bind(str(driver), TARGET)
    assert TARGET not in job.mount_points and "/usr/local" in job.mount_points


@pytest.mark.bad_input
@pytest.mark.parametrize("setting", ["relative/dir", "/", "/opt/a:b", "/opt/a,b", "/opt/\n"])
def test_a_driver_directory_the_bind_syntax_cannot_carry_is_refused(tmp_path, setting):
    with pytest.raises(AgentError, match="container_gpu_driver_dir: expected an absolute"):
        binds_for(tmp_path, GPU_JOB, setting)


def test_the_driver_directory_is_normalised(tmp_path):
    driver = driver_dir(tmp_path)
    job = binds_for(tmp_path, GPU_JOB, f"{driver}/lib64/../")
    assert Bind(str(driver), TARGET) in job.binds


# --- the environment ---------------------------------------------------------------------------
SEARCH = {"PATH": f"{TARGET}/bin", "LD_LIBRARY_PATH": f"{TARGET}/lib64"}


def test_the_driver_goes_after_the_images_own_search_paths():
    image = {"PATH": "/opt/conda/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/conda/lib"}
    env = containers.container_env(image, {}, None, SEARCH)
    assert env == {
        "PATH": f"/opt/conda/bin:/usr/bin:/bin:{TARGET}/bin",
        "LD_LIBRARY_PATH": f"/opt/conda/lib:{TARGET}/lib64",
    }


def test_an_image_without_the_variables_gets_the_default_path_and_the_driver():
    env = containers.container_env({}, {}, containers.Charliecloud.defaults, SEARCH)
    assert env["PATH"] == f"{containers.DEFAULT_PATH}:{TARGET}/bin"
    assert env["LD_LIBRARY_PATH"] == f"{TARGET}/lib64"


def test_a_cuda_image_that_already_names_the_driver_is_left_as_it_is():
    """nvidia/cuda images set LD_LIBRARY_PATH=/usr/local/nvidia/lib:/usr/local/nvidia/lib64
    and PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:...: nothing added twice."""
    image = {
        "PATH": f"{TARGET}/bin:/usr/local/cuda/bin:/usr/bin",
        "LD_LIBRARY_PATH": f"{TARGET}/lib:{TARGET}/lib64",
    }
    assert containers.container_env(image, {}, None, SEARCH) == image


def test_the_driver_goes_after_the_tasks_own_search_paths_too():
    """DECIDED (review of issue 19): a task that sets LD_LIBRARY_PATH or PATH keeps its
    value first, and the driver's directory still comes at its end."""
    env = containers.container_env(
        {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/img"}, {"LD_LIBRARY_PATH": "/mine"}, None, SEARCH
    )
    assert env == {"PATH": f"/usr/bin:{TARGET}/bin", "LD_LIBRARY_PATH": f"/mine:{TARGET}/lib64"}
    env = containers.container_env(
        {}, {"PATH": "/opt/x/bin:/usr/bin", "LD_LIBRARY_PATH": ""}, None, SEARCH
    )
    assert env == {
        "PATH": f"/opt/x/bin:/usr/bin:{TARGET}/bin",
        "LD_LIBRARY_PATH": f"{TARGET}/lib64",
    }


def test_a_task_value_that_already_names_the_driver_is_inherited_as_it_is():
    task = {"LD_LIBRARY_PATH": f"{TARGET}/lib64:/mine", "PATH": "/usr/bin"}
    env = containers.container_env({"PATH": "/usr/bin"}, task, None, SEARCH)
    assert env == {"PATH": f"/usr/bin:{TARGET}/bin"}  # LD_LIBRARY_PATH: the task's, inherited


def test_without_gpus_the_tasks_search_paths_stay_inherited():
    env = containers.container_env({"PATH": "/usr/bin"}, {"PATH": "/mine"}, None, {})
    assert env == {}


def test_an_empty_entry_of_the_image_is_kept():
    env = containers.container_env({"LD_LIBRARY_PATH": "/a::/b"}, {}, None, SEARCH)
    assert env["LD_LIBRARY_PATH"] == f"/a::/b:{TARGET}/lib64"


def test_no_search_paths_change_nothing():
    image = {"PATH": "/usr/bin"}
    assert containers.container_env(image, {}) == containers.container_env(image, {}, None, {})


def test_the_charliecloud_line_carries_the_bind_and_the_variables(tmp_path):
    driver = driver_dir(tmp_path)
    job = binds_for(tmp_path, GPU_JOB, str(driver))
    env = containers.container_env({"PATH": "/usr/bin"}, {}, None, job.search_paths)
    argv = containers.Charliecloud().command(
        tmp_path / "rootfs", ["nvidia-smi"], tmp_path, job.binds, env
    )
    assert f"--bind={driver}:{TARGET}" in argv
    assert f"--set-env=LD_LIBRARY_PATH={TARGET}/lib64" in argv
    assert f"--set-env=PATH=/usr/bin:{TARGET}/bin" in argv


def gpu_agent_env(tmp_path: Path, driver: Path) -> dict[str, str]:
    """The fake agent's environment, its config naming `driver` as the GPU driver dir."""
    env = image_agent_env(tmp_path)
    config = Path(env["TACC_AGENT_CONFIG"])
    settings = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**settings, "container_gpu_driver_dir": str(driver)}))
    return env


# --- the batch step and the wrapper, with a fake ch-run (test_containers.py) ---
def test_a_gpu_jobs_lines_get_the_driver_and_the_search_paths(tmp_path):
    user_dir, job_dir = make_image_job(tmp_path, {"name": "t", "run": ["echo $LD_LIBRARY_PATH"]})
    imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    driver = driver_dir(tmp_path / "node")
    env = gpu_agent_env(tmp_path, driver)
    proc = agent(
        "batch", str(job_dir), env={**env, "SLURM_JOB_GPUS": "0", "CUDA_VISIBLE_DEVICES": "0"}
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    image = imagecache.rootfs_at(user_dir, imagecache.digest_hex(parse_reference(PINNED)))
    assert (image / "usr/local/nvidia").is_dir()  # the batch step made the mount point
    (run,) = ch_runs(tmp_path)  # fake ch-run checked the bind's target in the image
    assert run["binds"][-1] == [str(driver), TARGET]
    assert run["env"]["LD_LIBRARY_PATH"] == f"{TARGET}/lib64"
    assert run["env"]["PATH"] == f"/usr/local/bin:/usr/bin:/bin:{TARGET}/bin"
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert f"{TARGET}/lib64" in log


@pytest.mark.security
@pytest.mark.parametrize(
    "environ",
    [
        {"CUDA_VISIBLE_DEVICES": "0"},  # from the user's shell through sbatch --export=ALL
        {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_JOB_GPUS": "", "SLURM_STEP_GPUS": "NoDevFiles"},
    ],
)
def test_cuda_visible_devices_alone_is_not_slurms_word_for_gpus(tmp_path, environ):
    """A user's shell may export CUDA_VISIBLE_DEVICES and sbatch brings it into any job:
    it says nothing about what Slurm gave, so no driver directory for it."""
    driver = driver_dir(tmp_path)
    assert not containers.given_gpus(environ)
    job = binds_for(tmp_path, environ, str(driver))
    assert all(b.target != TARGET for b in job.binds)
    assert TARGET not in job.mount_points and job.search_paths == {}


def test_a_gpu_tasks_own_library_path_gets_the_driver_at_its_end(tmp_path):
    user_dir, job_dir = make_image_job(
        tmp_path,
        {
            "name": "t",
            "run": ["echo $LD_LIBRARY_PATH"],
            "environment": {"env": {"LD_LIBRARY_PATH": "/opt/mine/lib"}},
        },
    )
    imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    driver = driver_dir(tmp_path / "node")
    env = gpu_agent_env(tmp_path, driver)
    proc = agent("batch", str(job_dir), env={**env, "SLURM_JOB_GPUS": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = ch_runs(tmp_path)
    assert run["binds"][-1] == [str(driver), TARGET]
    assert run["env"]["LD_LIBRARY_PATH"] == f"/opt/mine/lib:{TARGET}/lib64"
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text()
    assert f"/opt/mine/lib:{TARGET}/lib64" in log


def test_a_job_without_gpus_on_a_gpu_node_gets_no_driver(tmp_path):
    user_dir, job_dir = make_image_job(tmp_path, {"name": "t", "run": ["true"]})
    imagecache.ensure(user_dir, PINNED, "1", lambda _l: None, 5, StubPuller())
    driver = driver_dir(tmp_path / "node")
    env = gpu_agent_env(tmp_path, driver)
    env = {k: v for k, v in env.items() if k not in containers.GPU_VARIABLES}
    proc = agent("batch", str(job_dir), env={**env, "CUDA_VISIBLE_DEVICES": "0"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run,) = ch_runs(tmp_path)
    assert all(target != TARGET for _, target in run["binds"])
    assert "LD_LIBRARY_PATH" not in run["env"]
