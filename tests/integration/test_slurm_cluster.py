"""Issues [2], [5] and [6] on a real lab: converge site.yml, Slurm works across nodes;
the researchers alice and bob run tasks end to end with tcloud (scheduling and execution
layers); the node agent checks, drains and resumes through the real Slurm; adding a node
does not disturb a running job.

Runs in CI as root, on the factory's `slurm` lab (tests/integration/labs.py: SLURM,
10.77.6.0/24, the prebaked image).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from tacc_agent.config import AgentConfig
from tacc_lab.demo import researcher_env
from tests.conftest import BIN, ROOT, run_cli

# Other issues' cases run on this module's lab, before its own tests (which power nodes
# off and add one): collected here.
from tests.integration.container_roles_cases import (  # noqa: F401  (issue [13], ops side)
    test_a_researcher_cannot_push_into_the_cluster_registry,
    test_a_researcher_pulls_unpacks_and_runs_the_image_rootless,
    test_pushing_the_seed_again_changes_nothing,
    test_the_registry_serves_the_seeded_archive_by_its_digest,
)
from tests.integration.containers_cases import (  # noqa: F401  (issue [13]: tasks in images)
    test_c1_a_two_node_task_runs_inside_the_registry_image_on_both_nodes,
    test_c2_a_second_job_of_the_same_image_pulls_nothing,
    test_c3_the_mpi_example_runs_in_the_image_on_two_nodes_by_two_ranks,
    test_c4_cancel_leaves_no_ch_run_and_no_program_on_any_node,
    test_c5_an_image_that_does_not_exist_is_refused_at_submit_before_any_upload,
    test_c6_in_the_container_a_researcher_is_themselves_and_sees_no_other_workspace,
    test_c7_image_plus_requirements_runs_in_a_venv_on_the_images_python_and_reruns_alike,
    test_c8_a_public_image_comes_through_the_cache_and_the_next_user_from_it_alone,
)
from tests.integration.dashboard_cases import (  # noqa: F401  (issue [25]: the web view)
    running_jobs,
    test_d1_alice_sees_her_job_its_logs_and_its_plot_and_nothing_of_bobs,
    test_d2_no_page_of_bobs_shows_alices_job_name_or_owner,
    test_d3_the_broker_gives_bob_none_of_alices_series,
    test_d4_olga_of_tacc_admins_sees_the_nodes_and_the_whole_queue,
)
from tests.integration.frameworks_cases import (  # noqa: F401  (issue [9]; torch: bw lab)
    test_a_legacy_tuxiv_conf_job_runs_unchanged,
    test_mpi_allreduce_on_two_nodes_by_two_ranks,
)
from tests.integration.image_build_cases import (  # noqa: F401  (issue [13]: local builds)
    test_b1_a_two_node_task_runs_in_an_image_built_from_its_containerfile,
    test_b2_two_jobs_of_one_new_build_build_it_once,
    test_b3_a_failing_run_step_fails_the_job_with_its_line_and_leaves_no_half_image,
    test_b4_a_user_line_is_refused_at_submit_with_its_place_and_nothing_is_made,
    test_b5_cancel_during_a_build_leaves_no_build_process_and_no_half_image,
)
from tests.integration.interactive_cases import (  # noqa: F401  (issue [14]: into a job)
    TestIntoARunningJob,
    test_i6_an_idle_session_stops_itself_and_leaves_no_process_or_allocation,
    test_i7_a_session_asked_to_stop_on_disconnect_ends_when_the_client_dies,
)
from tests.integration.isolation_cases import (  # noqa: F401
    test_p1_a_users_own_nfs_client_cannot_claim_another_uid,
    test_p1_root_on_an_nfs_client_is_nobody_on_shared,
    test_p2_a_compute_node_admits_a_researcher_only_while_they_have_a_job_there,
    test_p2_a_researcher_does_not_see_another_researchers_jobs,
    test_p3_researchers_reach_the_separate_login_node_whose_shared_is_nfs,
    test_p7_a_researchers_home_is_private_on_every_node,
)
from tests.integration.lab_helpers import (
    lab_cli,
    node_sh,
    playbook,
    status,
    submit,
    wait_state,
)
from tests.integration.labs import SLURM_LAB
from tests.integration.operations_cases import (  # noqa: F401  (issue [15]: operating it)
    acceptance_override,
    accepted,
    test_o1_prometheus_reports_every_agent_and_node_exporter_up,
    test_o2_a_node_drained_by_a_failing_check_fires_its_alert_to_the_webhook,
    test_o3_tcloud_usage_matches_the_jobs_the_test_ran,
    test_o4_a_rolling_reboot_in_two_waves_keeps_a_checkpointing_job_alive,
    test_o5_a_rolling_upgrade_brings_the_new_version_and_reboots,
    test_o6_the_cluster_dns_reaches_nodes_with_resolved_or_a_dhcp_client,
    test_o7_quota_shows_her_association_and_no_association_cannot_submit,
)
from tests.integration.research_cases import (  # noqa: F401  (issue [16]: research plug-ins)
    test_r1_an_adaptive_sweep_stops_weak_trials_and_runs_the_best_to_the_end,
    test_r1b_a_sampled_sweep_ranks_its_trials_fetches_the_best_and_reruns_the_same,
    test_r2_tiresias_requeues_a_preemptible_job_of_a_lower_queue_for_one_that_waits,
    test_r3_oort_selects_the_participants_of_a_federated_task_and_off_is_random,
    test_r5_elastic_grows_a_running_job_onto_an_idle_node_and_shrinks_it_for_a_waiting_one,
)
from tests.integration.sdk_cases import (  # noqa: F401  (issue [11]: the SDK on this lab)
    as_researcher,
    test_sdk_cancels_and_another_researcher_cannot_touch_the_job,
    test_sdk_submits_a_dict_task_streams_its_logs_waits_and_downloads,
    test_the_sdk_example_runs_against_the_lab,
)
from tests.integration.timing_cases import (  # noqa: F401  (issue [12]: a job's start marks)
    test_a_two_node_job_marks_its_start_in_order_in_its_private_status,
)

pytestmark = pytest.mark.lab

NAME = SLURM_LAB


@pytest.fixture(scope="module")
def cluster(shaped_lab) -> Path:
    return shaped_lab.inventory


def test_compute_nodes_are_idle(cluster):
    """Idle once the jobs of the cases before (cancelled at their end) have completed."""
    deadline = time.monotonic() + 60
    while True:
        out = node_sh(NAME, "n1", "sinfo -h -N -o '%N %t'").stdout.split("\n")
        nodes = sorted(line for line in out if line)
        if nodes == ["n2 idle", "n3 idle"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert nodes == ["n2 idle", "n3 idle"]


def test_srun_spans_both_compute_nodes(cluster):
    proc = node_sh(NAME, "n1", "timeout 60 srun -N2 hostname")
    assert sorted(proc.stdout.split()) == ["n2", "n3"], proc.stderr


def test_munge_credentials_decode_across_nodes(cluster):
    cred = node_sh(NAME, "n3", "munge -n").stdout.strip()
    proc = node_sh(NAME, "n1", f"echo {cred} | unmunge")
    assert "STATUS:          Success (0)" in proc.stdout
    assert "ENCODE_HOST:     n3" in proc.stdout
    mode = node_sh(NAME, "n2", "stat -c '%a %U' /etc/munge/munge.key").stdout.strip()
    assert mode == "400 munge"


def researcher(name: str, tmp: Path):
    """tcloud as a lab researcher: `eval "$(tacc-lab user NAME)"`, nothing else."""
    env = researcher_env(NAME, name)

    def tcloud_cli(*argv: str, cwd: Path = tmp, stdin: str | None = None):
        return run_cli("tcloud", *argv, env=env, cwd=cwd, stdin=stdin)

    return tcloud_cli


@pytest.fixture(scope="module")
def alice(cluster, tmp_path_factory):
    return researcher("alice", tmp_path_factory.mktemp("alice"))


@pytest.fixture(scope="module")
def bob(cluster, tmp_path_factory):
    return researcher("bob", tmp_path_factory.mktemp("bob"))


def task_dir(root: Path, name: str, run: list[str], nodes: int = 2, resources=None) -> Path:
    root.mkdir()
    limits = {"nodes": nodes, "mem": "100M", "time": "5", **(resources or {})}
    (root / "tcloud.yaml").write_text(json.dumps({"name": name, "resources": limits, "run": run}))
    return root


def test_two_node_job_reports_rank_and_host_and_outputs_download(alice, tmp_path):
    line = (
        'echo "rank $RANK/$WORLD_SIZE on $(hostname) node $TACC_NODE_RANK/$TACC_NUM_NODES '
        'master $MASTER_ADDR:$MASTER_PORT ips $TACC_NODE_IPS"; '
        'echo "$RANK" > "$TACC_WORKDIR/outputs/rank$RANK"'
    )
    job = submit(alice, task_dir(tmp_path / "t", "ranks", [line]))
    info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"))
    assert info["state"] == "COMPLETED", info
    assert [(n["host"], n["rank"], n["state"], n["exit_code"]) for n in info["nodes"]] == [
        ("n2", 0, "COMPLETED", 0),
        ("n3", 1, "COMPLETED", 0),
    ]
    states = [h["state"] for h in info["history"]]
    assert states == ["QUEUED", "PROVISIONING", "RUNNING", "COMPLETED"], states
    log = alice("logs", job).stdout.splitlines()
    # Exactly the program's lines and the agent's; nothing from login shells' rc files.
    assert len([line for line in log if not line.startswith("[job]")]) == 3, log
    ips = "10.77.6.12,10.77.6.13"
    assert f"[n2:0] rank 0/2 on n2 node 0/2 master 10.77.6.12:{20000 + int(job)} ips {ips}" in log
    assert f"[n3:1] rank 1/2 on n3 node 1/2 master 10.77.6.12:{20000 + int(job)} ips {ips}" in log
    # Fail-safe switching: the lab has no RDMA, so TCP, with the reason in the log.
    assert (
        "[n2:0] tacc: transport tcp: no active RDMA port on n2, n3 (fail-safe switching, "
        "NCCL_IB_DISABLE=1)" in log
    )
    assert alice("logs", job, "--node", "1").stdout.splitlines() == [
        line for line in log if line.startswith("[n3:1]")
    ]
    fetched = alice("download", job, str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    assert sorted(p.name for p in (tmp_path / "got/outputs").iterdir()) == ["rank0", "rank1"]
    assert {p.name for p in (tmp_path / "got/logs").iterdir()} >= {
        "job.log",
        "rank-0-n2.log",
        "rank-1-n3.log",
    }


def test_numpy_example_builds_its_environment_once_for_two_jobs(alice, tmp_path):
    example = ROOT / "examples/numpy-ddp"
    first, second = submit(alice, example), submit(alice, example)
    for job in (first, second):
        info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"), 180)
        assert info["state"] == "COMPLETED", (info, alice("logs", job).stdout[-3000:])
    logs = [alice("logs", job).stdout for job in (first, second)]
    built = [line for log in logs for line in log.splitlines() if ": built in " in line]
    reused = [line for log in logs for line in log.splitlines() if ": reused (built by" in line]
    # At most one build: an earlier test's job with the same requirements (the federated
    # example's numpy) may have built it already, then both reuse it.
    assert len(built) <= 1 and len(built) + len(reused) == 2, logs
    envs = json.loads(alice("env", "ls", "--json").stdout)  # alice's torch one may be there
    on_nodes = [e["requirements"] for e in envs if not e["image"]]  # not c7's, on an image
    assert on_nodes.count("numpy") == 1, envs
    assert alice("download", first, str(tmp_path / "got")).returncode == 0
    model = json.loads((tmp_path / "got/outputs/model.json").read_text())
    assert model["world_size"] == 2


def test_failing_job_shows_failed_with_exit_code_and_last_lines(alice, tmp_path):
    project = task_dir(tmp_path / "t", "breaks", ['echo "about to fail on $(hostname)"; exit 3'])
    job = submit(alice, project)
    info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"))
    assert info["state"] == "FAILED" and info["exit_code"] == 3, info
    # Whichever rank fails first stops the other (srun --kill-on-bad-exit).
    failed = [n for n in info["nodes"] if n["exit_code"] == 3]
    where = f"{failed[0]['host']}:{failed[0]['rank']}"
    assert info["reason"].startswith("exit 3 on ") and where in info["reason"], info
    assert f"about to fail on {failed[0]['host']}" in info["last_lines"][where]
    text = alice("status", job).stdout
    assert "FAILED (exit code 3)" in text and f"about to fail on {failed[0]['host']}" in text


def no_process(node: str, pattern: str) -> bool:
    """No process on node whose command line has pattern (filtered here, so the probe
    itself never matches)."""
    table = node_sh(NAME, node, "ps -eo args").stdout.splitlines()
    return not [line for line in table if pattern in line]


def test_cancel_leaves_no_job_process_on_any_node(alice, tmp_path):
    job = submit(alice, task_dir(tmp_path / "t", "sleeper", ["sleep 987"]))
    wait_state(alice, job, ("RUNNING",))
    deadline = time.monotonic() + 30  # RUNNING is recorded as rank 0 starts its program
    while no_process("n2", "sleep 987") or no_process("n3", "sleep 987"):
        assert time.monotonic() < deadline, "the job's program never started on both nodes"
        time.sleep(0.5)
    assert alice("cancel", job).returncode == 0
    info = wait_state(alice, job, ("CANCELLED",), 30)
    deadline = time.monotonic() + 30
    while not all(no_process(n, p) for n in ("n2", "n3") for p in ("sleep 987", info["workdir"])):
        assert time.monotonic() < deadline, "job processes survived cancel"
        time.sleep(1)


def test_a_user_can_neither_read_nor_cancel_another_users_job(alice, bob, tmp_path):
    job = submit(alice, task_dir(tmp_path / "t", "private", ["sleep 600"], nodes=1))
    wait_state(alice, job, ("RUNNING",))
    for verb in (("status", job), ("logs", job), ("cancel", job), ("download", job)):
        proc = bob(*verb)
        assert proc.returncode != 0 and f"no job {job} of yours" in proc.stderr, (verb, proc)
    assert job not in [row["job"] for row in json.loads(bob("ps", "--json").stdout)]
    assert job in [row["job"] for row in json.loads(alice("ps", "--json").stdout)]
    workdir = status(alice, job)["workdir"]
    peek = node_sh(NAME, "n1", f"su bob -c {shlex.quote(f'ls {workdir}')} 2>&1 || true")
    assert "Permission denied" in peek.stdout
    assert bob("cat", f"../alice/{Path(workdir).name}").returncode != 0
    assert status(alice, job)["state"] == "RUNNING"
    assert alice("cancel", job).returncode == 0


def test_impossible_requests_are_refused_at_submit_with_the_reason(alice, tmp_path):
    jobs_before = node_sh(NAME, "n1", "ls /shared/tcloud/alice/jobs | wc -l").stdout
    gpus = task_dir(tmp_path / "g", "greedy", ["true"], nodes=1, resources={"gpus_per_node": 4})
    proc = alice("submit", str(gpus))
    assert proc.returncode == 3, proc
    assert "4 GPUs per node requested, but the most any node in partition" in proc.stderr
    wrong = task_dir(tmp_path / "p", "lost", ["true"], nodes=1, resources={"partition": "nope"})
    proc = alice("submit", str(wrong))
    assert proc.returncode == 3 and "unknown partition 'nope'; this cluster has:" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert node_sh(NAME, "n1", "ls /shared/tcloud/alice/jobs | wc -l").stdout == jobs_before


def test_halt_sends_the_checkpoint_signal_and_resume_runs_it_again(alice, tmp_path):
    # The signal goes to the line's whole process group, as Slurm's does: `sleep` dies of
    # it too, and under bash -e its status 138 could end the shell before the trap ran.
    run = [
        'trap \'echo "checkpoint at $(date +%s)" >> "$TACC_WORKDIR/outputs/ckpt"; exit 0\' '
        'USR1; echo "started"; while true; do sleep 1 || true; done'
    ]
    job = submit(alice, task_dir(tmp_path / "t", "ckpt", run, nodes=1))
    try:
        halt_checkpoint_resume(alice, job, tmp_path)
    finally:  # a failure must not leave a held job that later cases count as waiting
        alice("cancel", job)


def halt_checkpoint_resume(alice, job: str, tmp_path: Path) -> None:
    wait_state(alice, job, ("RUNNING",))
    # "started" comes after the trap is set: a USR1 before it would kill the program
    # (bash's default action), which a loaded host's slow start can otherwise allow.
    deadline = time.monotonic() + 30
    while "started" not in alice("logs", job).stdout:
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.5)
    # A grace period far above what the trap needs, so a loaded host cannot run it out
    # (the cluster's default is 10 s); halt says whether the program made it.
    halted = alice("halt", job, "--grace", "60")
    assert halted.returncode == 0, halted.stderr
    log = alice("logs", job).stdout
    assert "the program exited within the 60 s grace period" in halted.stdout, (halted, log)
    info = wait_state(alice, job, ("HALTED",), 10)
    # Slurm shows the requeued job COMPLETING until the node has ended its step (seconds
    # on a loaded host); then it is held, and it stays halted all along.
    deadline = time.monotonic() + 60
    while info["slurm_state"] == "COMPLETING" and time.monotonic() < deadline:
        time.sleep(0.5)
        info = status(alice, job)
        assert info["state"] == "HALTED", info
    assert info["slurm_state"] in ("PENDING", "REQUEUE_HOLD"), info
    assert "checkpoint signal (SIGUSR1)" in log, log
    assert alice("download", job, str(tmp_path / "got")).returncode == 0
    ckpt = tmp_path / "got/outputs/ckpt"
    workdir = info["workdir"]
    seen = node_sh(NAME, "n1", f"ls -la {workdir} {workdir}/outputs; cat {workdir}/outputs/*")
    assert ckpt.exists() and ckpt.read_text().startswith("checkpoint at"), (log, info, seen)
    assert alice("resume", job).returncode == 0
    queued = status(alice, job)
    assert queued["state"] == "QUEUED" and "held" not in queued["reason"].lower(), queued
    # Slurm starts a requeued job after its credential delay (the lab's cred_expire=20).
    info = wait_state(alice, job, ("RUNNING",), 120)
    assert [h["state"] for h in info["history"]][-3:] == ["QUEUED", "PROVISIONING", "RUNNING"]
    assert alice("cancel", job).returncode == 0
    wait_state(alice, job, ("CANCELLED",), 30)


def test_logs_follow_interleaves_every_node_and_ends_with_the_job(alice, tmp_path):
    run = ['for i in 1 2 3 4 5; do echo "tick $i"; sleep 0.5; done']
    job = submit(alice, task_dir(tmp_path / "t", "ticker", run))
    proc = alice("logs", "-f", job)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for prefix in ("[n2:0]", "[n3:1]"):
        assert [line for line in lines if line.startswith(f"{prefix} tick")] == [
            f"{prefix} tick {i}" for i in range(1, 6)
        ]
    assert status(alice, job)["state"] == "COMPLETED"


def test_tcloud_files(alice, tmp_path):
    (tmp_path / "notes.txt").write_text("remember the milk\n")
    assert alice("upload", str(tmp_path / "notes.txt")).returncode == 0
    listing = json.loads(alice("ls", "--json", "files").stdout)
    assert {"name": "notes.txt", "size": 18, "mode": "0o600"} in listing
    assert alice("cat", "files/notes.txt").stdout == "remember the milk\n"
    escape = alice("cat", "../../../etc/shadow")
    assert escape.returncode == 2 and "outside your cluster directory" in escape.stderr
    bad = alice("cancel", "12; rm -rf /")
    assert bad.returncode == 2 and "not a job id" in bad.stderr


def node_address(inventory: Path, node: str) -> str:
    data = yaml.safe_load(inventory.read_text())
    return data["all"]["hosts"][node]["ansible_host"]


SANDBOXED = [
    "ActiveState=active",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "Restart=on-failure",
]


def test_agent_daemon_runs_sandboxed_writes_facts_and_serves_metrics(cluster):
    for node in ("login1", "n1", "n2", "n3"):
        shown = node_sh(
            NAME,
            node,
            "systemctl show tacc-agent -p ActiveState -p ProtectSystem "
            "-p NoNewPrivileges -p Restart",
        ).stdout
        assert sorted(shown.split()) == SANDBOXED, node
    facts = json.loads(node_sh(NAME, "n2", "cat /run/tacc-agent/facts.json").stdout)
    assert facts["node"] == "n2" and facts["healthy"], facts
    assert facts["checks"]["services"]["detail"] == "munge, slurmd active"
    assert facts["checks"]["mounts"] == {"status": "ok", "detail": "1 mount(s) present and alive"}
    assert facts["rdma"] == {"active_ports": 0}  # no (fake) RDMA in this lab: TCP it is
    controller = json.loads(node_sh(NAME, "n1", "cat /run/tacc-agent/facts.json").stdout)
    assert controller["healthy"], controller
    # from this host (not the allowed scraper): the node's own figures, no per-job series
    # the role's default (tests/unit/agent/test_metrics_access.py)
    port = AgentConfig().metrics_port
    url = f"http://{node_address(cluster, 'n3')}:{port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    assert "tacc_agent_healthy 1.0" in text.splitlines()  # prometheus_client's format
    assert 'tacc_agent_check_status{check="services",status="ok"} 1' in text
    assert 'tacc_agent_check_status{check="gpu",status="absent"} 1' in text
    # one-shot, as HealthCheckProgram or ops would run it: healthy, nothing to do
    proc = node_sh(NAME, "n2", "tacc-agent check")
    # idle, perhaps with a flag the last test's job left for a moment (+completing) or a
    # pending job's plan (+planned): healthy, and the agent has nothing to do.
    assert proc.returncode == 0, proc.stdout
    assert re.search(r"^slurm: n2 idle(\+[a-z]+)*, nothing to do$", proc.stdout, re.M), proc.stdout


BAD_SETTINGS = "services: [munge, slurmd]\nmounts: [{path: /mnt/tacc-missing}]\n"


def sinfo_state(node: str) -> str:
    """`state|reason` without sinfo's `*` (no answer to slurmctld's last ping): on a loaded
    2-core host one ping can miss MessageTimeout, and the mark stays until the next ping,
    up to SlurmdTimeout/3 later. Drain and resume are what these tests are about."""
    state, _, reason = (
        node_sh(NAME, "n1", f"sinfo -h -N -n {node} -o '%t|%E'").stdout.strip().partition("|")
    )
    # `plnd` is an idle node the backfill scheduler has planned for a pending job; the mark
    # stays until its next cycle (bf_interval, 30 s), also after that job started elsewhere
    # or ended. For drain and resume it is idle.
    state = state.rstrip("*")
    return f"{'idle' if state == 'plnd' else state}|{reason}"


def test_agent_drains_resumes_its_own_drain_and_leaves_an_admin_drain_alone(cluster):
    node_sh(NAME, "n3", "systemctl stop tacc-agent")  # one writer at a time in this test
    try:
        node_sh(NAME, "n3", f"printf '{BAD_SETTINGS}' > /tmp/bad.yaml")
        failing = node_sh(NAME, "n3", "tacc-agent --config /tmp/bad.yaml check")
        assert failing.returncode == 1
        reason = "tacc: mounts: /mnt/tacc-missing not mounted"
        assert f"slurm: drained n3: {reason}" in failing.stdout
        assert sinfo_state("n3") == f"drain|{reason}"
        again = node_sh(NAME, "n3", "tacc-agent --config /tmp/bad.yaml check").stdout
        assert "already drained" in again
        healthy = node_sh(NAME, "n3", "tacc-agent check")
        assert healthy.returncode == 0 and f"resumed n3 (was: {reason})" in healthy.stdout
        assert sinfo_state("n3") == "idle|none"
        admin = "DIMM swap [ops]"
        node_sh(NAME, "n1", f"scontrol update NodeName=n3 State=DRAIN Reason='{admin}'")
        ignored = node_sh(NAME, "n3", "tacc-agent --config /tmp/bad.yaml check").stdout
        assert "was drained by an admin" in ignored and "left alone" in ignored
        assert sinfo_state("n3") == f"drain|{admin}"
        assert "nothing to do" in node_sh(NAME, "n3", "tacc-agent check").stdout
        assert sinfo_state("n3") == f"drain|{admin}"  # only an admin resumes it
    finally:
        node_sh(NAME, "n1", "scontrol update NodeName=n3 State=RESUME")
        node_sh(NAME, "n3", "systemctl start tacc-agent")
    assert sinfo_state("n3") == "idle|none"


def test_the_daemon_drains_a_node_whose_mount_vanishes(cluster):
    """A tmpfs the agent watches is unmounted: the daemon (1 s interval here) drains the
    node, and resumes it when the mount is back."""
    settings = "services: [munge, slurmd]\nmounts: [{path: /mnt/tacc-watch, fstype: tmpfs}]\n"
    node_sh(
        NAME,
        "n3",
        "systemctl stop tacc-agent; mkdir -p /mnt/tacc-watch && "
        f"mount -t tmpfs tmpfs /mnt/tacc-watch && printf '{settings}' > /tmp/watch.yaml && "
        "systemd-run --unit tacc-agent-test tacc-agent --config /tmp/watch.yaml serve "
        "--port 19770 --interval 1",
    )
    try:
        time.sleep(2)
        assert sinfo_state("n3") == "idle|none"
        node_sh(NAME, "n3", "umount /mnt/tacc-watch")
        deadline = time.monotonic() + 20
        while not sinfo_state("n3").startswith("drain|"):
            assert time.monotonic() < deadline, "the daemon never drained n3"
            time.sleep(0.5)
        assert sinfo_state("n3") == "drain|tacc: mounts: /mnt/tacc-watch not mounted"
        node_sh(NAME, "n3", "mount -t tmpfs tmpfs /mnt/tacc-watch")
        deadline = time.monotonic() + 20
        while sinfo_state("n3") != "idle|none":
            assert time.monotonic() < deadline, "the daemon never resumed n3"
            time.sleep(0.5)
        log = node_sh(NAME, "n3", "journalctl -u tacc-agent-test -o cat --no-pager").stdout
        assert "slurm: drained n3: tacc: mounts: /mnt/tacc-watch not mounted" in log
    finally:
        node_sh(
            NAME,
            "n3",
            "systemctl stop tacc-agent-test; umount /mnt/tacc-watch; "
            "scontrol update NodeName=n3 State=RESUME; systemctl start tacc-agent",
        )


# ---------------------------------------------------------------- fault suite (issue [7])
def terminal(tcloud, job: str, seconds: int = 120) -> dict:
    return wait_state(tcloud, job, ("COMPLETED", "FAILED", "CANCELLED"), seconds)


@pytest.mark.fault
def test_running_jobs_finish_when_slurmctld_restarts_under_them(alice, tmp_path):
    run = ['sleep 8; echo "outlived the controller on $(hostname)"']
    job = submit(alice, task_dir(tmp_path / "t", "outlives", run))
    wait_state(alice, job, ("RUNNING",))
    restart = node_sh(NAME, "n1", "systemctl restart slurmctld")
    assert restart.returncode == 0, restart
    deadline = time.monotonic() + 60
    while "is UP" not in node_sh(NAME, "n1", "scontrol ping").stdout:
        assert time.monotonic() < deadline, "slurmctld did not come back"
        time.sleep(1)
    # Submitted right after the restart: the controller schedules again.
    after = submit(alice, task_dir(tmp_path / "u", "after", ["echo scheduled"], nodes=1))
    for each in (job, after):
        info = terminal(alice, each)
        assert info["state"] == "COMPLETED", info
    log = alice("logs", job).stdout
    assert "[n2:0] outlived the controller on n2" in log and "[n3:1] outlived" in log, log


def node_up(node: str, seconds: int = 90) -> None:
    deadline = time.monotonic() + seconds
    while sinfo_state(node) not in ("idle|none", "mix|none", "alloc|none"):
        assert time.monotonic() < deadline, f"{node} never came back: {sinfo_state(node)}"
        time.sleep(1)


@pytest.mark.fault
def test_a_node_that_loses_power_mid_job_is_named_and_the_job_runs_again(alice, cluster, tmp_path):
    """Jobs are submitted with --requeue: Slurm requeues a job whose node died (after
    SlurmdTimeout, 30 s in the lab), and it runs again once the node is back."""
    run = [
        'mark="$TACC_WORKDIR/outputs/rank$TACC_NODE_RANK"; '
        'if [ -e "$mark" ]; then echo "second run on $(hostname)"; '
        'else touch "$mark"; exec sleep 600; fi'
    ]
    job = submit(alice, task_dir(tmp_path / "t", "survivor", run))
    wait_state(alice, job, ("RUNNING",))
    deadline = time.monotonic() + 30
    while no_process("n3", "sleep 600"):
        assert time.monotonic() < deadline, "the program never started on n3"
        time.sleep(0.5)
    off = lab_cli(NAME, "poweroff", "n3")
    assert off.returncode == 0 and "power cut" in off.stdout, off
    try:
        info = wait_state(alice, job, ("QUEUED",), 120)
        assert info["reason"].startswith("requeued: node n3 ("), info
        assert "failed during the run" in info["reason"], info
        text = alice("status", job).stdout
        assert "QUEUED" in text and "requeued: node n3" in text, text
    finally:
        up = lab_cli(NAME, "up", "--nodes", "3", "--inventory", str(cluster))
        assert up.returncode == 0, up.stderr
    node_up("n3")
    info = terminal(alice, job, 180)
    assert info["state"] == "COMPLETED", (info, alice("logs", job).stdout[-3000:])
    assert "requeued once: node n3 failed during the run" in alice("status", job).stdout
    log = alice("logs", job).stdout
    assert "run 1 was requeued: node n3" in log and "[n3:1] second run on n3" in log, log


BIG_MIB = 512  # large enough that the cut lands mid-blob however fast SFTP is here


@pytest.mark.fault
def test_an_upload_cut_mid_way_resumes_and_leaves_no_corrupt_blob(alice, tmp_path):
    project = task_dir(tmp_path / "t", "big", ["sha256sum big.bin | cut -c1-64"], nodes=1)
    hashed = hashlib.sha256()
    with (project / "big.bin").open("wb") as big:
        for _ in range(BIG_MIB):
            block = os.urandom(1 << 20)
            big.write(block)
            hashed.update(block)
    digest = hashed.hexdigest()
    partial = Path(f"/var/lib/tacc-lab/{NAME}/shared/tcloud/alice/store/.partial")
    env = researcher_env(NAME, "alice")
    # A root shell on the login node that is already connected, waiting for the word: the
    # cut lands the moment the first 4 MiB are there, not an ssh handshake later.
    killer = subprocess.Popen(
        [
            str(BIN / "tacc-lab"),
            "--name",
            NAME,
            "ssh",
            "login1",
            "read go && pkill -KILL -f '^sshd(-session)?: alice'",
        ],
        stdin=subprocess.PIPE,
        text=True,
    )
    # What other tests' cut uploads left there does not count.
    leftovers = set(partial.glob("*"))
    before = sum(p.stat().st_size for p in leftovers)
    cut = subprocess.Popen(
        [str(BIN / "tcloud"), "submit", str(project)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while sum(p.stat().st_size for p in partial.glob("*")) < before + (4 << 20):
        assert time.monotonic() < deadline and cut.poll() is None, cut.communicate()
        time.sleep(0.02)
    killer.communicate("go\n", timeout=60)  # the connection drops mid-blob
    _, err = cut.communicate(timeout=60)
    assert cut.returncode == 4 and "Traceback" not in err, err
    assert "the upload stopped" in err and "run the command again" in err, err
    sent = sum(p.stat().st_size for p in partial.glob("*")) - before
    assert 0 < sent < (BIG_MIB << 20), sent
    # The next submit sends only the rest and the cluster verifies the whole blob.
    job = submit(alice, project)
    info = terminal(alice, job)
    assert info["state"] == "COMPLETED", info
    assert f"[n2:0] {digest}" in alice("logs", job).stdout
    store = partial.parent
    for blob in store.glob("*-*"):
        with blob.open("rb") as data:
            assert hashlib.file_digest(data, "sha256").hexdigest() == blob.name.split("-")[0]
    assert not set(partial.glob("*")) - leftovers, "a verified blob leaves nothing partial behind"


@pytest.mark.fault
def test_a_killed_agent_is_restarted_by_systemd_without_draining_the_node(cluster):
    def show(prop: str) -> str:
        return node_sh(NAME, "n2", f"systemctl show -P {prop} tacc-agent").stdout.strip()

    restarts, pid = int(show("NRestarts")), show("MainPID")
    # What the agent logs from the kill on: earlier cases (a rolling reboot) drained n2.
    since = node_sh(NAME, "n2", "date +%s").stdout.strip()
    node_sh(NAME, "n2", f"kill -KILL {pid}")
    deadline = time.monotonic() + 30  # RestartSec=5
    states = set()
    while not (show("ActiveState") == "active" and show("MainPID") not in ("0", pid)):
        assert time.monotonic() < deadline, "systemd did not restart the agent"
        states.add(sinfo_state("n2"))
        time.sleep(0.5)
    assert int(show("NRestarts")) == restarts + 1
    for _ in range(6):  # its first checks after the restart: still healthy, still serving
        states.add(sinfo_state("n2"))
        time.sleep(0.5)
    assert {s.split("|")[0] for s in states} <= {"idle", "mix", "alloc"}, states
    journal = node_sh(NAME, "n2", f"journalctl -u tacc-agent -o cat --no-pager --since @{since}")
    journal = journal.stdout
    assert "drained" not in journal, journal


# ---------------------------------------------------------------- issue [8]: plug-ins
def plugin_task(root: Path, task: dict) -> Path:
    root.mkdir()
    limits = {"nodes": 1, "mem": "50M", **task.pop("resources", {})}
    (root / "tcloud.yaml").write_text(json.dumps({"resources": limits, **task}))
    return root


def submit_args(tcloud, project: Path, *extra: str) -> str:
    proc = tcloud("submit", "--json", *extra, str(project))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def test_a_sweep_is_one_job_array_addressed_whole_or_by_trial(alice, tmp_path):
    line = 'echo "trial $TACC_TRIAL/$TACC_TRIALS LR=$LR SEED=$SEED on $(hostname)"'
    project = plugin_task(
        tmp_path / "grid",
        {
            "name": "grid",
            "resources": {"time": "5"},
            "run": [line],
            "sweep": {"parameters": {"LR": [0.1, 0.01], "SEED": [1, 2]}, "parallel": 2},
        },
    )
    refused = alice("submit", str(project))
    assert refused.returncode == 3 and "submit it with --sweep" in refused.stderr
    job = submit_args(alice, project, "--sweep")
    info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"), 120)
    assert info["state"] == "COMPLETED" and info["reason"] == "4 COMPLETED", info
    assert info["plugins"]["sweep"] == "job array 0-3%2 (4 trials)"
    trials = {t["job_id"]: (t["state"], t["parameters"]) for t in info["trials"]}
    assert trials[f"{job}_2"] == ("COMPLETED", {"LR": "0.01", "SEED": "1"}), trials
    whole = alice("logs", job).stdout
    for index, (lr, seed) in enumerate([("0.1", 1), ("0.1", 2), ("0.01", 1), ("0.01", 2)]):
        assert f"] trial {index}/4 LR={lr} SEED={seed} on n" in whole, whole
    one = [x for x in alice("logs", f"{job}_2").stdout.splitlines() if "trial " in x]
    assert len(one) == 1 and "trial 2/4 LR=0.01 SEED=1" in one[0], one
    trial = status(alice, f"{job}_1")
    assert trial["state"] == "COMPLETED" and trial["nodes"][0]["exit_code"] == 0, trial
    assert "grid (4 COMPLETED)" in alice("ps").stdout


def test_sweep_trials_run_in_code_trees_of_their_own_and_download_by_trial(alice, tmp_path):
    """What one trial writes where it runs is not another's (before, all trials ran in the
    sweep's one code/ directory); uploaded and cluster datasets reach every trial
    (/etc/slurm: a configless node has plugstack.conf there, not slurm.conf)."""
    line = (
        'test ! -e result.txt || { echo "collision: $(cat result.txt)"; exit 1; }; '
        'echo "$X" > result.txt; sleep 2; '
        'echo "trial $TACC_TRIAL kept $(cat result.txt)," '
        '"read $(cat "$TACC_DATASETS/words/w.txt")," '
        '"cluster $(test -s "$TACC_DATASETS/etc_slurm/plugstack.conf" && echo ok)"; '
        'echo "$X" > "$TACC_WORKDIR/outputs/x.txt"'
    )
    project = plugin_task(
        tmp_path / "own",
        {
            "name": "own-trees",
            "resources": {"time": "5"},
            "run": [line],
            "datasets": [
                {"name": "words", "local": "data"},
                {"name": "etc_slurm", "cluster": "/etc/slurm"},
            ],
            "sweep": {"parameters": {"X": ["a", "b", "c"]}, "parallel": 3},
        },
    )
    (project / "data").mkdir()
    (project / "data" / "w.txt").write_text("hello")
    job = submit_args(alice, project, "--sweep")
    info = wait_state(alice, job, ("COMPLETED", "FAILED", "CANCELLED"), 120)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED" and info["reason"] == "3 COMPLETED", (info, log)
    for index, value in enumerate("abc"):
        assert f"trial {index} kept {value}, read hello, cluster ok" in log, log
    fetched = alice("download", job, str(tmp_path / "got"))
    assert fetched.returncode == 0, fetched.stderr
    for index, value in enumerate("abc"):
        got = tmp_path / "got" / "trials" / str(index) / "outputs" / "x.txt"
        assert got.read_text() == f"{value}\n"
    one = alice("download", f"{job}_1", str(tmp_path / "one"))
    assert one.returncode == 0 and (tmp_path / "one" / "outputs" / "x.txt").read_text() == "b\n"


def test_a_sweep_trial_or_the_whole_sweep_can_be_cancelled(alice, tmp_path):
    project = plugin_task(
        tmp_path / "long",
        {
            "name": "long-grid",
            "resources": {"time": "5"},
            "run": ["sleep 876"],
            "sweep": {"parameters": {"X": [1, 2, 3]}},
        },
    )
    job = submit_args(alice, project, "--sweep")
    deadline = time.monotonic() + 90
    while [t["state"] for t in status(alice, job)["trials"]].count("RUNNING") < 2:
        assert time.monotonic() < deadline, status(alice, job)
        time.sleep(1)
    assert alice("cancel", f"{job}_0").returncode == 0
    wait_state(alice, f"{job}_0", ("CANCELLED",), 30)
    assert status(alice, job)["state"] in ("RUNNING", "QUEUED")
    assert alice("cancel", job).returncode == 0
    info = wait_state(alice, job, ("CANCELLED",), 30)
    assert {t["state"] for t in info["trials"]} == {"CANCELLED"}, info
    deadline = time.monotonic() + 30
    while not all(no_process(n, "sleep 876") for n in ("n2", "n3")):
        assert time.monotonic() < deadline, "trial processes survived cancel"
        time.sleep(1)


def test_a_node_range_grows_on_an_idle_cluster_and_shrinks_on_a_busy_one(alice, bob, tmp_path):
    line = 'echo "size $TACC_NUM_NODES of $TACC_NODES_MIN-$TACC_NODES_MAX"'
    task = {"name": "elastic", "resources": {"nodes": "1-2", "time": "5"}, "run": [line]}
    deadline = time.monotonic() + 60  # jobs of earlier tests may still be completing
    while not all(sinfo_state(n).startswith("idle|") for n in ("n2", "n3")):
        assert time.monotonic() < deadline, [sinfo_state(n) for n in ("n2", "n3")]
        time.sleep(1)
    grown = submit_args(alice, plugin_task(tmp_path / "a", dict(task)))
    info = wait_state(alice, grown, ("COMPLETED", "FAILED", "CANCELLED"))
    assert info["state"] == "COMPLETED" and len(info["nodes"]) == 2, info
    assert info["plugins"]["elastic"] == "2 node(s) of 1-2", info  # as it ran
    assert "[n2:0] size 2 of 1-2" in alice("logs", grown).stdout
    blocker = submit(bob, task_dir(tmp_path / "b", "blocker", ["sleep 600"], nodes=1))
    wait_state(bob, blocker, ("RUNNING",))
    shrunk = submit_args(alice, plugin_task(tmp_path / "c", dict(task)))
    info = wait_state(alice, shrunk, ("COMPLETED", "FAILED", "CANCELLED"))
    assert info["state"] == "COMPLETED" and len(info["nodes"]) == 1, info
    assert "size 1 of 1-2" in alice("logs", shrunk).stdout
    assert bob("cancel", blocker).returncode == 0


def slurm_time_limit(job: str) -> str:
    out = node_sh(NAME, "n1", f"scontrol show job {job} --oneliner").stdout
    return next(w.split("=", 1)[1] for w in out.split() if w.startswith("TimeLimit="))


def test_duration_prediction_tightens_the_limit_from_earlier_runs_and_can_be_off(alice, tmp_path):
    task = {"name": "predictable", "run": ["sleep 3"]}
    first = submit_args(alice, plugin_task(tmp_path / "a", dict(task)))
    assert wait_state(alice, first, ("COMPLETED", "FAILED"))["state"] == "COMPLETED"
    # The same entry point again, with no time limit: 3 s x 1.5 + 60 s -> 2 minutes.
    second = submit_args(alice, plugin_task(tmp_path / "b", {**task, "run": ["sleep 3"]}))
    assert slurm_time_limit(second) == "00:02:00"
    info = wait_state(alice, second, ("COMPLETED", "FAILED"))
    assert info["plugins"]["duration"].startswith("predicted 00:02:00 from 1 earlier run(s)")
    log = alice("logs", second).stdout
    assert re.search(r"\[job\] tacc: duration: ran \d+ s; predicted limit 120 s", log), log
    # The task turns the plug-in off: the cluster's default limit.
    off = submit_args(alice, plugin_task(tmp_path / "c", {**task, "plugins": ["-duration"]}))
    assert slurm_time_limit(off) == "01:00:00"
    assert "duration" not in wait_state(alice, off, ("COMPLETED", "FAILED"))["plugins"]


def test_las_gives_pending_jobs_of_the_user_with_less_service_more_priority(alice, bob, tmp_path):
    las = "plugins: [las]\nlas_thresholds: [1]\nlas_nice_step: 500\nstate_dir: /root/las-test\n"
    node_sh(NAME, "n1", f"rm -rf /root/las-test; printf '{las}' > /root/las.yaml")
    cpus = node_sh(NAME, "n1", "scontrol show node n2 --oneliner").stdout.split("CPUTot=")[1]
    whole = {"cpus": int(cpus.split()[0])}  # the hog leaves no room on either node
    hog = submit(alice, task_dir(tmp_path / "h", "hog", ["sleep 600"], 2, whole))
    wait_state(alice, hog, ("RUNNING",))
    mine = submit(alice, task_dir(tmp_path / "m", "mine", ["true"], nodes=1))
    theirs = submit(bob, task_dir(tmp_path / "t", "theirs", ["true"], nodes=1))
    # Off by default: the agent's own settings have no las, and nothing changes.
    assert json.loads(node_sh(NAME, "n1", "tacc-agent queue-tick").stdout) == {"changes": []}
    tick = "tacc-agent --config /root/las.yaml queue-tick"
    changes = []
    for _ in range(2):  # the first tick may see the hog at 0 s elapsed
        changes += json.loads(node_sh(NAME, "n1", tick).stdout)["changes"]
        time.sleep(2)
    # alice attained service (the hog): her job stays at nice 0; bob's moves up a queue.
    assert any(f"job {theirs} of bob" in c and "-> -500" in c for c in changes), changes
    assert not any(f"job {mine} " in c for c in changes), changes
    nice = dict(
        line.split()
        for line in node_sh(
            NAME, "n1", f"squeue -h -j {mine},{theirs} -o '%i %y'"
        ).stdout.splitlines()
    )
    assert nice == {mine: "0", theirs: "-500"}, nice
    for tcloud, job in ((alice, hog), (alice, mine), (bob, theirs)):
        tcloud("cancel", job)


def test_added_node_joins_without_disturbing_a_running_job(cluster, tmp_path):
    """Issue [15]: a 4th node joins by a site.yml run limited to the controller and itself
    (cluster DNS, configless Slurm: the old nodes need nothing, test_add_node_render.py
    shows their files unchanged) and a job on an old node stays running. It joins drained
    until its acceptance test passes; with thresholds it cannot reach it stays drained
    with the failing figure in its reason."""
    # The job must outlive the add-node converge, which takes minutes on a loaded host.
    job = node_sh(NAME, "n1", "sbatch --parsable -N1 -w n2 --wrap 'sleep 3600'").stdout.strip()
    deadline = time.monotonic() + 30
    while node_sh(NAME, "n1", f"squeue -h -j {job} -o %T").stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, "job never started"
        time.sleep(1)
    proc = lab_cli(NAME, "up", "--nodes", "4", "--inventory", str(cluster))
    assert proc.returncode == 0, proc.stderr
    impossible = {"mpi_allreduce_node_min_mbps": 10**9}
    extra = acceptance_override(tmp_path, "n4", impossible)
    started = time.monotonic()
    run, changed = playbook(
        cluster, "playbooks/site.yml", "-i", str(extra), "--limit", "n1,n4", expect_ok=False
    )
    print(f"add-node converge (n4 joins): {time.monotonic() - started:.1f} s; changed {changed}")
    # The controller (DNS records, slurm.conf) and the new node change; the old nodes'
    # slurmd learn n4 from `scontrol reconfigure` (24.11's slurmd re-executes itself for
    # it: a new process, its job steps untouched).
    assert changed["n4"] > 0 and changed["n1"] > 0 and set(changed) == {"n1", "n4"}
    # n4's acceptance failed, on its figure: the run says so, n4 stays drained.
    assert run.returncode != 0 and re.search(r"^fatal: \[n4 -> n1", run.stdout, re.M), run.stdout[
        -3000:
    ]
    reason = node_sh(NAME, "n1", "sinfo -h -n n4 -o '%t|%100E'").stdout.strip()
    assert re.fullmatch(
        # drng: 24.11 may still show the acceptance job ending there (draining).
        r"(drain|drng)\|tacc: acceptance failed: mpi allreduce within node "
        r"[\d.]+ MB/s < [\d.e+]+ MB/s",
        reason,
    ), reason
    assert accepted("n4")["passed"] is False
    state = node_sh(NAME, "n1", f"squeue -h -j {job} -o '%T %N'").stdout.strip()
    assert state == "RUNNING n2"
    # The new node resolves by name everywhere, through the DNS, with no hosts file edit.
    assert node_sh(NAME, "n2", "getent hosts n4").stdout.split()[:1] == ["10.77.6.14"]
    # The fault fixed (here: the thresholds), `tacc-agent accept` on the controller tests
    # it again (docs/operations.md; the next site.yml run limited to the controller and the
    # new node does the same) and it takes jobs.
    again = node_sh(NAME, "n1", "tacc-agent accept n4")
    assert again.returncode == 0, again.stdout + again.stderr
    assert accepted("n4")["passed"] is True
    deadline = time.monotonic() + 60
    while "n4 idle" not in node_sh(NAME, "n1", "sinfo -h -N -o '%N %t'").stdout:
        assert time.monotonic() < deadline, "n4 never became idle"
        time.sleep(2)
    assert node_sh(NAME, "n1", "srun -w n4 -N1 hostname").stdout.strip() == "n4"
    node_sh(NAME, "n1", f"scancel {job}")
    # No whole-cluster run after this (a full site.yml and a --check --diff were run here
    # once): test_hardware_roles proves a second run and --check --diff change nothing on
    # every node of a cluster converged from the bare image.
