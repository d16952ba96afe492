"""Issue [16] on the hw lab (FAKE GPUs of two types): the allox plug-in places jobs that
accept h100 and l40s by AlloX's matching, not on whichever type is free first.

Collected as part of test_hardware_roles.py, last (it gives n3 a FAKE L40S: the tests
before it prove n3 has no GPU).
"""

from __future__ import annotations

import json
import time

from tests.integration.lab_helpers import lab_cli, node_ok, site

NAME = "hw"
STATE_DIR = "/root/allox-test"
TICK = "tacc-agent --config /root/allox.yaml queue-tick"


def sh(script: str, node: str = "n1") -> str:
    return node_ok(NAME, node, script)


def as_alice(argv: str) -> str:
    return sh(f"cd /tmp && runuser -u alice -- {argv}").strip()


def job_field(job: str, key: str) -> str:
    line = sh(f"scontrol show job {job} --oneliner")
    return line.split(f" {key}=", 1)[1].split()[0]


def wait_for(job: str, state: str, seconds: int = 90) -> None:
    deadline = time.monotonic() + seconds
    while job_field(job, "JobState") != state:
        assert time.monotonic() < deadline, sh(f"scontrol show job {job}")
        time.sleep(1)


def tick() -> list[str]:
    return json.loads(sh(TICK))["changes"]


def test_r4_allox_waits_for_the_faster_type_and_sends_the_other_job_to_the_free_one(runs):
    """n2: 8 h100 held by a job with 3 min left; n3 (a FAKE L40S, added by a re-run of
    site.yml, shared by MPS): its GPU held for 1 min. alice's "fast" runs 10 s on h100 and 400 s on
    l40s, her "same" 20 s and 21 s (runs the plug-in has seen before, seeded into its
    state). The matching sends fast to h100 (a 3 min wait) and same to l40s; once n3 is
    free and same has run there, fast still waits for an h100 rather than take the idle
    l40s, and the run of same is learned. Then placement at submit: a job delayed for
    the tick starts as soon as a tick places it; one its owner set to begin later does
    not."""
    inventory = runs["inventory"]
    # Shared by CUDA MPS (test_hardware_roles' last test: a quarter of it); its driver
    # from Debian's own packages (nvidia-driver), n2's from NVIDIA's repository's.
    (inventory.parent / "host_vars/n3.yml").write_text(
        '---\nslurm_node_gres: ["gpu:l40s:1"]\nslurm_gpu_sharing: mps\n'
        "nvidia_gpu_driver_source: debian\n"
    )
    fake = lab_cli(NAME, "fake-hw", "n3", "--gpus", "1", "--gpu-model", "l40s")
    assert fake.returncode == 0, fake.stderr
    site(inventory, "--limit", "n1,n3")  # n3's new GPU: its node line on the controller
    assert "AvailableFeatures=l40s" in sh("scontrol show node n3 --oneliner")
    settings = {
        "plugins": ["allox"],
        "state_dir": STATE_DIR,
        "plugin_settings": {"allox": {"speed": {"h100": 3.0}}},
    }
    runs = {"fast": {"h100": [10], "l40s": [400]}, "same": {"h100": [20], "l40s": [21]}}
    seen = {"runs": {f"alice\x1f{name}": {"types": types, "at": 0} for name, types in runs.items()}}
    sh(
        f"rm -rf {STATE_DIR} && mkdir -m 700 {STATE_DIR} && "
        f"echo '{json.dumps(settings)}' > /root/allox.yaml && "
        f"echo '{json.dumps(seen)}' > {STATE_DIR}/allox.json"
    )
    sbatch = "sbatch --parsable -o /dev/null"
    hogs = [
        as_alice(f"{sbatch} -J hog -t 3 --gres=gpu:h100:8 --wrap 'sleep 300'"),
        as_alice(f"{sbatch} -J hog2 -t 1 --gres=gpu:l40s:1 --wrap 'sleep 300'"),
    ]
    jobs: list[str] = []
    try:
        for hog in hogs:
            wait_for(hog, "RUNNING")
        either = "--gres=gpu:1 --constraint='h100|l40s' -t 10 --wrap 'sleep 8'"
        fast, same = (as_alice(f"{sbatch} -J {name} {either}") for name in ("fast", "same"))
        jobs = [fast, same]
        changes = tick()
        assert job_field(fast, "Features") == "h100", changes
        assert job_field(same, "Features") == "l40s", changes
        assert any(
            c.startswith(f"allox: job {fast} -> h100 (est. 10 s; l40s 400 s)") for c in changes
        ), changes
        # n3 free: same runs there (its constraint is l40s now), watched by a tick, and ends.
        sh(f"scancel {hogs[1]}")
        wait_for(same, "RUNNING")
        assert job_field(same, "NodeList") == "n3"
        tick()
        wait_for(same, "COMPLETED")
        changes = tick()  # same COMPLETED: Slurm's run time on l40s is learned
        state = json.loads(sh(f"cat {STATE_DIR}/allox.json"))
        learned = state["runs"]["alice\x1fsame"]["types"]["l40s"]
        assert len(learned) == 2 and 7 <= learned[1] <= 15, state
        # The l40s idles, yet fast waits for an h100 (< 3 min + 10 s beats 400 s).
        assert job_field(fast, "JobState") == "PENDING" and job_field(fast, "Features") == "h100"
        assert "n3 idle" in sh("sinfo -h -N -o '%N %t'"), changes
        sh(f"scancel {hogs[0]}")
        wait_for(fast, "COMPLETED")
        assert job_field(fast, "NodeList") == "n2"
        # Placement at submit: a job submitted to begin 58 s later (what allox's
        # submit_delay_seconds writes) is placed by the next tick and starts at once; one
        # whose owner set a begin time 2 min away is neither placed nor started.
        delayed = "--gres=gpu:1 --constraint='h100|l40s' -t 10 --wrap 'sleep 2'"
        placed = as_alice(f"{sbatch} -J same --begin=now+58 {delayed}")
        later = as_alice(f"{sbatch} -J same --begin=now+120 {delayed}")
        jobs += [placed, later]
        submitted = time.monotonic()
        changes = tick()
        assert f"allox: job {placed} placed: starts without its submit delay" in changes, changes
        wait_for(placed, "COMPLETED", 45)
        assert time.monotonic() - submitted < 50, "it waited out its delay"
        assert job_field(placed, "Features") in ("h100", "l40s")
        assert job_field(later, "JobState") == "PENDING", changes
        assert job_field(later, "Reason") == "BeginTime"
        assert job_field(later, "Features") == "h100|l40s"
    finally:
        sh(f"scancel {' '.join(hogs + jobs)}")
