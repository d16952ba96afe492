"""Issue [11] point 4: a plug-in needs the contract only.

A plug-in written outside the project (a module in tmp_path, on sys.path, selected by
its module path) uses every context the agent fills in: a schedule refusal with the
contract's Rejected, the nodes' features, the partition's load and the caller's earlier
jobs (Submission), the queue (Queue), and this node's facts, features and an agreement
across ranks (Launch), importing nothing but tacc_contract. And every built-in plug-in
imports nothing but tacc_contract, the standard library and its own package.
"""

from __future__ import annotations

import ast
import json
import os
import re
import sys
import threading
import tomllib
from pathlib import Path

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.errors import Rejected
from tacc_agent.tasks.execute.agreement import Agreement
from tacc_agent.tasks.jobs import records
from tacc_agent.tasks.schedule import queue_ticks
from tacc_agent.tasks.schedule import submit as schedule
from tacc_agent.tasks.schedule.instruction import parse
from tacc_contract.instruction import FORMAT
from tacc_contract.plugins import Launch
from tacc_plugins import transport
from tests.unit.agent_jobs import agent, agent_env, make_job
from tests.unit.fake_slurm import FakeSlurm, answer

ROOT = Path(__file__).resolve().parents[5]
PLUGINS = ROOT / "packages" / "plugins" / "tacc_plugins"
MODULE = "outside_lab.scratch"

SOURCE = '''
"""A lab's scratch policy, written outside the TACC project: it needs only the contract."""

from __future__ import annotations

from pathlib import Path

from tacc_contract.errors import Rejected
from tacc_contract.jsonfiles import read_json, write_json
from tacc_contract.plugins import Launch, Plugin, Queue, Submission


def hosts(ranks: list[dict]) -> dict:
    return {"hosts": sorted({r["host"] for r in ranks})}


class ScratchPolicy(Plugin):
    name = "scratch"
    layers = ("schedule", "execute")
    summary = "jobs run where there is local NVMe scratch; greedy users wait"

    def schedule(self, submission: Submission) -> None:
        members = [n for n in submission.nodes if submission.partition in n.partitions]
        if not any("nvme" in n.features for n in members):
            raise Rejected(
                f"no node in partition {submission.partition!r} has NVMe scratch",
                "resources.partition",
            )
        load = submission.partition_load(submission.partition)
        earlier = [job.submit["name"] for job in submission.history(10)]
        submission.note(self.name, f"{load.idle_nodes} idle, {load.waiting_jobs} waiting, "
                                   f"earlier: {','.join(earlier) or 'none'}")

    def tick(self, queue: Queue) -> None:
        path = Path(queue.state_dir) / "scratch.json"
        state = read_json(path) or {"ticks": 0}
        state["ticks"] += 1
        for job in queue.jobs:
            if job.state == "PENDING" and job.user == "greedy" and job.nice < 100:
                queue.set_nice(job.job_id, 100)
                queue.notes.append(f"scratch: job {job.job_id} nice {job.nice} -> 100")
        write_json(path, state)

    def execute(self, launch: Launch) -> None:
        agreed = launch.agree("scratch", hosts)
        launch.env["SCRATCH_HOSTS"] = ",".join((agreed or {}).get("hosts", []))
        launch.env["SCRATCH_FEATURES"] = ",".join(launch.node_features())
        launch.env["SCRATCH_PORTS"] = str(launch.facts["rdma"]["active_ports"])
        launch.note(self.name, launch.env["SCRATCH_HOSTS"])
'''


@pytest.fixture
def cluster(monkeypatch) -> FakeSlurm:
    """The Slurm commands the agent runs to fill the contexts, answered from fixtures."""
    fake = FakeSlurm().install(monkeypatch)
    fake.add_node(
        "g1", partitions="gpu", gres="gpu:h100:4", cpus=64, memory=512000, features="h100,nvme"
    )
    fake.add_node("c1", partitions="cpu", cpus=32, memory=128000)
    fake.add_partition("gpu", Default="NO", Nodes="g1", State="UP")
    fake.add_partition("cpu", Default="YES", Nodes="c1", State="UP")
    # a drained idle node and one not responding do not count
    fake.when("sinfo", answer(0, "3|idle\n1|drained\n1|idle*\n"))
    # the partition's load
    fake.when("squeue --states=PENDING", answer(0, "31|Resources\n32|JobHeldUser\n33|Priority\n"))
    fake.when(  # the queue tick
        "squeue",
        answer(
            0,
            "41|greedy|PENDING|0|1|1|N/A|N/A|N/A|N/A|0:00|\n"
            "42|modest|PENDING|0|1|1|N/A|N/A|N/A|N/A|0:00|\n",
        ),
    )
    return fake


@pytest.fixture
def outside(tmp_path, monkeypatch) -> Path:
    """The out-of-tree plug-in package, importable as outside_lab.scratch."""
    package = tmp_path / "lab" / "outside_lab"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "scratch.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(package.parent))
    for name in ("outside_lab", MODULE):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delenv("TACC_PLUGINS", raising=False)
    return package.parent


def project_imports(path: Path) -> list[tuple[int, str]]:
    """(line, top-level module) of every import in a file, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            top = "." if node.level else (node.module or "").split(".")[0]
            found.append((node.lineno, top))
    return found


def foreign_imports(path: Path, own: str) -> list[str]:
    allowed = {"tacc_contract", own, "."} | set(sys.stdlib_module_names)
    return [
        f"{path}:{line}: imports {module}"
        for line, module in project_imports(path)
        if module not in allowed
    ]


def optional_extras() -> set[str]:
    """The import names of tacc-plugins' optional dependencies (pyproject's
    [project.optional-dependencies]: scipy for a Sobol sweep's draw)."""
    project = tomllib.loads((PLUGINS.parent / "pyproject.toml").read_text())["project"]
    wanted = [w for words in project.get("optional-dependencies", {}).values() for w in words]
    return {re.split(r"[<>=!~\[ ;]", word, maxsplit=1)[0].replace("-", "_") for word in wanted}


def module_level_imports(path: Path) -> set[str]:
    """The top-level modules a file imports when it is imported itself."""
    found = set()
    for node in ast.parse(path.read_text(), filename=str(path)).body:
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add((node.module or "").split(".")[0])
    return found


def test_every_builtin_plugin_imports_only_the_contract_and_the_standard_library():
    """An optional extra (the agent installs the plug-ins without it) only inside the
    function that needs it, so importing a plug-in never needs it."""
    modules = sorted(PLUGINS.rglob("*.py"))
    assert len(modules) >= 8, modules
    extras = optional_extras()
    assert extras == {"scipy"}, extras
    problems = [
        p
        for path in modules
        for p in foreign_imports(path, "tacc_plugins")
        if p.rsplit(" ", 1)[-1] not in extras
    ]
    problems += [
        f"{path}: imports the optional {name} at module level"
        for path in modules
        for name in module_level_imports(path) & extras
    ]
    assert not problems, "\n".join(problems)


def test_the_import_check_sees_imports_inside_functions(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import json\ndef hook():\n    from tacc_agent import slurm\n")
    assert foreign_imports(bad, "tacc_plugins") == [f"{bad}:3: imports tacc_agent"]


def test_the_outside_plugin_needs_only_the_contract(outside):
    assert foreign_imports(outside / "outside_lab" / "scratch.py", "outside_lab") == []


def task_for(partition: str = ""):
    """A task as the cluster reads it (an instruction), without tcloud."""
    task = {"name": "t", "run": ["echo hi"], "resources": {"partition": partition or None}}
    document = {"format": FORMAT, "task": task}
    return parse(json.dumps(document), "instruction.json")


def past_job(user_dir: Path, name: str) -> None:
    status = user_dir / "jobs" / name / "status"
    status.mkdir(parents=True)
    (status / "submit.json").write_text(json.dumps({"name": name, "entrypoint": "e"}))
    records.add_event(status.parent, "QUEUED")


def test_schedule_sees_node_features_load_and_history_and_refuses_with_rejected(
    outside, tmp_path, cluster
):
    config = AgentConfig(plugins=(MODULE,))
    user_dir = tmp_path / "user"
    past_job(user_dir, "first")
    submission = schedule.plan(task_for("gpu"), Path("/w/job"), config, user_dir)
    # sinfo: 3 idle; squeue: 2 of 3 pending jobs wait for nodes (a held one does not)
    assert submission.notes["scratch"] == "3 idle, 2 waiting, earlier: first"
    assert ["sinfo", "--noheader", "--partition=gpu", "--states=idle", "--format=%D|%T"] in (
        cluster.calls
    )
    with pytest.raises(Rejected, match=r"no node in partition 'cpu' has NVMe scratch") as caught:
        schedule.plan(task_for("cpu"), Path("/w/job"), config, user_dir)
    assert caught.value.field == "resources.partition"


def test_a_queue_tick_reaches_the_outside_plugin(outside, tmp_path, cluster):
    config = AgentConfig(plugins=(MODULE,), state_dir=str(tmp_path))
    assert queue_ticks.tick(config) == ["scratch: job 41 nice 0 -> 100"]
    assert ["scontrol", "update", "JobId=41", "Nice=100"] in cluster.calls
    queue_ticks.tick(config)
    assert json.loads((tmp_path / "scratch.json").read_text()) == {"ticks": 2}


def test_execute_gets_this_nodes_facts_features_and_one_answer_for_all_ranks(outside, tmp_path):
    """The real wrapper (`tacc-agent exec`) runs the outside plug-in: node features come
    from scontrol (a fake one on PATH), the facts from sysfs, the agreement from rank 0."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text('#!/bin/sh\necho "NodeName=$4 AvailableFeatures=h100,nvme"\n')
    scontrol.chmod(0o755)
    task = {"name": "t", "run": ["echo $SCRATCH_HOSTS/$SCRATCH_FEATURES/$SCRATCH_PORTS"]}
    _, job_dir = make_job(tmp_path, task)
    env = agent_env(tmp_path, plugins=[MODULE])
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(outside), env.get("PYTHONPATH")) if p)
    proc = agent("exec", str(job_dir), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    log = next((job_dir / "logs").glob("rank-0-*.log")).read_text().splitlines()
    host = os.uname().nodename
    assert log[-1] == f"{host}/h100,nvme/0"
    assert records.read_json(job_dir / "status" / "agreed" / "scratch.json") == {"hosts": [host]}
    running = next(e for e in records.history(job_dir) if e["state"] == "RUNNING")
    assert running["plugins"]["scratch"] == host


def rank_facts(job_dir: Path, rank: int, host: str, ports: int) -> None:
    records.write_rank(job_dir, rank, host=host, rdma={"active_ports": ports})


def test_rank_zero_decides_from_every_ranks_facts_and_the_others_use_its_answer(tmp_path):
    (tmp_path / "status").mkdir()
    rank_facts(tmp_path, 0, "n1", 1)
    answers: dict[int, dict | None] = {}

    def rank(number: int) -> None:
        launch = Launch(
            None,
            number,
            ["n1", "n2"],
            [],
            "7",
            {},
            agree=Agreement(tmp_path, number, 2, timeout=20),
        )
        answers[number] = launch.agree(
            "transport", lambda ranks: vars(transport.choose("auto", ranks))
        )

    second = threading.Thread(target=rank, args=(1,))
    second.start()
    rank_facts(tmp_path, 1, "n2", 2)  # a rank's facts may come late
    rank(0)
    second.join()
    assert answers[0] == answers[1]
    assert answers[0]["reason"] == "active RDMA ports on every node (n1: 1, n2: 2)"
    # A requeued run starts with no answer of the previous one.
    records.clear_ranks(tmp_path)
    assert not list((tmp_path / "status" / "agreed").iterdir())


def test_a_rank_that_never_hears_the_answer_falls_back_to_tcp(tmp_path):
    launch = Launch(
        None, 1, ["n1", "n2"], [], "7", {}, agree=Agreement(tmp_path, 1, 2, timeout=0, grace=0.2)
    )
    launch.task = task_for()
    assert transport.agreed(launch) == transport.choose("tcp", [])


def test_without_the_agent_a_launch_agrees_with_itself():
    facts = {"host": "n1", "rdma": {"active_ports": 1}}
    launch = Launch(None, 0, ["n1"], [], "7", {}, facts=facts)
    assert launch.agree("x", lambda ranks: {"ranks": ranks}) == {"ranks": [launch.facts]}
    assert launch.node_features() == []


@pytest.mark.bad_input
def test_an_agreement_topic_must_be_a_plain_name(tmp_path):
    with pytest.raises(Exception, match=r"agreement topic '../x': expected a plug-in name"):
        Agreement(tmp_path, 0, 1, timeout=0)("../x", lambda ranks: {})


def test_a_submits_check_and_sbatch_are_planned_against_one_read_of_the_cluster(cluster):
    """`store` with a check and a submit reads the nodes and partitions once (two scontrol
    calls listing every node: at 1,000 nodes, bench/scale.py), and a plug-in that edits
    the lists it is given changes neither the shape kept for the sbatch nor Slurm's."""
    config = AgentConfig()
    shape = schedule.cluster_shape(config.slurm_timeout_seconds)
    reads = len(cluster.calls)
    first = schedule.plan(task_for(), Path("/nonexistent"), config, shape=shape)
    first.nodes.clear()
    first.partitions.clear()
    assert schedule.check(task_for("gpu"), config, shape) == "gpu"
    assert not any(call[:2] == ["scontrol", "show"] for call in cluster.calls[reads:])
    assert [node.name for node in shape[1]] == ["g1", "c1"]
