"""`tcloud dashboard`: the researcher's web view of the cluster, in their own browser,
served by their own dashboard server on the login node (tacc_agent/dashboard) through
their own SSH login; nothing new listens on the cluster.

- `dashboard open` (a session verb) starts that server when none runs and answers a
  one-time code signed with its secret;
- a local port on 127.0.0.1 (any free one, or --port) forwards each browser connection
  over one exec channel running `dashboard connect` (the way `tcloud forward` carries a
  job's port: through OpenSSH's master when it is up, else tcloud's own connection);
- the browser is opened on a private file (0600, in a 0700 directory) that sends it to
  /login?code=..., so the code is on no command line another account of this machine
  could read; the server takes it once and gives the browser a session cookie.

Ctrl-C stops the forward; the server on the login node exits by itself once unused."""

from __future__ import annotations

import html
import shutil
import tempfile
import webbrowser
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from tacc_contract import verbs
from tcloud.core import warn
from tcloud.jobs import portforward
from tcloud.transport import agent, openssh

LOGIN_PAGE = """<!doctype html>
<meta charset="utf-8">
<meta http-equiv="refresh" content="0; url={url}">
<title>tcloud dashboard</title>
<p>Opening your dashboard: <a href="{url}">{url_text}</a></p>
"""


@dataclass
class DashboardWay(portforward.JobWay):
    """Each browser connection: an exec channel running `dashboard connect`."""

    verb: verbs.Verb = verbs.DASHBOARD_CONNECT

    def target(self, pair: portforward.PortPair) -> dict[str, object]:
        return {}


@contextmanager
def login_file(url: str) -> Iterator[Path]:
    """A page only this account can read that sends the browser to url; removed after."""
    folder = Path(tempfile.mkdtemp(prefix="tcloud-dashboard-"))  # 0700
    page = folder / "login.html"
    try:
        with page.open("x", encoding="utf-8") as handle:  # mkdtemp's: no one else's file
            page.chmod(0o600)
            handle.write(LOGIN_PAGE.format(url=html.escape(url), url_text=html.escape(url)))
        yield page
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def serve(cluster, port: int = 0, browser: bool = True, say: Callable[[str], None] = print) -> None:
    """Open the dashboard and forward it until Ctrl-C. `say` gets the local address (and,
    with browser False, the one-time login address instead of a browser opening it)."""
    opened = agent.call(cluster.client, verbs.DASHBOARD_OPEN, cluster.userdir)
    pair = portforward.PortPair("dashboard", port)
    with (
        portforward.stop_on_interrupt() as stop,
        openssh.master_for(cluster.settings) as master,
        ExitStack() as login_page,
    ):
        way = DashboardWay(cluster.client, cluster.userdir, "", 0, warn, master)
        with portforward.Forwarder([pair], way.open, warn=warn) as forwarder:
            local = forwarder.mapping[pair.remote]
            home = f"http://127.0.0.1:{local}/"
            login = f"{home}login?code={opened['code']}"
            if browser:
                webbrowser.open(login_page.enter_context(login_file(login)).as_uri())
                say(f"dashboard: {home} (opened in your browser; Ctrl-C stops it)")
            else:
                say(f"dashboard: {login}")
                say(f"(the link logs one browser in, once; then {home}; Ctrl-C stops it)")
            stop.wait()  # Ctrl-C sets it (stop_on_interrupt)
