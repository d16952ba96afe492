"""Per-job usage on a node (health/job_usage.py): fake /proc and cgroup trees, the lab's
FAKE nvidia-smi (with --query-compute-apps) behind it, and the daemon's /metrics."""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tacc_agent import serve
from tacc_agent.config import AgentConfig
from tacc_agent.health import job_usage
from tacc_agent.health.job_usage import JobUsageCollector, Sources
from tests.conftest import ROOT

TICKS = os.sysconf("SC_CLK_TCK")
FAKE_SMI = ROOT / "packages/ops/tacc_lab/fakes/nvidia_smi.py"
UUID0 = "GPU-5f2a1c3e-8b7d-4e6f-9a1b-2c3d4e5f6a7b"
UUID1 = "GPU-6a3b2d4f-9c8e-4f7a-8b2c-3d4e5f6a7b8c"
ALICE = 65534  # not root (the tests may run as root); named "nobody" where it exists
ALICE_NAME = job_usage.user_name(ALICE)


def add_process(proc: Path, pid: int, ppid: int, uid: int, title: bytes, *,
                ticks: tuple[int, int, int, int] = (0, 0, 0, 0), pss_kb: int | None = None,
                rss_kb: int = 0, environ: dict[str, str] | None = None) -> None:  # fmt: skip
    base = proc / str(pid)
    base.mkdir(parents=True)
    utime, stime, cutime, cstime = ticks
    name = title.split(b"\0")[0].decode()[:15] or "x"
    rest = f"S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0"
    (base / "stat").write_text(f"{pid} ({name}) {rest}\n")
    (base / "status").write_text(f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
                                 f"VmRSS:\t{rss_kb} kB\n")  # fmt: skip
    (base / "cmdline").write_bytes(title)
    if pss_kb is not None:
        (base / "smaps_rollup").write_text(f"Rss:  {rss_kb} kB\nPss:  {pss_kb} kB\n")
    variables = environ or {}
    (base / "environ").write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in variables.items()))


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A node with job 41 (two tasks under its step 0, one grandchild, the extern step's
    sleep) and job 42 (a batch step with one task), plus processes of no job."""
    root = tmp_path / "proc"
    add_process(root, 1, 0, 0, b"/sbin/init\0")
    add_process(root, 10, 1, 0, b"/usr/sbin/slurmd\0")
    add_process(root, 100, 1, 0, b"slurmstepd: [41.extern]\0")
    add_process(root, 101, 100, 0, b"sleep\x00100000000\0")
    add_process(root, 110, 1, 0, b"slurmstepd: [41.0]\0", ticks=(900, 900, 0, 0))
    env41 = {"SLURM_JOB_ID": "41", "SLURM_CPUS_ON_NODE": "4", "SLURM_JOB_GPUS": "1"}
    add_process(root, 111, 110, ALICE, b"python\0train.py\0", ticks=(2 * TICKS, TICKS, TICKS, 0),
                pss_kb=1000, rss_kb=3000, environ=env41)  # fmt: skip
    add_process(root, 112, 110, ALICE, b"python\0train.py\0", ticks=(TICKS, 0, 0, 0),
                pss_kb=500, rss_kb=2500, environ=env41)  # fmt: skip
    add_process(root, 113, 111, ALICE, b"worker\0", ticks=(TICKS, 0, 0, 0), rss_kb=200)
    add_process(root, 200, 1, 0, b"slurmstepd: [42.batch]\0")
    env42 = {"SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "2"}
    add_process(root, 201, 200, ALICE, b"bash\0job.sh\0", ticks=(TICKS, 0, 0, 0), pss_kb=100,
                environ=env42)  # fmt: skip
    # Not a job's: a login shell, and a process naming job 41 in its own environment
    # (anyone can write SLURM_JOB_ID=41): membership comes from the step daemon only.
    add_process(root, 300, 1, ALICE, b"bash\0", ticks=(50 * TICKS, 0, 0, 0), pss_kb=9000,
                environ={"SLURM_JOB_ID": "41", "SLURM_JOB_GPUS": "0"})  # fmt: skip
    # A user process titled like a step daemon is not one (it is not root's).
    add_process(root, 400, 1, ALICE, b"slurmstepd: [41.0]\0")
    add_process(root, 401, 400, ALICE, b"miner\0", ticks=(99 * TICKS, 0, 0, 0), pss_kb=99)
    return root


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gpus: list[dict]) -> str:
    """The lab's FAKE nvidia-smi with these GPUs, as an executable path."""
    state = tmp_path / "hw.json"
    state.write_text(json.dumps({"gpus": gpus, "driver_version": "550.54.15"}))
    monkeypatch.setenv("TACC_FAKE_HW_STATE", str(state))
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f'#!/bin/sh\nexec {sys.executable} {FAKE_SMI} "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return str(tool)


def two_gpus(processes1: list[dict] | None = None, processes0: list[dict] | None = None) -> list:
    return [
        {"pci": "0000:17:00.0", "name": "NVIDIA H100 80GB HBM3", "uuid": UUID0,
         "memory_mib": 81559, "utilization_percent": 10, "processes": processes0 or []},
        {"pci": "0000:2a:00.0", "name": "NVIDIA H100 80GB HBM3", "uuid": UUID1,
         "memory_mib": 81559, "utilization_percent": 75, "processes": processes1 or []},
    ]  # fmt: skip


def by_name(samples: list) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in samples}


def labels(job: str, gpu: str | None = None) -> tuple:
    found = {"job": job, "user": ALICE_NAME} | ({"gpu": gpu} if gpu else {})
    return tuple(sorted(found.items()))


# --- /proc ------------------------------------------------------------------------------


def test_jobs_are_the_processes_below_a_root_step_daemon(proc: Path):
    jobs = job_usage.jobs_from_proc(str(proc))
    assert sorted(jobs) == ["41", "42"]
    assert jobs["41"].pids == {101, 111, 112, 113}
    # utime+stime+cutime+cstime of each: 4 + 1 + 1 seconds
    assert jobs["41"].cpu_seconds == 6.0
    # Pss where smaps_rollup is readable, else VmRSS
    assert jobs["41"].memory_bytes == (1000 + 500 + 200) * 1024
    assert (jobs["41"].user, jobs["41"].cpus, jobs["41"].gpu_indices) == (ALICE_NAME, 4, {1})
    assert (jobs["42"].cpus, jobs["42"].gpu_indices, jobs["42"].cpu_seconds) == (2, set(), 1.0)


@pytest.mark.security
def test_an_environment_or_a_title_a_user_wrote_adds_nothing_to_a_job(proc: Path):
    jobs = job_usage.jobs_from_proc(str(proc))
    assert 300 not in jobs["41"].pids and 401 not in jobs["41"].pids
    assert 0 not in jobs["41"].gpu_indices  # the shell's forged SLURM_JOB_GPUS=0


def test_a_process_that_ends_while_read_is_skipped(proc: Path):
    (proc / "112" / "status").unlink()
    (proc / "113" / "stat").write_text("")
    jobs = job_usage.jobs_from_proc(str(proc))
    assert jobs["41"].pids == {101, 111}


@pytest.mark.parametrize(("text", "expected"), [
    ("0,1", {0, 1}), ("0-3", {0, 1, 2, 3}), ("2,4-5", {2, 4, 5}), ("", set()),
    ("N/A", set()), ("gpu:1", set()),
])  # fmt: skip
def test_slurm_gpu_index_lists(text: str, expected: set[int]):
    assert job_usage.indices(text) == expected


# --- cgroups ----------------------------------------------------------------------------


def test_cgroup_v2_figures_replace_the_process_sums(proc: Path, tmp_path: Path):
    scope = tmp_path / "cg" / "system.slice" / "slurmstepd.scope" / "job_41"
    scope.mkdir(parents=True)
    (scope / "cpu.stat").write_text("usage_usec 12500000\nuser_usec 10000000\n")
    (scope / "memory.current").write_text("734003200\n")
    sources = Sources(str(proc), str(tmp_path / "cg"), nvidia_smi=str(tmp_path / "none"))
    found = by_name(job_usage.collect(sources))
    assert found["job_cpu_seconds_total", labels("41")] == 12.5
    assert found["job_memory_bytes", labels("41")] == 734003200
    assert found["job_cpus", labels("41")] == 4
    assert found["job_cpu_seconds_total", labels("42")] == 1.0  # no cgroup: /proc


def test_cgroup_v1_figures(proc: Path, tmp_path: Path):
    cpu = tmp_path / "cg" / "cpu,cpuacct" / "slurm" / f"uid_{ALICE}" / "job_42"
    memory = tmp_path / "cg" / "memory" / "slurm" / f"uid_{ALICE}" / "job_42"
    cpu.mkdir(parents=True)
    memory.mkdir(parents=True)
    (cpu / "cpuacct.usage").write_text("3000000000\n")
    (memory / "memory.usage_in_bytes").write_text("1048576\n")
    assert job_usage.cgroup_figures(str(tmp_path / "cg"), "42") == (3.0, 1048576)
    assert job_usage.cgroup_figures(str(tmp_path / "cg"), "41") is None


# --- GPUs (the lab's FAKE nvidia-smi) ---------------------------------------------------


def test_gpu_figures_of_the_gpus_slurm_gave_and_of_shared_gpus(proc, tmp_path, monkeypatch):
    # GPU 1 is job 41's (SLURM_JOB_GPUS=1); job 42 runs a process on GPU 0 (a shard: no
    # variable), next to a process of no job.
    smi = fake_smi(tmp_path, monkeypatch, two_gpus(
        processes1=[{"pid": 111, "name": "python", "used_mib": 2048}],
        processes0=[{"pid": 201, "name": "python", "used_mib": 512},
                    {"pid": 300, "name": "python", "used_mib": 1024}],
    ))  # fmt: skip
    sources = Sources(str(proc), str(tmp_path / "no-cgroups"), smi)
    found = by_name(job_usage.collect(sources))
    assert found["job_gpu_utilization_ratio", labels("41", "1")] == 0.75
    assert found["job_gpu_memory_used_bytes", labels("41", "1")] == 2048 << 20
    assert found["job_gpu_memory_total_bytes", labels("41", "1")] == 81559 << 20
    assert ("job_gpu_utilization_ratio", labels("41", "0")) not in found
    assert found["job_gpu_utilization_ratio", labels("42", "0")] == 0.1
    assert found["job_gpu_memory_used_bytes", labels("42", "0")] == 512 << 20  # its own only


def test_no_nvidia_smi_or_no_gpus_means_no_gpu_families_and_no_error(proc, tmp_path,
                                                                      monkeypatch):  # fmt: skip
    for smi in (str(tmp_path / "absent"), fake_smi(tmp_path, monkeypatch, [])):
        samples = job_usage.collect(Sources(str(proc), str(tmp_path), smi))
        assert {s.name for s in samples} == {"job_cpu_seconds_total", "job_memory_bytes",
                                             "job_cpus"}  # fmt: skip


def test_a_stuck_nvidia_smi_is_cut_off(proc, tmp_path):
    tool = tmp_path / "stuck-smi"
    tool.write_text("#!/bin/sh\nexec sleep 30\n")
    tool.chmod(0o755)
    samples = job_usage.collect(Sources(str(proc), str(tmp_path), str(tool), 0.3))
    assert samples and not any(s.name.startswith("job_gpu") for s in samples)


def test_fake_nvidia_smi_query_compute_apps(tmp_path, monkeypatch):
    smi = fake_smi(tmp_path, monkeypatch, two_gpus(
        processes1=[{"pid": 111, "name": "python", "used_mib": 2048}]))  # fmt: skip
    out = job_usage.command([smi, "--query-compute-apps=pid,gpu_uuid,used_memory",
                             "--format=csv,noheader,nounits"], 10)  # fmt: skip
    assert (out.code, out.stdout) == (0, f"111, {UUID1}, 2048\n")
    out = job_usage.command([smi, "--query-compute-apps=pid,process_name,used_gpu_memory",
                             "--format=csv"], 10)  # fmt: skip
    assert out.stdout.splitlines() == ["pid, process_name, used_gpu_memory [MiB]",
                                       "111, python, 2048 MiB"]  # fmt: skip
    out = job_usage.command([smi, "--query-gpu=index,utilization.gpu,memory.used",
                             "--format=csv,noheader,nounits"], 10)  # fmt: skip
    assert out.stdout.splitlines() == ["0, 10, 0", "1, 75, 2048"]


def test_fake_nvidia_smi_with_no_compute_process_prints_nothing(tmp_path, monkeypatch):
    smi = fake_smi(tmp_path, monkeypatch, two_gpus())
    out = job_usage.command([smi, "--query-compute-apps=pid,used_memory",
                             "--format=csv,noheader"], 10)  # fmt: skip
    assert (out.code, out.stdout) == (0, "")
    out = job_usage.command([smi, "--query-compute-apps=pid,fan", "--format=csv"], 10)
    assert out.code == 2 and 'Field "fan" is not a valid field to query.' in out.problem
    out = job_usage.command([smi, "--query-compute-apps=pid", "--query-gpu=index",
                             "--format=csv"], 10)  # fmt: skip
    assert out.code == 2


# --- the collector: cache, exposition ---------------------------------------------------


def test_scrapes_within_a_second_share_one_reading(proc, tmp_path, monkeypatch):
    reads = []
    real = job_usage.collect
    monkeypatch.setattr(job_usage, "collect", lambda sources: reads.append(1) or real(sources))
    now = [100.0]
    collector = JobUsageCollector(Sources(str(proc), str(tmp_path), "absent"), lambda: now[0])
    threads = [threading.Thread(target=collector.current) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    now[0] += 0.5
    collector.current()
    assert len(reads) == 1
    now[0] += 0.6
    collector.current()
    assert len(reads) == 2


def test_exposition_is_declared_typed_and_labelled(proc, tmp_path):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobUsageCollector(Sources(str(proc), str(tmp_path), "absent")))
    text = generate_latest(registry).decode()
    assert "# HELP tacc_agent_job_cpu_seconds_total CPU time" in text
    assert "# TYPE tacc_agent_job_cpu_seconds_total counter" in text
    assert "# TYPE tacc_agent_job_memory_bytes gauge" in text
    parsed = {
        (s.name, s.labels["job"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert parsed["tacc_agent_job_cpu_seconds_total", "41"] == 6.0
    assert parsed["tacc_agent_job_cpus", "42"] == 2


def test_an_unreadable_proc_gives_no_job_figures(tmp_path):
    collector = JobUsageCollector(Sources(str(tmp_path / "gone"), str(tmp_path), "absent"))
    assert collector.current() == []


def test_the_daemon_serves_the_job_families(proc, tmp_path):
    config = AgentConfig(proc_root=str(proc), nvidia_smi=str(tmp_path / "absent"),
                         checks={}, drain=False)  # fmt: skip
    daemon = serve.Daemon(config)
    text = daemon.exposition().decode()
    assert 'tacc_agent_job_memory_bytes{job="41",user=' in text


def test_a_parent_loop_from_reused_pids_ends_the_walk(proc: Path):
    add_process(proc, 500, 501, ALICE, b"a\0")
    add_process(proc, 501, 500, ALICE, b"b\0")
    assert 500 not in job_usage.jobs_from_proc(str(proc))["41"].pids
