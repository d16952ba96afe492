"""Per-job usage on a node (health/job_usage.py): fake /proc and cgroup trees, the lab's
FAKE nvidia-smi (with --query-compute-apps) behind it, and the daemon's /metrics."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from concurrent.futures import wait as wait_for_futures
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tacc_agent import serve
from tacc_agent.config import AgentConfig
from tacc_agent.health import job_usage
from tacc_agent.health.job_usage import JobUsageCollector, Sources
from tacc_agent.hostlist import expand_hostlist
from tests.conftest import ROOT

TICKS = os.sysconf("SC_CLK_TCK")
FAKE_SMI = ROOT / "packages/ops/tacc_lab/fakes/nvidia_smi.py"
UUID0 = "GPU-5f2a1c3e-8b7d-4e6f-9a1b-2c3d4e5f6a7b"
UUID1 = "GPU-6a3b2d4f-9c8e-4f7a-8b2c-3d4e5f6a7b8c"
ALICE = 65534  # not root (the tests may run as root); named "nobody" where it exists
ALICE_NAME = job_usage.user_name(ALICE)


def add_process(
    proc: Path,
    pid: int,
    ppid: int,
    uid: int,
    title: bytes,
    *,
    ticks: tuple[int, int, int, int] = (0, 0, 0, 0),
    pss_kb: int | None = None,
    rss_kb: int = 0,
    environ: dict[str, str] | None = None,
) -> None:
    base = proc / str(pid)
    base.mkdir(parents=True)
    utime, stime, cutime, cstime = ticks
    name = title.split(b"\0")[0].decode()[:15] or "x"
    rest = f"S {ppid} {pid} {pid} 0 -1 0 0 0 0 0 {utime} {stime} {cutime} {cstime} 20 0 1 0 1000"
    (base / "stat").write_text(f"{pid} ({name}) {rest}\n")
    (base / "status").write_text(
        f"Name:\t{name}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nVmRSS:\t{rss_kb} kB\n"
    )
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
    add_process(
        root,
        111,
        110,
        ALICE,
        b"python\0train.py\0",
        ticks=(2 * TICKS, TICKS, TICKS, 0),
        pss_kb=1000,
        rss_kb=3000,
        environ=env41,
    )
    add_process(
        root,
        112,
        110,
        ALICE,
        b"python\0train.py\0",
        ticks=(TICKS, 0, 0, 0),
        pss_kb=500,
        rss_kb=2500,
        environ=env41,
    )
    add_process(root, 113, 111, ALICE, b"worker\0", ticks=(TICKS, 0, 0, 0), rss_kb=200)
    add_process(root, 200, 1, 0, b"slurmstepd: [42.batch]\0")
    env42 = {"SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "2"}
    add_process(
        root, 201, 200, ALICE, b"bash\0job.sh\0", ticks=(TICKS, 0, 0, 0), pss_kb=100, environ=env42
    )
    # Not a job's: a login shell, and a process naming job 41 in its own environment
    # (anyone can write SLURM_JOB_ID=41): membership comes from the step daemon only.
    add_process(
        root,
        300,
        1,
        ALICE,
        b"bash\0",
        ticks=(50 * TICKS, 0, 0, 0),
        pss_kb=9000,
        environ={"SLURM_JOB_ID": "41", "SLURM_JOB_GPUS": "0"},
    )
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
        {
            "pci": "0000:17:00.0",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": UUID0,
            "memory_mib": 81559,
            "utilization_percent": 10,
            "processes": processes0 or [],
        },
        {
            "pci": "0000:2a:00.0",
            "name": "NVIDIA H100 80GB HBM3",
            "uuid": UUID1,
            "memory_mib": 81559,
            "utilization_percent": 75,
            "processes": processes1 or [],
        },
    ]


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
    smi = fake_smi(
        tmp_path,
        monkeypatch,
        two_gpus(
            processes1=[{"pid": 111, "name": "python", "used_mib": 2048}],
            processes0=[
                {"pid": 201, "name": "python", "used_mib": 512},
                {"pid": 300, "name": "python", "used_mib": 1024},
            ],
        ),
    )
    sources = Sources(str(proc), str(tmp_path / "no-cgroups"), smi)
    found = by_name(job_usage.collect(sources))
    assert found["job_gpu_utilization_ratio", labels("41", "1")] == 0.75
    assert found["job_gpu_memory_used_bytes", labels("41", "1")] == 2048 << 20
    assert found["job_gpu_memory_total_bytes", labels("41", "1")] == 81559 << 20
    assert ("job_gpu_utilization_ratio", labels("41", "0")) not in found
    assert found["job_gpu_utilization_ratio", labels("42", "0")] == 0.1
    assert found["job_gpu_memory_used_bytes", labels("42", "0")] == 512 << 20  # its own only


def test_no_nvidia_smi_or_no_gpus_means_no_gpu_families_and_no_error(proc, tmp_path, monkeypatch):
    for smi in (str(tmp_path / "absent"), fake_smi(tmp_path, monkeypatch, [])):
        samples = job_usage.collect(Sources(str(proc), str(tmp_path), smi))
        assert {s.name for s in samples} == {
            "job_cpu_seconds_total",
            "job_memory_bytes",
            "job_cpus",
        }


def test_a_stuck_nvidia_smi_is_cut_off(proc, tmp_path):
    tool = tmp_path / "stuck-smi"
    tool.write_text("#!/bin/sh\nexec sleep 30\n")
    tool.chmod(0o755)
    samples = job_usage.collect(Sources(str(proc), str(tmp_path), str(tool), 0.3))
    assert samples and not any(s.name.startswith("job_gpu") for s in samples)


def test_fake_nvidia_smi_query_compute_apps(tmp_path, monkeypatch):
    smi = fake_smi(
        tmp_path,
        monkeypatch,
        two_gpus(processes1=[{"pid": 111, "name": "python", "used_mib": 2048}]),
    )
    out = job_usage.command(
        [smi, "--query-compute-apps=pid,gpu_uuid,used_memory", "--format=csv,noheader,nounits"], 10
    )
    assert (out.code, out.stdout) == (0, f"111, {UUID1}, 2048\n")
    out = job_usage.command(
        [smi, "--query-compute-apps=pid,process_name,used_gpu_memory", "--format=csv"], 10
    )
    assert out.stdout.splitlines() == [
        "pid, process_name, used_gpu_memory [MiB]",
        "111, python, 2048 MiB",
    ]
    out = job_usage.command(
        [smi, "--query-gpu=index,utilization.gpu,memory.used", "--format=csv,noheader,nounits"], 10
    )
    assert out.stdout.splitlines() == ["0, 10, 0", "1, 75, 2048"]


def test_fake_nvidia_smi_with_no_compute_process_prints_nothing(tmp_path, monkeypatch):
    smi = fake_smi(tmp_path, monkeypatch, two_gpus())
    out = job_usage.command(
        [smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader"], 10
    )
    assert (out.code, out.stdout) == (0, "")
    out = job_usage.command([smi, "--query-compute-apps=pid,fan", "--format=csv"], 10)
    assert out.code == 2 and 'Field "fan" is not a valid field to query.' in out.problem
    out = job_usage.command(
        [smi, "--query-compute-apps=pid", "--query-gpu=index", "--format=csv"], 10
    )
    assert out.code == 2


# --- the collector: cache, exposition ---------------------------------------------------


def test_scrapes_within_a_second_share_one_reading(proc, tmp_path, monkeypatch):
    reads = []
    real = job_usage.collect
    monkeypatch.setattr(job_usage, "collect", lambda *args: reads.append(1) or real(*args))
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
    config = AgentConfig(
        proc_root=str(proc), nvidia_smi=str(tmp_path / "absent"), checks={}, drain=False
    )
    daemon = serve.Daemon(config)
    text = daemon.exposition().decode()
    assert 'tacc_agent_job_memory_bytes{job="41",user=' in text


def test_a_parent_loop_from_reused_pids_ends_the_walk(proc: Path):
    add_process(proc, 500, 501, ALICE, b"a\0")
    add_process(proc, 501, 500, ALICE, b"b\0")
    assert 500 not in job_usage.jobs_from_proc(str(proc))["41"].pids


# --- Slurm's allocation (scontrol show job -d -o) ---------------------------------------

HEAD = (
    "JobId={job} JobName=wrap UserId=alice(2001) GroupId=alice(2001) MCS_label=N/A "
    "JobState=RUNNING NodeList=n[2-3] BatchHost=n2 NumNodes=2 NumCPUs=3 NumTasks=3 "
    "CPUs/Task=1 TRES=cpu=3,mem=200M,node=2,billing=3 CoreSpec=* JOB_GRES={job_gres}  "
)
TAIL = (
    " MinCPUsNode=1 MinMemoryNode=100M MinTmpDiskNode=0 Features=(null) "
    "Command=(null) WorkDir=/home/alice StdOut=/home/alice/slurm-{job}.out Power= "
)
# As Slurm 22.05 printed it on the lab (job 29: sbatch -N2 -n3 --mem=100M)
LAB_GROUPS = " Nodes=n2 CPU_IDs=0-1 Mem=100 GRES=   Nodes=n3 CPU_IDs=0 Mem=100 GRES="


def scontrol_line(job: str, groups: str, job_gres: str = "(null)") -> str:
    return HEAD.format(job=job, job_gres=job_gres) + groups + TAIL.format(job=job)


@pytest.mark.parametrize(
    ("node", "groups", "expected"),
    [
        ("n2", LAB_GROUPS, (2, set())),
        ("n3", LAB_GROUPS, (1, set())),
        ("n3.cluster.example", LAB_GROUPS, (1, set())),  # an FQDN host name: its short name
        ("n1", LAB_GROUPS, (None, set())),  # not one of the job's nodes
        ("n3", " Nodes=n[2-3] CPU_IDs=0,2-3 Mem=100 GRES=gpu:2(IDX:0-1)", (3, {0, 1})),
        ("n2", " Nodes=n2 CPU_IDs=0-7 Mem=100 GRES=gpu:a100:1(IDX:3),shard:2(2/10,0/10)", (8, {3})),
        ("n2", " Nodes=n2 CPU_IDs=0-3 Mem=100 GRES=shard:2(2/10,0/10,0/10)", (4, set())),
        (
            "gpu-02",
            " Nodes=gpu-[01-03] CPU_IDs=4-5 Mem=1 GRES=gpu:tesla:2(IDX:1,3),mps:100(0/100)",
            (2, {1, 3}),
        ),
    ],
)
def test_the_node_group_naming_this_node(node: str, groups: str, expected: tuple):
    found = job_usage.allocation_here(scontrol_line("29", groups), node)
    assert (found.cpus, set(found.gpus)) == expected


@pytest.mark.security
def test_a_group_forged_in_a_job_name_or_comment_is_not_trusted():
    # sbatch --job-name "x JOB_GRES=a  Nodes=n2 CPU_IDs=0-9 Mem=1 GRES= MinCPUsNode=1":
    # the lab printed this name as it is, before the real groups.
    forged = "x JOB_GRES=a  Nodes=n2 CPU_IDs=0-9 Mem=1 GRES=gpu:8(IDX:0-7) MinCPUsNode=1"
    line = scontrol_line("29", LAB_GROUPS).replace("JobName=wrap", f"JobName={forged}")
    assert job_usage.allocation_here(line, "n2") == job_usage.NOT_HERE
    comment = scontrol_line("29", LAB_GROUPS) + "Comment=" + forged
    assert job_usage.allocation_here(comment, "n2") == job_usage.NOT_HERE
    # Groups outside JOB_GRES=...MinCPUsNode= (a name without the two words) count not.
    name_only = "x  Nodes=n2 CPU_IDs=0-9 Mem=1 GRES=gpu:8(IDX:0-7)"
    line = scontrol_line("29", LAB_GROUPS).replace("JobName=wrap", f"JobName={name_only}")
    assert job_usage.allocation_here(line, "n2") == job_usage.Allocation(2)


@pytest.mark.parametrize(
    ("hostlist", "expected"),
    [
        ("n2", ["n2"]),
        ("n[2-3,5]", ["n2", "n3", "n5"]),
        ("n[01-03]", ["n01", "n02", "n03"]),
        ("a,b", ["a", "b"]),
        ("gpu-[1-2]x", ["gpu-1x", "gpu-2x"]),
        ("n[2-3],login1", ["n2", "n3", "login1"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("n[008-010]", ["n008", "n009", "n010"]),
        ("", []),
        ("n[2-", []),
        ("n[a-b]", []),
        ("n[1-999999999]", []),
    ],
)
def test_slurm_hostlists_expand(hostlist: str, expected: list[str]):
    assert expand_hostlist(hostlist) == expected


def fake_scontrol(
    tmp_path: Path, lines: dict[str, str], *, code: int = 0, gate: Path | None = None
) -> Path:
    """A scontrol that logs its argv to calls.log, prints the line of the job asked
    (with a `gate`: once that file exists, or after 60 s as a guard against a hang) and
    then logs the job to answered.log."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps(lines))
    held = "False" if gate is None else f"not os.path.exists({str(gate)!r})"
    tool = tmp_path / "scontrol"
    tool.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys, time\n"
        f"open({str(tmp_path / 'calls.log')!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "guard = time.monotonic() + 60\n"
        f"while {held} and time.monotonic() < guard:\n"
        "    time.sleep(0.01)\n"
        f"print(json.load(open({str(answers)!r})).get(sys.argv[-1], ''))\n"
        f"open({str(tmp_path / 'answered.log')!r}, 'a').write(sys.argv[-1] + '\\n')\n"
        f"sys.exit({code})\n"
    )
    tool.chmod(0o755)
    return tool


def calls(tmp_path: Path) -> list[str]:
    log = tmp_path / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


def unreadable_environ(proc: Path) -> None:
    """As the daemon sees other users' tasks (no CAP_SYS_PTRACE): environ unreadable."""
    for environ in proc.glob("*/environ"):
        environ.unlink()


def test_collect_takes_cpus_and_gpus_from_slurm_without_environ(proc, tmp_path, monkeypatch):
    unreadable_environ(proc)
    scontrol = fake_scontrol(
        tmp_path,
        {
            "41": scontrol_line("41", " Nodes=n[2-3] CPU_IDs=0-5 Mem=100 GRES=gpu:1(IDX:1)"),
            "42": scontrol_line("42", " Nodes=n[1-3] CPU_IDs=6-7 Mem=100 GRES="),
        },
    )
    smi = fake_smi(tmp_path, monkeypatch, two_gpus())
    sources = Sources(
        str(proc),
        str(tmp_path / "no-cgroups"),
        smi,
        scontrol=str(scontrol),
        scontrol_wait_seconds=10,
        node="n3",
    )
    found = by_name(job_usage.collect(sources))
    assert found["job_cpus", labels("41")] == 6
    assert found["job_cpus", labels("42")] == 2
    assert found["job_gpu_utilization_ratio", labels("41", "1")] == 0.75
    assert found["job_gpu_memory_total_bytes", labels("41", "1")] == 81559 << 20
    assert not any(key[0].startswith("job_gpu") and ("job", "42") in key[1] for key in found)
    assert sorted(calls(tmp_path)) == ["show job -d -o 41", "show job -d -o 42"]


@pytest.mark.security
def test_slurms_answer_wins_over_a_tasks_environment(proc, tmp_path):
    # Job 41's tasks say SLURM_JOB_GPUS=1 and 4 CPUs; Slurm gave it 2 CPUs and no GPU.
    scontrol = fake_scontrol(tmp_path, {"41": scontrol_line("41", LAB_GROUPS)})
    sources = Sources(
        str(proc),
        str(tmp_path),
        "absent",
        scontrol=str(scontrol),
        scontrol_wait_seconds=10,
        node="n2",
    )
    jobs = {s.labels["job"]: s.value for s in job_usage.collect(sources) if s.name == "job_cpus"}
    assert jobs == {"41": 2, "42": 2}  # 42: Slurm printed nothing, its environment stays


def test_one_scontrol_per_job_for_its_life(proc, tmp_path):
    unreadable_environ(proc)
    scontrol = fake_scontrol(
        tmp_path, {"41": scontrol_line("41", LAB_GROUPS), "42": scontrol_line("42", LAB_GROUPS)}
    )
    now = [100.0]
    sources = Sources(
        str(proc),
        str(tmp_path),
        "absent",
        scontrol=str(scontrol),
        scontrol_wait_seconds=10,
        node="n2",
    )
    collector = JobUsageCollector(sources, lambda: now[0])
    for _ in range(3):
        cpus = {s.labels["job"]: s.value for s in collector.current() if s.name == "job_cpus"}
        assert cpus == {"41": 2, "42": 2}
        now[0] += 5
    assert sorted(calls(tmp_path)) == ["show job -d -o 41", "show job -d -o 42"]
    # Job 42 ends: its answer is dropped; a job 42 seen again is asked again.
    (proc / "200" / "cmdline").write_bytes(b"bash\0")
    collector.current()
    assert set(collector.allocations.known) == {"41"}
    (proc / "200" / "cmdline").write_bytes(b"slurmstepd: [42.batch]\0")
    now[0] += 5
    collector.current()
    assert sorted(calls(tmp_path))[-1] == "show job -d -o 42" and len(calls(tmp_path)) == 3


@pytest.mark.fault
@pytest.mark.parametrize("failure", ["missing", "exit 1", "garbage"])
def test_a_failing_scontrol_gives_no_cpus_and_is_asked_again_later(proc, tmp_path, failure):
    unreadable_environ(proc)
    if failure == "missing":
        scontrol = tmp_path / "no-scontrol"
    else:
        line = "slurm_load_jobs error: Socket timed out" if failure == "exit 1" else "JobId="
        scontrol = fake_scontrol(
            tmp_path, {"41": line, "42": line}, code=1 if failure == "exit 1" else 0
        )
    now = [100.0]
    sources = Sources(
        str(proc),
        str(tmp_path),
        "absent",
        scontrol=str(scontrol),
        scontrol_wait_seconds=10,
        node="n2",
    )
    collector = JobUsageCollector(sources, lambda: now[0])
    assert collector.current() and not any(s.name == "job_cpus" for s in collector.current())
    asked = len(calls(tmp_path))
    now[0] += 2  # a scrape soon after does not ask again
    collector.current()
    assert len(calls(tmp_path)) == asked
    if failure != "missing":  # Slurm answers now
        scontrol.unlink()
        fake_scontrol(tmp_path, {"41": scontrol_line("41", LAB_GROUPS)})
    now[0] += job_usage.SCONTROL_RETRY_SECONDS
    cpus = {s.labels["job"]: s.value for s in collector.current() if s.name == "job_cpus"}
    assert cpus == ({} if failure == "missing" else {"41": 2})


@pytest.mark.fault
def test_a_slow_scontrol_never_holds_a_scrape_until_it_answers(proc, tmp_path):
    unreadable_environ(proc)
    gate = tmp_path / "answer-now"
    scontrol = fake_scontrol(tmp_path, {"41": scontrol_line("41", LAB_GROUPS)}, gate=gate)
    now = [100.0]
    sources = Sources(
        str(proc),
        str(tmp_path),
        "absent",
        scontrol=str(scontrol),
        scontrol_seconds=60,
        scontrol_wait_seconds=0.2,
        node="n2",
    )
    collector = JobUsageCollector(sources, lambda: now[0])
    samples = collector.current()  # scontrol cannot answer yet: the scrape comes back without
    assert samples and not any(s.name == "job_cpus" for s in samples)
    assert not (tmp_path / "answered.log").exists()
    gate.touch()  # the lookup ends meanwhile: the next scrape has it, without asking again
    running = list(collector.allocations.running.values())
    assert wait_for_futures(running, timeout=60).not_done == set()  # (a guard against a hang)
    now[0] += 1
    cpus = {s.labels["job"]: s.value for s in collector.current() if s.name == "job_cpus"}
    assert cpus == {"41": 2}
    assert calls(tmp_path).count("show job -d -o 41") == 1


@pytest.mark.fault
def test_a_hung_scontrol_is_cut_off_and_never_raises(proc, tmp_path):
    scontrol = fake_scontrol(tmp_path, {}, gate=tmp_path / "never")
    sources = Sources(
        str(proc),
        str(tmp_path),
        "absent",
        scontrol=str(scontrol),
        scontrol_seconds=0.3,
        scontrol_wait_seconds=2,
        node="n2",
    )
    assert job_usage.lookup(sources, "41") is None
    # Cut off, not waited for: it never answered, and nothing of it runs on.
    assert not (tmp_path / "answered.log").exists()
    assert subprocess.run(["pgrep", "-f", str(scontrol)], capture_output=True).stdout == b""
    found = {s.labels["job"]: s.value for s in job_usage.collect(sources) if s.name == "job_cpus"}
    assert found == {"41": 4, "42": 2}  # the environment where readable (the fallback)
