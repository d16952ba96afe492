"""`tcloud dashboard`'s side on the laptop (tcloud/dashboard.py): the one-time login
address reaches the browser through a file only this account can read, never a command
line; each browser connection runs `dashboard connect`."""

from __future__ import annotations

import pytest

from tacc_contract import verbs
from tcloud import dashboard
from tcloud.jobs import portforward


@pytest.mark.security
def test_the_login_address_is_in_a_private_file_that_goes_away():
    url = "http://127.0.0.1:5000/login?code=abc.1.def&x=<y>"
    with dashboard.login_file(url) as page:
        assert page.stat().st_mode & 0o777 == 0o600
        assert page.parent.stat().st_mode & 0o777 == 0o700
        text = page.read_text()
        assert 'url=http://127.0.0.1:5000/login?code=abc.1.def&amp;x=&lt;y&gt;"' in text
        assert "<y>" not in text
    assert not page.exists() and not page.parent.exists()


def test_each_browser_connection_runs_dashboard_connect():
    way = dashboard.DashboardWay(None, None, "", 0, print)
    assert way.verb is verbs.DASHBOARD_CONNECT
    assert way.target(portforward.PortPair("dashboard", 0)) == {}
    assert verbs.DASHBOARD_CONNECT.request() == ["dashboard", "connect"]
    assert portforward.JobWay(None, None, "1", 0, print).verb is verbs.JOB_CONNECT
