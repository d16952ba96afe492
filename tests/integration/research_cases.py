"""Issue [16] on the slurm lab: the research systems as plug-ins (docs/plugins.md).

fluid: an adaptive sweep (ASHA over the trials of one job array) stops the weak trials
at their rungs and runs the best one to the end, the rungs shared through a file only
the sweep's owner can write. tiresias: a preemptible job of a lower queue is
checkpointed and requeued for a job that waits, and goes on from its checkpoint. oort:
the federated example with and without the selector. elastic: a running job grown onto
an idle node and shrunk for a job that waits, each by checkpoint and requeue.

Collected as part of test_slurm_cluster.py (which imports these tests), so they run on
its lab and its researchers alice and bob.
"""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import yaml

from tests.conftest import ROOT
from tests.integration.lab_helpers import (
    CHECKPOINTING_COUNTER,
    node_sh,
    resumed_log,
    status,
    submit,
    wait_state,
)
from tests.integration.labs import SLURM_LAB

FINAL = ("COMPLETED", "FAILED", "CANCELLED")


def submit_sweep(tcloud, project: Path) -> str:
    proc = tcloud("submit", "--json", "--sweep", str(project))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["job_id"]


def test_r1_an_adaptive_sweep_stops_weak_trials_and_runs_the_best_to_the_end(alice, tmp_path):
    project = tmp_path / "sweep-adaptive"
    shutil.copytree(ROOT / "examples/sweep-adaptive", project)
    job = submit_sweep(alice, project)
    info = wait_state(alice, job, FINAL, 300)
    log = alice("logs", job).stdout
    assert info["state"] == "COMPLETED" and info["reason"] == "9 COMPLETED", (info, log[-3000:])
    stopped = re.findall(r"fluid: stopped at rung \d+ of 3 \(step (\d+)\)", log)
    finished = re.findall(r"fluid: ran to the last rung \(step 9\)", log)
    # ASHA keeps the top third at each rung: trials stop early, at least one runs on. How
    # many of the first two waves go on depends on the order their values arrive (ASHA
    # is asynchronous: the first value at a rung is the top of it; seen under a loaded
    # run, all three lr=0.05 trials ran to the end); the last wave (lr=0.01, behind the
    # six values before it at the first rung) always stops there.
    assert len(stopped) >= 3 and finished, log[-4000:]
    weakest = re.findall(r"\] step 1/9 lr=0\.01 .*\n.*stopped early at step 1", log)
    assert len(weakest) == 3, log[-4000:]
    assert len(stopped) + len(finished) == 9, log[-4000:]
    # The best learning rate (0.05 by the example's curve) is among those run to the end.
    assert re.search(r"\] step 9/9 lr=0\.05 ", log), log[-4000:]
    # The rungs live in the sweep's own directory: the owner's, nobody else may write them.
    rungs = f"{status(alice, job)['workdir']}/fluid/rungs.json"
    owner = node_sh(SLURM_LAB, "n2", f"stat -c '%U %a' {rungs}").stdout.split()
    assert owner[0] == "alice" and int(owner[1], 8) & 0o022 == 0, owner


def test_r1b_a_sampled_sweep_ranks_its_trials_fetches_the_best_and_reruns_the_same(alice, tmp_path):
    """Issue [24]: 8 trials drawn from ranges (scrambled Sobol, a seed) with ASHA;
    `status` lists them best first with the rung and accuracy each reached, `download
    --best` fetches the best trial's outputs, and a rerun runs the same 8 trials."""
    project = tmp_path / "sweep-adaptive"
    shutil.copytree(ROOT / "examples/sweep-adaptive", project)
    proc = alice("submit", "--json", "--sweep", str(project / "sampled.yaml"))
    assert proc.returncode == 0, proc.stderr
    job = json.loads(proc.stdout)["job_id"]
    info = wait_state(alice, job, FINAL, 300)
    assert info["state"] == "COMPLETED" and info["reason"] == "8 COMPLETED", info
    trials = info["trials"]
    drawn = sorted(json.dumps(t["parameters"], sort_keys=True) for t in trials)
    assert len(set(drawn)) == 8, drawn
    for trial in trials:
        assert 0.005 <= float(trial["parameters"]["LR"]) <= 0.5, trial
        assert trial["parameters"]["SEED"] in ("1", "2", "3"), trial
        assert trial["metric"] == "accuracy" and trial["rungs"] == 3, trial
    # Trials by index; the ranking best first: the highest rung, then the best accuracy.
    assert [t["trial"] for t in trials] == list(range(8)), trials
    by_id = {t["job_id"]: t for t in trials}
    ranked = [by_id[job_id] for job_id in info["ranking"]]
    ranks = [(-t["rung"], -t["value"]) for t in ranked]
    assert ranks == sorted(ranks) and info["best"] == ranked[0]["job_id"], ranked
    assert ranked[0]["rung"] == 3 and not ranked[0]["stopped"], ranked[0]
    shown = alice("status", job).stdout
    assert f"best trial: {info['best']} (trials best first)" in shown, shown
    assert re.search(rf"trial {info['best']} COMPLETED exit 0  accuracy [0-9.]+ at rung 3/3", shown)
    best_dir = tmp_path / "best"
    fetched = alice("download", job, str(best_dir), "--best")
    assert fetched.returncode == 0, fetched.stderr
    assert f"of trial {info['best']}, the best (accuracy" in fetched.stdout, fetched.stdout
    last = json.loads((best_dir / "outputs/progress.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 9 and abs(last["accuracy"] - ranked[0]["value"]) < 1e-9, last
    assert not (best_dir / "trials").exists()
    # The rerun runs the trials the instruction holds: none drawn anew.
    again = alice("rerun", "--json", job)
    assert again.returncode == 0, again.stderr
    rerun_id = json.loads(again.stdout)["job_id"]
    rerun_trials = status(alice, rerun_id)["trials"]
    alice("cancel", rerun_id)
    assert sorted(json.dumps(t["parameters"], sort_keys=True) for t in rerun_trials) == drawn


def counter_task(
    root: Path, name: str, nodes: int, cpus: int, preemptible: bool, until: int = 100000
) -> Path:
    root.mkdir(parents=True)
    (root / "count.py").write_text(CHECKPOINTING_COUNTER)
    task = {
        "name": name,
        "run": ["python3 count.py"],
        "outputs": ["outputs/"],
        "resources": {
            "nodes": nodes,
            "cpus": cpus,
            "mem": "100M",
            "time": "10",
            "preemptible": preemptible,
        },
        "environment": {"env": {"UNTIL": str(until), "STOP_AT_CHECKPOINT": "1"}},
    }
    (root / "tcloud.yaml").write_text(json.dumps(task))
    return root


def events(tcloud, job: str) -> list[tuple[str, str]]:
    return [(e["state"], e.get("reason", "")) for e in status(tcloud, job)["history"]]


def test_r2_tiresias_requeues_a_preemptible_job_of_a_lower_queue_for_one_that_waits(
    alice, bob, tmp_path
):
    """Threshold 1 GPU-s (node-s here): alice's running job is in queue 1 after a second;
    bob's new job (queue 0) waits for her nodes; a tick checkpoints and requeues her job,
    bob's runs, and hers goes on from its count once the nodes are free again."""
    settings = {
        "plugins": ["tiresias"],
        "state_dir": "/root/tiresias-test",
        "plugin_settings": {
            "tiresias": {"thresholds": [1], "promote_knob": 0, "min_run_seconds": 3}
        },
    }
    node_sh(
        SLURM_LAB,
        "n1",
        f"rm -rf /root/tiresias-test && echo '{json.dumps(settings)}' > /root/tiresias.yaml",
    )
    cpus = node_sh(SLURM_LAB, "n1", "scontrol show node n2 --oneliner").stdout.split("CPUTot=")[1]
    whole = int(cpus.split()[0])  # one job holds both nodes whole
    hog = submit(alice, counter_task(tmp_path / "hog", "hog", 2, whole, preemptible=True))
    short = ""
    try:
        wait_state(alice, hog, ("RUNNING",), 120)
        time.sleep(5)
        short = submit(bob, counter_task(tmp_path / "short", "short", 1, whole, False, until=3))
        tick = "tacc-agent --config /root/tiresias.yaml queue-tick"
        changes: list[str] = []
        deadline = time.monotonic() + 120
        while not any("requeued" in c for c in changes):
            assert time.monotonic() < deadline, changes
            changes += json.loads(node_sh(SLURM_LAB, "n1", tick).stdout)["changes"]
            time.sleep(2)
        assert any(f"job {hog} of alice requeued: preempted by tiresias" in c for c in changes), (
            changes
        )
        # bob's job runs and ends; alice's comes back from her checkpoint.
        assert wait_state(bob, short, FINAL, 180)["state"] == "COMPLETED"
        said = events(alice, hog)
        assert "HALTED" in [state for state, _ in said], said
        workdir = status(alice, hog)["workdir"]
        reasons = node_sh(SLURM_LAB, "n1", f"cat {workdir}/status/events/*").stdout
        assert "halted: preempted by tiresias: queue 1, for job" in reasons, reasons
        log = resumed_log(alice, hog)
        saved = int(re.findall(r"checkpoint (\d+)", log)[0])
        assert int(re.findall(r"start at ([1-9]\d*) on", log)[0]) == saved >= 3, log[-3000:]
    finally:  # a failure leaves no job holding the nodes for the next test
        alice("cancel", hog)
        if short:
            bob("cancel", short)


def test_r3_oort_selects_the_participants_of_a_federated_task_and_off_is_random(alice, tmp_path):
    """The same federated task on (the oort plug-in hands the program tacc_oort) and off
    (`plugins: [-oort]`, without the plug-in's `federated:` field: the program falls back
    to seeded random selection with the same settings)."""
    jobs = {}
    for mode, words in (("on", []), ("off", ["-oort"])):
        project = tmp_path / mode
        shutil.copytree(ROOT / "examples/federated", project)
        task = yaml.safe_load((project / "tcloud.yaml").read_text())
        task["federated"]["max_rounds"] = 60
        task["plugins"] = words
        if words:  # `federated:` is the plug-in's field: off, the program's own settings
            del task["federated"]
            task["run"] = ["python3 train.py --max-rounds 60"]
        (project / "tcloud.yaml").write_text(yaml.safe_dump(task))
        jobs[mode] = submit(alice, project)
    for mode, job in jobs.items():
        info = wait_state(alice, job, FINAL, 600)
        log = alice("logs", job).stdout
        assert info["state"] == "COMPLETED", (mode, info, log[-3000:])
        result = json.loads(
            node_sh(SLURM_LAB, "n2", f"cat {info['workdir']}/outputs/fl.json").stdout
        )
        if mode == "on":
            assert result["selector"] == "oort" and "(oort selection)" in log, log[-3000:]
            assert info["plugins"].get("oort") or "oort: target" in log, (info, log[-2000:])
        else:
            assert result["selector"] != "oort", result
            assert "tacc_oort not found (the oort plug-in is off)" in log, log[-3000:]


def node_count(job: str) -> str:
    return node_sh(SLURM_LAB, "n1", f"squeue -h -j {job} -o '%T %D'").stdout.strip()


def tick_until(config: str, word: str, seconds: int = 120) -> list[str]:
    changes: list[str] = []
    deadline = time.monotonic() + seconds
    while not any(word in c for c in changes):
        assert time.monotonic() < deadline, changes
        time.sleep(2)
        out = node_sh(SLURM_LAB, "n1", f"tacc-agent --config {config} queue-tick").stdout
        changes += json.loads(out)["changes"]
    return changes


def test_r5_elastic_grows_a_running_job_onto_an_idle_node_and_shrinks_it_for_a_waiting_one(
    alice, bob, tmp_path
):
    """alice's `nodes: 1-2, resize: true` counter starts on the one node bob leaves free;
    bob's job ends, a node idles and a tick grows hers to 2 (checkpoint, requeue at 2
    nodes, on from her count); bob submits again, his job waits, and a tick shrinks hers
    back to 1 so his starts. Resizing is ops' choice (plugin_settings.elastic.resize)."""
    settings = {
        "state_dir": "/root/elastic-test",
        "plugin_settings": {
            "elastic": {
                "resize": True,
                "grow_after_seconds": 2,
                "shrink_after_seconds": 2,
                "min_run_seconds": 3,
                "cooldown_seconds": 5,
            }
        },
    }
    config = "/root/elastic.yaml"
    node_sh(
        SLURM_LAB, "n1", f"rm -rf /root/elastic-test && echo '{json.dumps(settings)}' > {config}"
    )
    cpus = node_sh(SLURM_LAB, "n1", "scontrol show node n2 --oneliner").stdout.split("CPUTot=")[1]
    whole = int(cpus.split()[0])
    blocker = submit(bob, counter_task(tmp_path / "blocker", "blocker", 1, whole, False))
    elastic = tmp_path / "elastic"
    counter_task(elastic, "grower", 1, whole, False)
    task = json.loads((elastic / "tcloud.yaml").read_text())
    task["resources"].update(nodes="1-2", resize=True)
    task["environment"]["env"]["STOP_AT_CHECKPOINT"] = "1"
    (elastic / "tcloud.yaml").write_text(json.dumps(task))
    jobs = [(bob, blocker)]
    try:
        wait_state(bob, blocker, ("RUNNING",), 120)
        grower = submit(alice, elastic)
        jobs.append((alice, grower))
        wait_state(alice, grower, ("RUNNING",), 120)
        assert node_count(grower) == "RUNNING 1"
        time.sleep(4)  # past min_run_seconds, counting
        bob("cancel", blocker)
        changes = tick_until(config, "grow")
        assert any(f"elastic: job {grower} grow 1 -> 2 nodes" in c for c in changes), changes
        deadline = time.monotonic() + 120
        while node_count(grower) != "RUNNING 2":
            assert time.monotonic() < deadline, node_count(grower)
            time.sleep(1)
        workdir = status(alice, grower)["workdir"]
        reasons = node_sh(SLURM_LAB, "n1", f"cat {workdir}/status/events/*").stdout
        assert "halted: resized by elastic: grow 1 -> 2 nodes (1 idle for" in reasons, reasons
        starts_before = len(re.findall(r"start at \d+ on", alice("logs", grower).stdout))
        late = submit(bob, counter_task(tmp_path / "late", "late", 1, whole, False, until=3))
        jobs.append((bob, late))
        time.sleep(4)  # past the cooldown and min_run_seconds of the grown job
        changes = tick_until(config, "shrink")
        assert any(
            f"elastic: job {grower} shrink 2 -> 1 nodes (job {late} waits" in c for c in changes
        ), changes
        assert wait_state(bob, late, FINAL, 180)["state"] == "COMPLETED"
        deadline = time.monotonic() + 120
        while node_count(grower) != "RUNNING 1":
            assert time.monotonic() < deadline, node_count(grower)
            time.sleep(1)
        log = ""
        while len(re.findall(r"start at \d+ on", log)) <= starts_before:
            assert time.monotonic() < deadline, log[-3000:]
            time.sleep(2)
            log = alice("logs", grower).stdout
        # The log is by rank, not by time: the third run started from the count saved at
        # the shrink, the highest saved, above the one saved at the grow.
        starts = [int(n) for n in re.findall(r"start at (\d+) on", log)]
        saved = [int(n) for n in re.findall(r"checkpoint (\d+)", log)]
        assert max(starts) == max(saved) > min(saved) > 0, log[-3000:]
    finally:  # a failure leaves no job holding the nodes for the next test
        for owner, job in jobs:
            owner("cancel", job)
