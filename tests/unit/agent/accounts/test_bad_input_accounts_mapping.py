"""The agent config's directory_accounts and directory_removed_jobs: a wrong entry stops
the agent with the file, the entry and the field, never a traceback."""

from __future__ import annotations

import pytest
import yaml

from tacc_agent.accounts.mapping import GroupAccount
from tacc_agent.config import load_config
from tacc_agent.errors import AgentError

pytestmark = pytest.mark.bad_input


def load(tmp_path, **settings):
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(settings))
    return load_config(path)


def test_a_good_mapping_is_read_into_entries(tmp_path):
    config = load(
        tmp_path,
        directory_accounts=[{"group": "Vision", "account": "vision", "fairshare": 10}],
        directory_removed_jobs="cancel",
    )
    assert config.directory_accounts == (GroupAccount("Vision", "vision", 10),)
    assert config.directory_removed_jobs == "cancel"


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ({"group": "vision"}, "directory_accounts[0]: expected {group, account"),
        ({"group": "vision", "account": "Vision"}, "directory_accounts[0].account"),
        ({"group": "a b", "account": "ab"}, "directory_accounts[0].group"),
        ({"group": "v", "account": "v", "fairshare": 0}, "directory_accounts[0].fairshare"),
        ({"group": "v", "account": "v", "qos": "normal"}, "directory_accounts[0].qos"),
        (
            {"group": "v", "account": "v", "qos": ["normal"], "default_qos": "long"},
            "directory_accounts[0].default_qos: expected one of its qos",
        ),
        ({"group": "v", "account": "v", "users": ["x"]}, "directory_accounts[0]: expected"),
    ],
)
def test_a_wrong_entry_is_named(tmp_path, entry, says):
    with pytest.raises(AgentError) as raised:
        load(tmp_path, directory_accounts=[entry])
    assert str(tmp_path / "config.yaml") in str(raised.value)
    assert says in str(raised.value)


def test_one_account_given_two_settings_is_refused(tmp_path):
    entries = [
        {"group": "a", "account": "vision", "fairshare": 1},
        {"group": "b", "account": "vision", "fairshare": 2},
    ]
    with pytest.raises(AgentError, match="account 'vision' is given different"):
        load(tmp_path, directory_accounts=entries)


def test_an_unknown_removal_policy_is_refused(tmp_path):
    with pytest.raises(AgentError, match="directory_removed_jobs: expected finish or cancel"):
        load(tmp_path, directory_removed_jobs="keep")


@pytest.mark.parametrize("ids", [[10000], [0, 5], [20000, 10000], ["1000", 2000], True])
def test_a_wrong_directory_id_range_is_refused(tmp_path, ids):
    with pytest.raises(AgentError, match=r"directory_id_range: expected \[lowest, highest\]"):
        load(tmp_path, directory_id_range=ids)
