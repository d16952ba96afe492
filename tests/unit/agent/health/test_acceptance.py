"""`tacc-agent accept NODE` (health/acceptance.py) against a fake Slurm in this process:
nodes, their states and reasons, reservations, and srun steps whose answers each test
picks; plus the probe program's parsers (health/accept_probe.py)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from tacc_agent import cli
from tacc_agent.config import AgentConfig
from tacc_agent.errors import AgentError
from tacc_agent.health import accept_probe, acceptance
from tacc_agent.slurm.run import Finished
from tests.unit.fake_slurm import FakeSlurm, answer, hung

OK_CHECKS = [{"check": c, "status": "ok", "detail": ""} for c in ("gpu", "rdma")]
GPU_FAILS = [{"check": "gpu", "status": "fail", "detail": "7 GPUs, expected 8"}]
HEALTHY = {"node": "n2", "healthy": True, "slurm": "slurm: not asked", "checks": OK_CHECKS}
UNHEALTHY = {"node": "n2", "healthy": False, "slurm": "slurm: not asked", "checks": GPU_FAILS}
IB_WRITE_BW = "/usr/bin/ib_write_bw"
NO_TOOLS = {"all_reduce_perf": None, "ib_write_bw": None}


class GateSlurm(FakeSlurm):
    """The shared fake Slurm (nodes, drain/resume, reservations), and the gate's srun
    steps on it: a step answers from `steps` (kind -> an answer, the runner's exception,
    or a function of the argv) by its kind: check, facts, allreduce, nccl, rdma; one
    outside the reservation fails the test, one on a drained node is refused as Slurm
    would."""

    def __init__(self) -> None:
        super().__init__()
        self.facts: dict[str, dict] = {}
        self.steps: dict[str, object] = {
            "check": answer(0, json.dumps(HEALTHY, indent=1)),
            "allreduce": self.allreduce,
            "facts": self.facts_answer,
        }
        self.when("srun", self.srun)

    def add_node(self, name: str, *args, **kwargs) -> None:
        super().add_node(name, *args, **kwargs)
        self.facts[name] = {"gpus": 0, "rdma_devices": [], "tools": dict(NO_TOOLS)}

    def allreduce(self, argv: list[str]) -> Finished:
        return answer(
            0,
            json.dumps({"node": "n2", "mbps": 2500.0, "bytes": 32 << 20, "iterations": 10}) + "\n",
        )

    def facts_answer(self, argv: list[str]) -> Finished:
        nodes = option(argv, "--nodelist").split(",")
        return answer(0, "".join(json.dumps({"node": n, **self.facts[n]}) + "\n" for n in nodes))

    def srun(self, argv: list[str]) -> Finished:
        reservation = option(argv, "--reservation")
        assert reservation in self.reservations, "a step outside the reservation"
        for name in option(argv, "--nodelist").split(","):
            assert name in self.reservations[reservation].split(",")
            if "DRAIN" in self.nodes[name]["state"]:
                return answer(
                    1,
                    "",
                    "srun: error: Unable to allocate resources: Requested "
                    "node configuration is not available",
                )
        kind = (
            "check"
            if "check" in argv
            else next(w for w in ("facts", "allreduce", "torch", "nccl", "rdma") if w in argv)
        )
        said = self.steps[kind]
        if isinstance(said, BaseException):
            raise said
        return said(argv) if callable(said) else said

    def sruns(self, kind: str = "") -> list[list[str]]:
        return [c for c in self.calls if c[0] == "srun" and (not kind or kind in c)]


def option(argv: list[str], name: str) -> str:
    return next(word.split("=", 1)[1] for word in argv if word.startswith(f"{name}="))


@pytest.fixture
def slurm(monkeypatch) -> GateSlurm:
    """n2 joins drained (acceptance pending); n3 is in service, n4 drained by an admin."""
    fake = GateSlurm()
    fake.install(monkeypatch)
    fake.add_node("n2", "IDLE+DRAIN", "tacc: acceptance pending")
    fake.add_node("n3", "MIXED")
    fake.add_node("n4", "IDLE+DRAIN", "bad fan")
    return fake


@pytest.fixture
def config(tmp_path: Path) -> AgentConfig:
    return AgentConfig(state_dir=str(tmp_path / "state"), slurm_timeout_seconds=5)


def accept(config, slurm, node="n2", **kwargs) -> int:
    """The gate, on the fake cluster `slurm` (installed)."""
    return acceptance.accept(config, node, clock=lambda: 1795551407.0, **kwargs)


def record(config: AgentConfig, node: str = "n2") -> dict:
    return json.loads(Path(config.state_dir, "acceptance", f"{node}.json").read_text())


def test_a_node_that_passes_is_resumed_and_recorded(slurm, config, capsys):
    assert accept(config, slurm) == 0
    assert slurm.nodes["n2"]["state"] == "IDLE" and slurm.nodes["n2"]["reason"] == ""
    assert slurm.reservations == {}
    assert slurm.changes() == ["create n2,n3", "resume n2", "srun", "delete"]
    create = next(c for c in slurm.calls if c[1:3] == ["create", "reservation"])
    assert create[3:8] == [
        "ReservationName=tacc-accept-n2",
        "Users=root",
        "Flags=MAINT,IGNORE_JOBS",
        "StartTime=now",
        "Duration=32",
    ]
    found = record(config)
    assert found["passed"] is True and found["reason"] == "" and found["peer"] == "n3"
    assert found["time"] == "2026-11-24T20:16:47Z"
    assert found["thresholds"]["mpi_allreduce_node_min_mbps"] == 0
    tests = {t["name"]: (t["status"], t["detail"]) for t in found["tests"]}
    assert tests == {
        "agent checks": ("passed", "2 checks ok"),
        "mpi allreduce within node": ("passed", "32 MiB x 10"),
        "mpi allreduce with n3": ("passed", "32 MiB x 10"),
        "nccl all_reduce": ("skipped", "skipped: no GPUs"),
        "rdma write with n3": ("skipped", "skipped: no RDMA device on n2"),
        "torch all_reduce with n3": (
            "skipped",
            "skipped: no torch_python in the acceptance settings",
        ),
    }
    out = capsys.readouterr().out
    assert "n2: accepted, resumed (in service)" in out
    assert "mpi allreduce within node    passed      2500.0 MB/s" in out


def test_every_step_is_bounded_in_the_reservation_with_pmix_for_mpi(slurm, config):
    assert accept(config, slurm) == 0
    within = slurm.sruns("allreduce")[0]
    assert within[:13] == [
        "srun",
        "--reservation=tacc-accept-n2",
        "--partition=batch",
        "--nodelist=n2",
        "--nodes=1",
        "--ntasks=2",
        "--ntasks-per-node=2",
        "--time=6",
        "--immediate=60",
        "--mem=1G",
        "--export=PATH,HOME",
        "--job-name=tacc-accept",
        "--mpi=pmix",
    ]
    assert within[13:16] == [config.python, "-I", accept_probe.__file__]
    assert Path(accept_probe.__file__) == acceptance.PROBE
    pair = slurm.sruns("allreduce")[1]
    assert option(pair, "--nodelist") == "n2,n3" and option(pair, "--ntasks-per-node") == "1"
    check = slurm.sruns("check")[0]
    assert check[-4:] == ["tacc_agent", "check", "--json", "--no-slurm"]


def test_a_node_in_service_is_drained_before_anything_runs(slurm, config):
    slurm.nodes["n2"].update(state="IDLE", reason="")
    assert accept(config, slurm) == 0
    assert slurm.changes()[:3] == ["drain n2", "create n2,n3", "resume n2"]
    drain = next(c for c in slurm.calls if c[:2] == ["scontrol", "update"])
    assert drain[-1] == "Reason=tacc: acceptance pending"


def test_a_figure_below_its_threshold_drains_the_node_with_it(slurm, config, capsys):
    slurm.steps["allreduce"] = answer(0, '{"node": "n2", "mbps": 812.4, "bytes": 1}\n')
    config = AgentConfig(**{**config.__dict__, "acceptance": {"mpi_allreduce_node_min_mbps": 1000}})
    assert accept(config, slurm) == 1
    reason = "tacc: acceptance failed: mpi allreduce within node 812 MB/s < 1000 MB/s"
    assert slurm.nodes["n2"] == {**slurm.nodes["n2"], "state": "IDLE+DRAIN", "reason": reason}
    assert slurm.reservations == {}
    assert slurm.changes()[-2:] == ["drain n2", "delete"]  # drained before it is unreserved
    assert record(config)["passed"] is False and record(config)["reason"] == reason
    assert f"n2: NOT accepted, left drained: {reason}" in capsys.readouterr().out


def test_the_pair_threshold_from_the_command_line(slurm, config):
    slurm.steps["allreduce"] = lambda argv: answer(
        0, json.dumps({"mbps": 300.0 if "n2,n3" in option(argv, "--nodelist") else 5000.0}) + "\n"
    )
    assert accept(config, slurm, thresholds='{"mpi_allreduce_pair_min_mbps": 400}') == 1
    assert slurm.nodes["n2"]["reason"] == (
        "tacc: acceptance failed: mpi allreduce with n3 300 MB/s < 400 MB/s"
    )


def test_failing_agent_checks_name_the_check(slurm, config):
    slurm.steps["check"] = answer(1, json.dumps(UNHEALTHY, indent=1))
    assert accept(config, slurm) == 1
    assert slurm.nodes["n2"]["reason"] == (
        "tacc: acceptance failed: agent checks: gpu: 7 GPUs, expected 8"
    )
    assert slurm.reservations == {}


@pytest.mark.fault
@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        (
            answer(1, "", "srun: error: Unable to allocate resources: Invalid reservation"),
            "mpi allreduce within node: srun: error: Unable to allocate resources: Invalid",
        ),
        (
            hung("srun", 300),
            "mpi allreduce within node: srun did not answer within 300 s",
        ),
        (
            answer(1, '{"node": "n2", "error": "ImportError: No module named mpi4py"}\n', ""),
            "mpi allreduce within node: ImportError: No module named mpi4py",
        ),
        (answer(0, "garbage\n", ""), "mpi allreduce within node: garbage"),
    ],
)
def test_a_step_slurm_refused_or_that_hung_is_a_failure_with_its_cause(
    slurm, config, answer, cause
):
    slurm.steps["allreduce"] = answer
    assert accept(config, slurm) == 1
    assert slurm.nodes["n2"]["reason"].startswith(f"tacc: acceptance failed: {cause}")
    assert len(slurm.nodes["n2"]["reason"]) <= acceptance.REASON_CHARACTERS
    assert slurm.reservations == {}


@pytest.mark.fault
def test_a_failed_facts_step_fails_the_node_and_keeps_what_ran(slurm, config):
    slurm.steps["facts"] = answer(1, "", "srun: error: n3: task 0: Exited with exit code 2")
    assert accept(config, slurm) == 1
    assert slurm.nodes["n2"]["reason"] == (
        "tacc: acceptance failed: node facts: srun: error: n3: task 0: Exited with exit code 2"
    )
    assert [t["name"] for t in record(config)["tests"]] == ["agent checks"]
    assert slurm.reservations == {}


@pytest.mark.fault
def test_a_reservation_slurm_refuses_fails_the_node(slurm, config):
    slurm.refuse_create = "Reservation request failed: Requested nodes are busy"
    assert accept(config, slurm) == 1
    assert "Requested nodes are busy" in slurm.nodes["n2"]["reason"]
    assert slurm.sruns() == [] and slurm.reservations == {}


@pytest.mark.fault
def test_a_leftover_reservation_of_a_killed_run_is_removed_first(slurm, config):
    slurm.reservations["tacc-accept-n2"] = "n2,n3"
    assert accept(config, slurm) == 0
    assert slurm.changes()[:2] == ["delete", "create n2,n3"]
    assert slurm.reservations == {}


@pytest.mark.fault
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_an_interrupt_fails_the_node_and_still_removes_the_reservation(slurm, config, signum):
    def interrupted(argv):
        os.kill(os.getpid(), signum)
        raise AssertionError("the signal did not stop the run")

    slurm.steps["allreduce"] = interrupted
    before = signal.getsignal(signal.SIGTERM)
    assert accept(config, slurm) == 1
    name = signal.Signals(signum).name
    assert slurm.nodes["n2"]["reason"] == f"tacc: acceptance failed: interrupted ({name})"
    assert slurm.reservations == {}
    assert [t["name"] for t in record(config)["tests"]] == ["agent checks"]  # what ran
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.fault
def test_an_internal_error_is_never_a_pass(slurm, config):
    slurm.steps["allreduce"] = lambda argv: 1 / 0
    with pytest.raises(ZeroDivisionError):
        accept(config, slurm)
    assert slurm.nodes["n2"]["reason"] == "tacc: acceptance failed: stopped by an internal error"
    assert slurm.reservations == {}


@pytest.mark.fault
def test_a_failed_node_slurm_would_not_drain_keeps_its_reservation(slurm, config, capsys):
    slurm.nodes["n2"].update(state="IDLE", reason="")
    slurm.steps["check"] = answer(1, json.dumps(UNHEALTHY))
    slurm.refuse_drain = True
    assert accept(config, slurm) == 1  # the first drain already fails: nothing else is done
    assert slurm.reservations == {} and slurm.sruns() == []
    assert "WARNING: could not drain n2: scontrol failed: " in capsys.readouterr().out
    slurm.refuse_drain = False
    slurm.nodes["n2"].update(state="IDLE+DRAIN", reason="tacc: acceptance pending")
    real_update = slurm.update

    def update_then_refuse(fields):
        slurm.refuse_drain = True  # resume works, the drain at the end does not
        return real_update(fields)

    slurm.update = update_then_refuse
    assert accept(config, slurm) == 1
    assert slurm.reservations == {"tacc-accept-n2": "n2,n3"}  # keeps jobs off the node
    assert "reservation tacc-accept-n2 kept to keep jobs off it" in capsys.readouterr().out


def test_without_a_node_in_service_the_pair_tests_are_skipped(slurm, config):
    slurm.nodes["n3"]["state"] = "DOWN+NOT_RESPONDING"
    assert accept(config, slurm) == 0
    assert slurm.changes()[0] == "create n2"
    tests = {t["name"]: (t["status"], t["detail"]) for t in record(config)["tests"]}
    assert tests["mpi allreduce with a peer"] == ("skipped", "skipped: no other node in service")
    assert tests["rdma write"] == ("skipped", "skipped: no other node in service")
    assert record(config)["peer"] is None


def test_the_peer_is_the_least_busy_node_in_service_of_the_nodes_partition(slurm, config):
    slurm.nodes["n3"].update(state="MIXED", alloc=6)
    slurm.add_node("n4", "MIXED", alloc=2)
    slurm.add_node("n5", "IDLE+DRAIN")  # idle but out of service
    slurm.add_node("n6", "MIXED", alloc=2)
    assert accept(config, slurm) == 0
    assert record(config)["peer"] == "n4"  # fewest CPUs in use; the first of equals


def test_the_peer_is_the_first_node_in_service_of_the_nodes_partition(slurm, config):
    slurm.nodes["n2"]["partitions"] = "gpu"
    slurm.add_node("n5", "IDLE", partitions="gpu,batch")
    slurm.add_node("n6", "IDLE+RESERVED", partitions="gpu")
    assert accept(config, slurm) == 0
    assert record(config)["peer"] == "n5" and record(config)["partition"] == "gpu"
    assert all(option(c, "--partition") == "gpu" for c in slurm.sruns())


def test_gpus_and_rdma_are_measured_where_the_hardware_and_tools_exist(slurm, config):
    slurm.nodes["n2"]["gres"] = "gpu:h100:8(S:0-1)"
    perf = "/opt/nccl-tests/build/all_reduce_perf"
    for name in ("n2", "n3"):
        slurm.facts[name] = {
            "gpus": 8,
            "rdma_devices": ["mlx5_0"],
            "tools": {perf: perf, "ib_write_bw": IB_WRITE_BW},
        }
    slurm.steps["nccl"] = answer(0, '{"node": "n2", "gpus": 8, "busbw_gbytes": 80.2}\n')
    slurm.steps["rdma"] = answer(0, '{"node": "n3", "device": "mlx5_0", "gbits": 180.5}\n')
    limits = {"all_reduce_perf": perf, "nccl_allreduce_min_gbps": 100, "rdma_write_min_gbps": 150}
    assert accept(config, slurm, thresholds=json.dumps(limits)) == 1
    assert slurm.nodes["n2"]["reason"] == (
        "tacc: acceptance failed: nccl all_reduce 80 GB/s < 100 GB/s"
    )
    nccl = slurm.sruns("nccl")[0]
    assert "--gres=gpu:8" in nccl and "--mem=0" in nccl and option(nccl, "--nodelist") == "n2"
    assert nccl[nccl.index("--binary") + 1] == perf
    rdma = slurm.sruns("rdma")[0]
    assert rdma[-4:] == ["--server-node", "n2", "--server-address", "10.0.0.2"]
    tests = {t["name"]: t for t in record(config)["tests"]}
    assert tests["rdma write with n3"]["status"] == "passed"
    assert tests["rdma write with n3"]["figure"] == 180.5


TORCH = "/opt/tacc-torch/bin/python"


def test_a_torch_all_reduce_with_the_peer_below_its_floor_drains_the_node(slurm, config):
    """Issue [22] point 5: the path researchers' jobs take (torch.distributed), between
    the node and its peer, run by the configured torch python; rank 0 on the node."""
    slurm.steps["torch"] = answer(
        0,
        '{"node": "n2", "backend": "gloo", "busbw_gbytes": 0.412, "bytes": 33554432, '
        '"iterations": 10}\n',
    )
    limits = {"torch_python": TORCH, "torch_allreduce_pair_min_gbps": 10}
    assert accept(config, slurm, thresholds=json.dumps(limits)) == 1
    assert slurm.nodes["n2"]["reason"] == (
        "tacc: acceptance failed: torch all_reduce with n3 0.412 GB/s < 10 GB/s"
    )
    step = slurm.sruns("torch")[0]
    assert option(step, "--nodelist") == "n2,n3" and option(step, "--ntasks-per-node") == "1"
    assert not any(word.startswith("--gres") for word in step)  # no GPUs: gloo, no Gres
    # Run as nobody: what torch_python loads never has root's rights.
    at = step.index(TORCH)
    assert step[at - 6 : at] == list(acceptance.UNPRIVILEGED)
    assert "--reuid=nobody" in acceptance.UNPRIVILEGED
    program = step[at:]
    assert program[:4] == [TORCH, "-I", accept_probe.__file__, "torch"]
    assert program[program.index("--master-node") + 1] == "n2"
    assert program[program.index("--master-address") + 1] == "10.0.0.2"
    assert int(program[program.index("--port") + 1]) in acceptance.TORCH_PORTS
    test = {t["name"]: t for t in record(config)["tests"]}["torch all_reduce with n3"]
    assert (test["status"], test["detail"]) == ("failed", "gloo, 32 MiB x 10")


def test_the_torch_pair_of_gpu_nodes_takes_a_gpu_on_each_and_a_secret_token(
    slurm, config, monkeypatch
):
    """NCCL where both nodes have GPUs (the controller says so: both ranks agree), one GPU
    each; the step's token reaches the ranks through srun's environment, never its
    command line (other users on the nodes can read that)."""
    for name in ("n2", "n3"):
        slurm.nodes[name]["gres"] = "gpu:h100:8"
    slurm.nodes["n3"]["gres_used"] = "gpu:h100:7(IDX:0-6)"
    slurm.steps["torch"] = answer(0, '{"backend": "nccl", "busbw_gbytes": 40.5}\n')
    seen: list[dict] = []
    original = acceptance.slurm.run.command

    def recording(argv, timeout, env=None, **kwargs):
        if "torch" in argv:
            seen.append(dict(env or {}))
        return original(argv, timeout, env, **kwargs)

    monkeypatch.setattr(acceptance.slurm.run, "command", recording)
    assert accept(config, slurm, thresholds=json.dumps({"torch_python": TORCH})) == 0
    step = slurm.sruns("torch")[0]
    assert "--gres=gpu:1" in step and step[step.index("--backend") + 1] == "nccl"
    assert option(step, "--export") == "PATH,HOME,TACC_ACCEPT_TOKEN"
    token = seen[0]["TACC_ACCEPT_TOKEN"]
    assert len(token) == 32 and not any(token in word for word in step)


def test_a_mig_node_skips_all_reduce_perf_which_wants_whole_gpus(slurm, config):
    slurm.nodes["n2"]["gres"] = "gpu:h100:7(S:0-1),gpu:3g.40gb:2(S:0)"
    perf = "/opt/nccl-tests/build/all_reduce_perf"
    slurm.facts["n2"] = {"gpus": 8, "rdma_devices": [], "tools": {perf: perf}}
    assert accept(config, slurm, thresholds=json.dumps({"all_reduce_perf": perf})) == 0
    test = {t["name"]: t for t in record(config)["tests"]}["nccl all_reduce"]
    assert test["detail"] == "skipped: MIG devices (3g.40gb)" and slurm.sruns("nccl") == []


def test_a_peer_whose_gpus_are_all_in_jobs_skips_the_torch_test_not_fails_it(slurm, config):
    for name in ("n2", "n3"):
        slurm.nodes[name]["gres"] = "gpu:h100:8"
    slurm.nodes["n3"]["gres_used"] = "gpu:h100:8(IDX:0-7)"
    assert accept(config, slurm, thresholds=json.dumps({"torch_python": TORCH})) == 0
    test = {t["name"]: t for t in record(config)["tests"]}["torch all_reduce with n3"]
    assert (test["status"], test["detail"]) == ("skipped", "skipped: every GPU of n3 is in a job")
    assert slurm.sruns("torch") == []


@pytest.mark.security
def test_a_torch_python_others_may_change_is_never_run_as_root(slurm, config):
    """The facts step (the OS python3) checks torch_python on every node first: root runs
    it, so a venv another user may write would run their code as root."""
    slurm.facts["n3"]["python_unsafe"] = "/shared/envs/alice/bin belongs to uid 1001"
    limits = {"torch_python": "/shared/envs/alice/bin/python"}
    assert accept(config, slurm, thresholds=json.dumps(limits)) == 1
    assert slurm.sruns("torch") == []
    facts = slurm.sruns("facts")[0]
    assert facts[facts.index("--python") + 1] == "/shared/envs/alice/bin/python"
    assert record(config)["reason"] == (
        "tacc: acceptance failed: torch all_reduce with n3: torch_python not run as root on "
        "n3: /shared/envs/alice/bin belongs to uid 1001"
    )


@pytest.mark.security
@pytest.mark.skipif(os.getuid() != 0, reason="checks ownership as root sees it")
def test_the_probe_finds_a_python_another_user_could_change(tmp_path):
    assert accept_probe.unsafe_python("/usr/bin/python3") == ""  # the OS's: root's only
    assert accept_probe.unsafe_python("python3") == "python3: no such program"
    venv = tmp_path / "venv"
    site = venv / "lib/site-packages"
    site.mkdir(parents=True)
    (venv / "bin").mkdir()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin/python").symlink_to("/usr/bin/python3")
    (site / "evil.pth").write_text("import os\n")
    # Under /tmp (1777) anyone may put a file in the way.
    assert "/tmp may be written by others (mode 1777)" in accept_probe.unsafe_python(
        str(venv / "bin/python")
    )
    (site / "evil.pth").chmod(0o666)
    assert accept_probe.not_roots(site / "evil.pth").endswith("may be written by others (mode 666)")
    os.chown(site / "evil.pth", 1001, 1001)
    assert accept_probe.not_roots(site / "evil.pth").endswith("belongs to uid 1001")


def test_gpus_without_nccl_tests_or_a_peer_without_rdma_are_skipped_not_passed(slurm, config):
    slurm.nodes["n2"]["gres"] = "gpu:4"
    tools = {"all_reduce_perf": None, "ib_write_bw": IB_WRITE_BW}
    slurm.facts["n2"] = {"gpus": 4, "rdma_devices": ["mlx5_0"], "tools": tools}
    assert accept(config, slurm) == 0
    tests = {t["name"]: (t["status"], t["detail"]) for t in record(config)["tests"]}
    assert tests["nccl all_reduce"] == ("skipped", "skipped: all_reduce_perf not installed")
    assert tests["rdma write with n3"] == ("skipped", "skipped: no RDMA device on n3")
    assert slurm.sruns("nccl") == [] and slurm.sruns("rdma") == []


def test_json_output_is_the_record(slurm, config, capsys):
    assert accept(config, slurm, as_json=True) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == record(config)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("thresholds", "message"),
    [
        ('{"mpi_min": 1}', "--thresholds: unknown key(s) mpi_min; expected some of"),
        ('{"rdma_write_min_gbps": "fast"}', "rdma_write_min_gbps: expected a number of at least 0"),
        ('{"rdma_write_min_gbps": true}', "rdma_write_min_gbps: expected a number"),
        ('{"rdma_write_min_gbps": -1}', "rdma_write_min_gbps: expected a number of at least 0"),
        ('{"rdma_write_min_gbps": NaN}', "rdma_write_min_gbps: expected a number"),
        ('{"test_timeout_seconds": 0}', "test_timeout_seconds: expected a number above 0"),
        ('{"all_reduce_perf": 3}', "all_reduce_perf: expected a non-empty string"),
        ('{"torch_python": "python3"}', "torch_python: expected an absolute path to a python"),
        ('{"torch_python": 3}', "torch_python: expected an absolute path to a python"),
        ("[1]", "--thresholds: expected a JSON object"),
        ("{nope", "--thresholds: expected a JSON object"),
    ],
)
def test_bad_thresholds_are_refused_before_anything(slurm, config, thresholds, message):
    with pytest.raises(AgentError) as refused:
        accept(config, slurm, thresholds=thresholds)
    assert refused.value.exit_code == 2 and message in str(refused.value)
    assert slurm.calls == []


@pytest.mark.bad_input
def test_a_bad_acceptance_setting_in_the_agent_config_is_a_config_error(slurm, config):
    config = AgentConfig(**{**config.__dict__, "acceptance": {"nccl_min": 3}})
    with pytest.raises(AgentError) as refused:
        accept(config, slurm)
    assert refused.value.exit_code == 3
    assert "agent config: acceptance: unknown" in str(refused.value)
    assert slurm.calls == []


@pytest.mark.bad_input
@pytest.mark.security
@pytest.mark.parametrize("name", ["n2 State=RESUME", "n2,n3", "-n2", "n[2]", "", "n;x", "x" * 64])
def test_a_bad_node_name_is_refused_before_slurm_is_asked(slurm, config, name):
    with pytest.raises(AgentError) as refused:
        accept(config, slurm, node=name)
    assert refused.value.exit_code == 2 and "is not a node name" in str(refused.value)
    with pytest.raises(AgentError):
        accept(config, slurm, peer=name)
    assert slurm.calls == []


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("node", "peer", "message"),
    [
        ("n9", None, "n9: not a node of this Slurm cluster"),
        ("n2", "n9", "--peer n9: not a node of this Slurm cluster"),
        ("n2", "n2", "--peer: another node than the one under test"),
        ("n2", "n4", "--peer n4: not in service (IDLE+DRAIN)"),
        ("n3", None, "n3 runs jobs (MIXED): drain it and let them end first"),
    ],
)
def test_nodes_slurm_does_not_have_or_cannot_use_are_refused(slurm, config, node, peer, message):
    with pytest.raises(AgentError) as refused:
        accept(config, slurm, node=node, peer=peer)
    assert refused.value.exit_code == 2 and message in str(refused.value)
    assert [c[1:3] for c in slurm.calls] == [["show", "node"]]  # nothing changed


@pytest.mark.bad_input
def test_the_command_line_refuses_a_bad_name_with_one_json_line(capsys):
    umask = os.umask(0o022)
    os.umask(umask)
    try:  # the agent's main sets 077: put back
        assert cli.main(["accept", "n2;reboot"]) == 2
    finally:
        os.umask(umask)
    line = json.loads(capsys.readouterr().out)
    assert "is not a node name" in line["error"]


# --- the probe program's parsers ---------------------------------------------------------

NCCL_OUTPUT = """\
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
   268435456      67108864     float     sum      -1   2781.5   96.51  168.89      0   2779.4   96.58  169.02      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 168.956
#
"""  # noqa: E501 (nccl-tests' own lines)
IB_WRITE_BW_OUTPUT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : mlx5_0
 local address: LID 0x01 QPN 0x0107 PSN 0x4a2b3c RKey 0x1fff00 VAddr 0x007f2a
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1843200          0.00               96.59              0.184232
---------------------------------------------------------------------------------------
"""


def test_probe_reads_nccl_tests_and_perftest_figures():
    assert accept_probe.nccl_bandwidth(NCCL_OUTPUT) == 168.956
    assert accept_probe.nccl_bandwidth("# no figures\n") is None
    assert accept_probe.rdma_bandwidth(IB_WRITE_BW_OUTPUT) == 96.59
    assert accept_probe.rdma_bandwidth("Couldn't connect to 10.0.0.2:18515\n") is None


def test_probe_facts_of_a_node(tmp_path, monkeypatch, capsys):
    (tmp_path / "ib" / "mlx5_1").mkdir(parents=True)
    (tmp_path / "ib" / "mlx5_0").mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / name).touch()
    assert accept_probe.rdma_devices(tmp_path / "ib") == ["mlx5_0", "mlx5_1"]
    assert accept_probe.rdma_devices(tmp_path / "none") == []
    assert accept_probe.gpu_count(tmp_path) == 2
    monkeypatch.setenv("SLURMD_NODENAME", "n7")
    assert accept_probe.main(["facts", "--tool", "sh", "--tool", "no-such-tool"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["node"] == "n7" and found["tools"]["no-such-tool"] is None
    assert found["tools"]["sh"].endswith("/sh")


def test_probe_without_mpi4py_says_so_in_one_json_line(monkeypatch, capsys):
    monkeypatch.setattr(accept_probe, "MPI", None)  # its import failed
    assert accept_probe.main(["allreduce", "--mib", "1"]) == 1
    error = json.loads(capsys.readouterr().out)["error"]
    assert error == "ProbeError: mpi4py is not installed (the OS package python3-mpi4py)"
