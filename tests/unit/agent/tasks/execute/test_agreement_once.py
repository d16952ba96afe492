"""An agreement topic is decided once per run, and its answer is a mapping: otherwise
rank 0 and the other ranks could act on different answers (tasks/execute/agreement.py)."""

from __future__ import annotations

import pytest

from tacc_agent.errors import AgentError
from tacc_agent.tasks.execute.agreement import Agreement
from tacc_agent.tasks.jobs import records


@pytest.mark.fault
def test_a_second_agree_on_one_topic_is_refused_on_every_rank(tmp_path):
    (tmp_path / "status").mkdir()
    records.write_json(tmp_path / "status" / "rank-0.json", {"rank": 0, "rdma": {}})
    first = Agreement(tmp_path, 0, 1, timeout=0)
    assert first("transport", lambda ranks: {"name": "tcp"}) == {"name": "tcp"}
    with pytest.raises(AgentError, match="agreed once per run"):
        first("transport", lambda ranks: {"name": "rdma"})
    other = Agreement(tmp_path, 1, 2, timeout=0, grace=0.2)
    assert other("transport", lambda ranks: {}) == {"name": "tcp"}
    with pytest.raises(AgentError, match="agreed once per run"):
        other("transport", lambda ranks: {})


@pytest.mark.fault
def test_a_decision_that_is_not_a_mapping_is_refused_and_not_read(tmp_path):
    (tmp_path / "status").mkdir()
    with pytest.raises(AgentError, match="must be a mapping, not list"):
        Agreement(tmp_path, 0, 1, timeout=0)("topic", lambda ranks: ["tcp"])
    (tmp_path / "status" / "agreed").mkdir()
    (tmp_path / "status" / "agreed" / "odd.json").write_text('["tcp"]')
    assert Agreement(tmp_path, 1, 2, timeout=0, grace=0.2)("odd", lambda ranks: {}) is None
