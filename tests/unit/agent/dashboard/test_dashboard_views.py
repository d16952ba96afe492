"""What the dashboard's API answers (tacc_agent/dashboard/views.py), Slurm and the verbs
faked: free GPUs by type from the nodes, the window a job ran in, the verbs' refusals as
the page's errors, and the ops view for admins only."""

from __future__ import annotations

import pytest

from tacc_agent.config import AgentConfig
from tacc_agent.dashboard import views
from tacc_agent.dashboard.broker_asks import Caller
from tacc_agent.errors import AgentError
from tacc_agent.slurm.nodes import NodeRecord


def node(name: str, state: str, gres: str, used: str = "") -> NodeRecord:
    return NodeRecord(name, state, "", ("gpu",), (), gres, 16, 0, 1000, name, used)


def test_free_gpus_count_typed_and_untyped_gpus_and_none_on_drained_nodes():
    nodes = [
        node("n1", "IDLE", ""),
        node("n2", "MIXED", "gpu:h100:8(S:0-1),shard:32", "gpu:h100:3(IDX:0-2),shard:0"),
        node("n3", "IDLE+DRAIN", "gpu:h100:8(S:0-1)"),
        node("n4", "IDLE", "gpu:2"),
        node("n5", "DOWN*", "gpu:l40s:4"),
    ]
    assert views.free_gpus(nodes) == [
        {"type": "gpu", "free": 2, "total": 2},
        {"type": "h100", "free": 5, "total": 16},
        {"type": "l40s", "free": 0, "total": 4},
    ]


def test_the_run_window_is_running_to_end_or_now():
    history = [{"state": "QUEUED", "time": 10.0}, {"state": "RUNNING", "time": 20.0}]
    assert views.run_window(history, "RUNNING", now=50.0) == (20.0, 50.0)
    ended = [*history, {"state": "COMPLETED", "time": 30.0}]
    assert views.run_window(ended, "COMPLETED", now=50.0) == (20.0, 30.0)
    assert views.run_window(history[:1], "QUEUED", now=50.0) == (None, 50.0)


def runner_of(answers: dict):
    calls: list[list[str]] = []

    def run(words, stdin, reader):
        calls.append(words)
        return answers[tuple(words[:2])]

    return run, calls


def test_a_verbs_refusal_is_the_pages_error_with_its_status():
    run, calls = runner_of({("job", "status"): (2, {"error": "job 7 is not yours"})})
    answers = views.Views(AgentConfig(), run, views.Caller("bob", False, "login1"))
    with pytest.raises(views.ViewError, match="job 7 is not yours") as refused:
        answers.job("7")
    assert refused.value.status == 404
    assert calls == [["job", "status", "7"]]


def test_cancel_and_halt_are_the_clis_verbs():
    run, calls = runner_of(
        {
            ("job", "cancel"): (0, [{"job_id": "7", "state": "CANCELLED", "cancelled": True}]),
            ("job", "halt"): (0, {"job_id": "7", "state": "HALTED", "checkpoint_signal": True}),
        }
    )
    answers = views.Views(AgentConfig(), run, views.Caller("bob", False, "login1"))
    answers.cancel("7")
    answers.halt("7")
    assert calls == [["job", "cancel", "7"], ["job", "halt", "7"]]


@pytest.mark.security
@pytest.mark.parametrize("view", ["ops_nodes", "ops_queue", "ops_utilisation", "ops_alerts"])
def test_the_ops_view_is_for_the_admin_group_only(view):
    run, calls = runner_of({})
    answers = views.Views(AgentConfig(), run, views.Caller("bob", False, "login1"))
    with pytest.raises(views.ViewError, match="members of the group tacc_admins") as refused:
        getattr(answers, view)()
    assert refused.value.status == 403
    assert calls == []


def test_without_a_broker_the_plots_say_why():
    run, _ = runner_of(
        {
            ("job", "status"): (
                0,
                {"job_id": "7", "state": "RUNNING", "history": [{"state": "RUNNING", "time": 1.0}]},
            )
        }
    )
    answers = views.Views(AgentConfig(), run, views.Caller("bob", False, "login1"))
    assert answers.usage("7") == {"series": [], "problem": views.NO_BROKER}


def test_the_page_knows_an_admin_by_the_brokers_own_rule(monkeypatch):
    """One rule for both sides: the login node's page and the monitoring host's broker
    both ask broker_asks.who (root, or the admin group by passwd or supplementary gid)."""
    asked: list[tuple[int, str]] = []

    def who(uid: int, group: str):
        asked.append((uid, group))
        return Caller("olga", True) if uid == 2003 else None

    monkeypatch.setattr(views, "who", who)
    monkeypatch.setattr(views.os, "getuid", lambda: 2003)
    me = views.caller(AgentConfig())
    assert (me.user, me.admin) == ("olga", True) and asked == [(2003, "tacc_admins")]
    monkeypatch.setattr(views.os, "getuid", lambda: 4242)
    with pytest.raises(AgentError, match="uid 4242 has no account"):
        views.caller(AgentConfig())
