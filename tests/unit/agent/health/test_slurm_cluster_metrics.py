"""The controller's cluster-wide Slurm figures (health/slurm_cluster.py): recorded Slurm
22.05 outputs from the lab (slurm_cluster_files/, `sinfo --json` on n1 with both nodes
drained by the agent), variations of them, and the daemon's /metrics."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tacc_agent import serve
from tacc_agent.config import AgentConfig
from tacc_agent.health import slurm_cluster
from tacc_agent.health.slurm_cluster import ClusterCollector, Sources
from tacc_agent.slurm.run import Finished
from tests.unit.fake_slurm import Answer, FakeSlurm, answer, hung, missing

FILES = Path(__file__).parent / "slurm_cluster_files"
SINFO_DRAINED = (FILES / "sinfo-22.05-drained.json").read_text()
SINFO_24_11_DRAINED = (FILES / "sinfo-24.11-drained.json").read_text()  # the trixie lab's
PING_UP = "Slurmctld(primary) at n1 is UP\n"  # recorded on the lab's n1
PING_BACKUP = "Slurmctld(primary) at n1 is DOWN\nSlurmctld(backup) at n4 is UP\n"
PING_DOWN = "Slurmctld(primary) at n1 is DOWN\n"
CONFIG_NONE = (
    "AccountingStorageTRES   = cpu,mem\nAccountingStorageType   = accounting_storage/none\n"
)
CONFIG_DBD = "AccountingStorageType   = accounting_storage/slurmdbd\nClusterName = tacc\n"


def gpu_cluster() -> str:
    """The recorded answer made a GPU cluster: n2 mixed with 2 of 4 GPUs in use and in
    two partitions, n3 draining (DRAIN on an allocated node) with a hostile reason, n4
    idle without GPUs."""
    data = json.loads(SINFO_DRAINED)
    n2, n3 = data["nodes"]
    n2.update(
        state="mixed",
        state_flags=[],
        reason="",
        partitions=["batch", "gpu"],
        gres="gpu:a100:4(S:0-1),shard:8",
        gres_used="gpu:a100:2(IDX:0-1),shard:0(0)",
    )
    n3.update(
        state="allocated",
        state_flags=["DRAIN"],
        partitions=["gpu"],
        reason='disk "bad"\nslot=3 | x',
        gres="gpu:4",
        gres_used="gpu:4(IDX:0-3)",
    )
    n4 = copy.deepcopy(n3)
    n4.update(
        name="n4",
        state="idle",
        state_flags=[],
        reason="",
        partitions=["batch"],
        gres="",
        gres_used="",
    )
    data["nodes"].append(n4)
    return json.dumps(data)


@pytest.fixture
def cluster(monkeypatch) -> Callable[..., FakeSlurm]:
    """The shared fake Slurm with the recorded lab's answers, each overridden by a
    keyword (scontrol_ping=... for `scontrol ping`)."""

    def installed(**answers: Answer) -> FakeSlurm:
        fake = FakeSlurm().install(monkeypatch)
        recorded = {
            "scontrol ping": answer(0, PING_UP),
            "scontrol show": answer(0, CONFIG_NONE),
            "sacctmgr": answer(0, "tacc\n"),
            "sinfo": answer(0, SINFO_DRAINED),
            "squeue": answer(0, ""),
        }
        recorded.update({key.replace("_", " "): said for key, said in answers.items()})
        for words, said in recorded.items():
            fake.when(words, said)
        return fake

    return installed


def scrape(fake: FakeSlurm, clock=None) -> dict[tuple[str, tuple], float]:
    collector = ClusterCollector(Sources(2.0), clock or (lambda: 0.0))
    return figures(collector)


def figures(collector: ClusterCollector) -> dict[tuple[str, tuple], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    found = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def test_recorded_lab_answer_drained_nodes_with_their_reasons(cluster):
    found = scrape(cluster())
    reason = "tacc: services: slurmd.service deactivating"
    assert found["tacc_agent_slurm_up", (("daemon", "slurmctld"),)] == 1
    assert found["tacc_agent_slurm_nodes", (("state", "drained"),)] == 2  # DOWN+DRAIN
    assert found["tacc_agent_slurm_node_drained", (("node", "n2"), ("reason", reason))] == 1
    assert found["tacc_agent_slurm_node_drained", (("node", "n3"), ("reason", reason))] == 1
    assert found["tacc_agent_slurm_gpus", (("partition", "batch"), ("state", "total"))] == 0
    assert found["tacc_agent_slurm_jobs", (("partition", "batch"), ("state", "pending"))] == 0
    # no accounting in the lab: slurmdbd has no state to report, and is not an error
    assert not any(labels == (("daemon", "slurmdbd"),) for _, labels in found)
    for query in slurm_cluster.QUERIES:
        assert found["tacc_agent_slurm_query_error", (("query", query),)] == 0
        assert found["tacc_agent_slurm_query_errors_total", (("query", query),)] == 0


def test_slurm_24_11s_answer_counts_the_same_figures(cluster):
    """24.11 groups nodes in `sinfo`: n3 drained by the agent, n2 idle."""
    found = scrape(cluster(sinfo=answer(0, SINFO_24_11_DRAINED)))
    reason = "tacc: gpu: 3 GPU(s), expected 4"
    assert found["tacc_agent_slurm_nodes", (("state", "drained"),)] == 1
    assert found["tacc_agent_slurm_nodes", (("state", "idle"),)] == 1
    assert found["tacc_agent_slurm_node_drained", (("node", "n3"), ("reason", reason))] == 1
    assert found["tacc_agent_slurm_query_error", (("query", "nodes"),)] == 0


def test_gpus_states_and_jobs_per_partition(cluster):
    squeue = "batch RUNNING\ngpu RUNNING\ngpu PENDING\nbatch,gpu PENDING\ngpu PENDING\n"
    found = scrape(cluster(sinfo=answer(0, gpu_cluster()), squeue=answer(0, squeue)))

    def gpus(partition, state):
        return found["tacc_agent_slurm_gpus", (("partition", partition), ("state", state))]

    def jobs(partition, state):
        return found["tacc_agent_slurm_jobs", (("partition", partition), ("state", state))]

    assert (gpus("gpu", "total"), gpus("gpu", "allocated")) == (8, 6)  # n2 + n3; no shards
    assert (gpus("batch", "total"), gpus("batch", "allocated")) == (4, 2)  # n2 (+ n4: 0)
    assert (jobs("gpu", "running"), jobs("gpu", "pending")) == (1, 3)
    assert (jobs("batch", "running"), jobs("batch", "pending")) == (1, 1)
    states = {
        dict(labels)["state"]: value
        for (name, labels), value in found.items()
        if name == "tacc_agent_slurm_nodes"
    }
    assert states == {"mixed": 1, "draining": 1, "idle": 1}


@pytest.mark.security
def test_a_reason_with_quotes_newlines_and_separators_stays_one_label(cluster):
    found = scrape(cluster(sinfo=answer(0, gpu_cluster())))
    drained = [
        dict(labels)
        for (name, labels), _ in found.items()
        if name == "tacc_agent_slurm_node_drained"
    ]
    assert drained == [{"node": "n3", "reason": 'disk "bad" slot=3 | x'}]


@pytest.mark.parametrize(
    ("flags", "base", "word"),
    [
        ([], "idle", "idle"),
        ([], "mixed", "mixed"),
        (["DRAIN"], "idle", "drained"),
        (["DRAIN"], "down", "drained"),
        (["DRAIN"], "mixed", "draining"),
        (["DRAIN", "COMPLETING"], "idle", "draining"),
        (["NOT_RESPONDING"], "down", "down"),
        (["FAIL"], "allocated", "failing"),
        (["COMPLETING"], "idle", "completing"),
        ([], "", "unknown"),
    ],
)
def test_state_words_are_sinfos(flags, base, word):
    assert slurm_cluster.state_word(base, flags) == word


def test_controller_up_through_a_backup_down_when_none_answers(cluster):
    assert (
        scrape(cluster(scontrol_ping=answer(0, PING_BACKUP)))[
            "tacc_agent_slurm_up", (("daemon", "slurmctld"),)
        ]
        == 1
    )
    assert (
        scrape(cluster(scontrol_ping=answer(1, PING_DOWN)))[
            "tacc_agent_slurm_up", (("daemon", "slurmctld"),)
        ]
        == 0
    )
    silent = hung("scontrol")
    assert (
        scrape(cluster(scontrol_ping=silent))["tacc_agent_slurm_up", (("daemon", "slurmctld"),)]
        == 0
    )


def test_slurmdbd_where_accounting_uses_it(cluster):
    up = scrape(cluster(scontrol_show=answer(0, CONFIG_DBD)))
    assert up["tacc_agent_slurm_up", (("daemon", "slurmdbd"),)] == 1
    refused = answer(1, "", "sacctmgr: error: Problem talking to the database: Connection refused")
    down = scrape(cluster(scontrol_show=answer(0, CONFIG_DBD), sacctmgr=refused))
    assert down["tacc_agent_slurm_up", (("daemon", "slurmdbd"),)] == 0
    assert down["tacc_agent_slurm_query_error", (("query", "slurmdbd"),)] == 0


@pytest.mark.fault
def test_slurmdbd_stays_known_while_slurmctld_is_down(cluster):
    now = [0.0]
    fake = cluster(scontrol_show=answer(0, CONFIG_DBD))
    collector = ClusterCollector(Sources(2.0), lambda: now[0])
    assert figures(collector)["tacc_agent_slurm_up", (("daemon", "slurmdbd"),)] == 1
    fake.when("scontrol show", answer(1, "", "Unable to contact slurm controller"))
    fake.when("sacctmgr", answer(1, "", "Problem talking to the database"))
    now[0] = 100.0
    assert figures(collector)["tacc_agent_slurm_up", (("daemon", "slurmdbd"),)] == 0


@pytest.mark.fault
def test_a_failed_read_gives_an_error_not_stale_or_zero_figures(cluster):
    now = [0.0]
    fake = cluster(squeue=answer(0, "batch RUNNING\n"))
    said: list[str] = []
    collector = ClusterCollector(Sources(2.0), lambda: now[0], log=said.append)
    assert (
        figures(collector)["tacc_agent_slurm_jobs", (("partition", "batch"), ("state", "running"))]
        == 1
    )
    fake.when("sinfo", answer(1, "", "slurm_load_node error: Unable to contact slurm controller"))
    fake.when("squeue", hung("squeue"))
    now[0] = 100.0
    found = figures(collector)
    assert not any(
        name
        in (
            "tacc_agent_slurm_jobs",
            "tacc_agent_slurm_nodes",
            "tacc_agent_slurm_gpus",
            "tacc_agent_slurm_node_drained",
        )
        for name, _ in found
    )
    for query in ("nodes", "jobs"):
        assert found["tacc_agent_slurm_query_error", (("query", query),)] == 1
        assert found["tacc_agent_slurm_query_errors_total", (("query", query),)] == 1
    assert found["tacc_agent_slurm_query_error", (("query", "slurmctld"),)] == 0
    assert "Unable to contact" in collector.problems()["nodes"]
    now[0] = 200.0  # the same failure again: the journal is not told twice
    figures(collector)
    fake.when("sinfo", answer(0, SINFO_DRAINED))
    now[0] = 300.0
    figures(collector)
    assert said == [
        "slurm figures: nodes: sinfo exit 1: slurm_load_node error: Unable to contact slurm "
        "controller",
        "slurm figures: jobs: squeue did not answer within 2 s",
        "slurm figures: nodes: answering again",
    ]


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "said",
    [
        answer(0, "not json"),
        answer(0, '{"nodes": 3}'),
        answer(0, "[]"),
        answer(0, '{"errors": [{"error": "x"}], "nodes": []}'),
        missing("sinfo"),
    ],
)
def test_nonsense_from_sinfo_is_an_error(cluster, said):
    found = scrape(cluster(sinfo=said))
    assert found["tacc_agent_slurm_query_error", (("query", "nodes"),)] == 1
    assert not any(name == "tacc_agent_slurm_nodes" for name, _ in found)


@pytest.mark.bad_input
def test_an_unexpected_squeue_line_is_an_error(cluster):
    found = scrape(cluster(squeue=answer(0, "batch RUNNING\ngarbage\n")))
    assert found["tacc_agent_slurm_query_error", (("query", "jobs"),)] == 1
    assert not any(name == "tacc_agent_slurm_jobs" for name, _ in found)


def test_read_at_most_once_per_cache_period_whatever_the_scrapers(cluster):
    now = [0.0]
    fake = cluster()
    collector = ClusterCollector(Sources(2.0), lambda: now[0])
    for _ in range(3):
        figures(collector)
    assert len([c for c in fake.calls if c[0] == "sinfo"]) == 1
    now[0] = slurm_cluster.CACHE_SECONDS
    figures(collector)
    assert len([c for c in fake.calls if c[0] == "sinfo"]) == 2
    argv = next(c for c in fake.calls if c[0] == "squeue")
    assert argv == ["squeue", "-h", "-a", "-r", "-t", "PENDING,RUNNING", "-o", "%P %T"]


@pytest.mark.fault
def test_a_hung_command_does_not_hold_the_scrape(cluster):
    release = threading.Event()
    fake = cluster()

    def slow(argv: list[str]) -> Finished:
        release.wait(5)
        return answer(0, SINFO_DRAINED)

    fake.when("sinfo", slow)
    collector = ClusterCollector(Sources(2.0), wait_seconds=0.2)
    found = figures(collector)
    release.set()
    assert found["tacc_agent_slurm_query_error", (("query", "nodes"),)] == 1
    assert found["tacc_agent_slurm_up", (("daemon", "slurmctld"),)] == 1
    collector.close()


def test_only_the_controller_daemon_exports_them(tmp_path):
    base = {"state_dir": str(tmp_path), "facts_file": str(tmp_path / "facts.json")}
    plain = serve.Daemon(AgentConfig(**base))
    controller = serve.Daemon(AgentConfig(**base, cluster_metrics=True))
    names = {type(c).__name__ for c in controller.registry._collector_to_names}
    assert "ClusterCollector" in names
    assert "ClusterCollector" not in {type(c).__name__ for c in plain.registry._collector_to_names}
