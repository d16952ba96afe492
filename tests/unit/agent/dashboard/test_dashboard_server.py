"""The dashboard's per-user server (tacc_agent/dashboard/server.py) on a real Unix socket,
with its answers faked at the Views boundary: who gets in (one-time code, session cookie,
Host, POST's header and Origin), the headers every answer carries, static files only from
its own folder, and the log stream's events."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from tacc_agent.dashboard import place, server
from tacc_agent.dashboard.views import ViewError

HOST = "127.0.0.1:8765"
COOKIE = "tacc-dashboard-8765"


class FakeViews:
    """Answers as alice; job 99 is not hers (the verb refuses it: 404)."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def whoami(self) -> dict:
        return {"user": "alice", "admin": False, "host": "login1", "version": "0"}

    def jobs(self) -> dict:
        return {"jobs": [{"job": "12", "name": "<b>x</b>", "state": "RUNNING"}]}

    def job(self, job: str) -> dict:
        if job == "99":
            raise ViewError("job 99 is not one of yours", 404)
        return {"job_id": job, "name": "x", "state": "COMPLETED", "workdir": "/w"}

    def cancel(self, job: str) -> dict:
        self.cancelled.append(job)
        return {"cancelled": [{"job_id": job, "state": "CANCELLED", "cancelled": True}]}

    def halt(self, job: str) -> dict:
        return {"halted": {"job_id": job, "state": "HALTED", "checkpoint_signal": True}}

    usage = quota = hours = gpus = ops_nodes = ops_queue = ops_utilisation = ops_alerts = whoami


class Harness:
    def __init__(self, tmp: Path, log_lines: list[str] | None = None) -> None:
        self.secret = b"k" * place.SECRET_BYTES
        self.views = FakeViews()
        self.dashboard = server.Dashboard(self.views, place.Codes(self.secret), 60.0)
        script = "import sys\nfor line in sys.argv[1:]: print(line, flush=True)\n"
        self.dashboard.log_command = lambda job: [sys.executable, "-c", script, *(log_lines or [])]
        self.path = tmp / "s.sock"

    async def __aenter__(self) -> Harness:
        self.runner = web.AppRunner(self.dashboard.app(), access_log=None)
        await self.runner.setup()
        await web.UnixSite(self.runner, str(self.path)).start()
        self.client = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(self.path)),
            headers={"Host": HOST},
        )
        return self

    async def __aexit__(self, *_exc) -> None:
        await self.client.close()
        await self.runner.cleanup()

    def code(self) -> str:
        return place.mint(self.secret)[0]

    async def get(self, path: str, **kwargs) -> aiohttp.ClientResponse:
        return await self.client.get(f"http://{HOST}{path}", allow_redirects=False, **kwargs)

    async def post(self, path: str, **kwargs) -> aiohttp.ClientResponse:
        return await self.client.post(f"http://{HOST}{path}", allow_redirects=False, **kwargs)

    async def login(self) -> dict[str, str]:
        answer = await self.get(f"/login?code={self.code()}")
        assert answer.status == 303, await answer.text()
        cookie = answer.headers["Set-Cookie"]
        assert cookie.startswith(f"{COOKIE}=") and "HttpOnly" in cookie, cookie
        assert "SameSite=Strict" in cookie and "Path=/" in cookie, cookie
        return {"Cookie": cookie.split(";")[0]}


def run(tmp_path: Path, scenario, log_lines: list[str] | None = None):
    async def main():
        async with Harness(tmp_path, log_lines) as harness:
            return await scenario(harness)

    return asyncio.run(main())


def test_a_code_logs_in_once_and_the_cookie_opens_the_api(tmp_path):
    async def scenario(h: Harness):
        cookie = await h.login()
        jobs = await h.get("/api/jobs", headers=cookie)
        assert jobs.status == 200
        assert (await jobs.json())["jobs"][0]["job"] == "12"
        assert jobs.headers["Cache-Control"] == "no-store"

    run(tmp_path, scenario)


@pytest.mark.security
def test_a_code_is_good_once_and_an_unsigned_or_old_one_never(tmp_path):
    async def scenario(h: Harness):
        code = h.code()
        assert (await h.get(f"/login?code={code}")).status == 303
        assert (await h.get(f"/login?code={code}")).status == 401  # used
        nonce, expires, _mac = code.split(".")
        forged = f"{nonce}x.{expires}.{'0' * 64}"
        assert (await h.get(f"/login?code={forged}")).status == 401
        old = place.mint(h.secret, now=0)[0]
        assert (await h.get(f"/login?code={old}")).status == 401
        assert (await h.get("/login")).status == 401

    run(tmp_path, scenario)


@pytest.mark.security
def test_the_api_without_the_session_cookie_says_the_session_ended(tmp_path):
    async def scenario(h: Harness):
        for path in ("/api/me", "/api/jobs", "/api/jobs/12", "/api/jobs/12/logs"):
            answer = await h.get(path, headers={"Cookie": f"{COOKIE}=guessed"})
            assert answer.status == 401, path
            assert "run `tcloud dashboard` again" in (await answer.json())["error"]
        cookie = await h.login()
        other_port = {"Cookie": cookie["Cookie"].replace(COOKIE, "tacc-dashboard-9999")}
        assert (await h.get("/api/jobs", headers=other_port)).status == 401

    run(tmp_path, scenario)


@pytest.mark.security
def test_a_host_other_than_the_local_loopback_is_refused(tmp_path):
    """A page of evil.example whose name now resolves to 127.0.0.1 (DNS rebinding) sends
    its own Host: refused before anything, the login too."""

    async def scenario(h: Harness):
        cookie = await h.login()
        for host in ("evil.example:8765", "127.0.0.1.evil.example:8765", "", "10.0.0.1:8765"):
            answer = await h.client.get(
                "http://127.0.0.1:8765/api/jobs", headers={**cookie, "Host": host}
            )
            assert answer.status == 403, host
        answer = await h.client.get(
            f"http://x/login?code={h.code()}", headers={"Host": "evil.example:8765"}
        )
        assert answer.status == 403
        ok = await h.client.get("http://x/api/jobs", headers={**cookie, "Host": "localhost:8765"})
        assert ok.status == 200  # the loopback by another of its names

    run(tmp_path, scenario)


@pytest.mark.security
def test_cancel_needs_the_pages_header_and_its_own_origin(tmp_path):
    """A form on another site cannot set the header; a script there is another origin."""

    async def scenario(h: Harness):
        cookie = await h.login()
        bare = await h.post("/api/jobs/12/cancel", headers=cookie)
        assert bare.status == 403
        foreign = {**cookie, "X-Tacc-Dashboard": "1", "Origin": "http://evil.example"}
        assert (await h.post("/api/jobs/12/cancel", headers=foreign)).status == 403
        assert h.views.cancelled == []
        own = {**cookie, "X-Tacc-Dashboard": "1", "Origin": f"http://{HOST}"}
        answer = await h.post("/api/jobs/12/cancel", headers=own)
        assert answer.status == 200
        assert (await answer.json())["cancelled"][0]["cancelled"] is True
        assert h.views.cancelled == ["12"]
        assert (await h.get("/api/jobs/12/cancel", headers=own)).status == 405

    run(tmp_path, scenario)


@pytest.mark.security
def test_every_answer_forbids_framing_and_outside_scripts(tmp_path):
    async def scenario(h: Harness):
        cookie = await h.login()
        for path, headers in (
            ("/", cookie),
            ("/api/me", cookie),
            ("/static/index.html", cookie),
            ("/api/jobs/99", cookie),  # the verb's refusal
            ("/api/jobs", {}),  # the gate's
            ("/nowhere", cookie),  # aiohttp's own 404
            ("/login?code=x", {}),
        ):
            answer = await h.get(path, headers=headers)
            policy = answer.headers["Content-Security-Policy"]
            assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy, path
            assert answer.headers["X-Frame-Options"] == "DENY", path
            assert answer.headers["X-Content-Type-Options"] == "nosniff", path

    run(tmp_path, scenario)


@pytest.mark.security
def test_static_files_come_from_the_static_folder_only(tmp_path):
    async def scenario(h: Harness):
        for path in (
            "/static/../place.py",
            "/static/%2e%2e/place.py",
            "/static/..%2fplace.py",
            "/static//etc/passwd",
        ):
            answer = await h.get(path)
            assert answer.status in (403, 404), (path, answer.status)
            assert "SECRET_BYTES" not in await answer.text()

    run(tmp_path, scenario)


def test_another_users_job_is_the_verbs_refusal_as_json(tmp_path):
    async def scenario(h: Harness):
        cookie = await h.login()
        answer = await h.get("/api/jobs/99", headers=cookie)
        assert answer.status == 404
        assert await answer.json() == {"error": "job 99 is not one of yours"}
        assert (await h.get("/api/jobs/12;ls", headers=cookie)).status == 404

    run(tmp_path, scenario)


def test_the_log_stream_sends_each_line_with_its_node_and_rank_then_the_end(tmp_path):
    lines = ["[job] tacc: starting", "[n2:0] epoch 1 <b>", "[n3:1] epoch 1", "no prefix"]

    async def scenario(h: Harness):
        cookie = await h.login()
        answer = await h.get("/api/jobs/12/logs", headers=cookie)
        assert answer.headers["Content-Type"] == "text/event-stream"
        return await answer.text()

    events = [
        (block.split("\n")[0].removeprefix("event: "), json.loads(block.split("data: ", 1)[1]))
        for block in run(tmp_path, scenario, lines).strip().split("\n\n")
    ]
    assert events == [
        ("line", {"node": "job", "rank": None, "text": "tacc: starting"}),
        ("line", {"node": "n2", "rank": 0, "text": "epoch 1 <b>"}),
        ("line", {"node": "n3", "rank": 1, "text": "epoch 1"}),
        ("line", {"node": None, "rank": None, "text": "no prefix"}),
        ("end", {"state": "COMPLETED"}),
    ]


def test_a_log_line_of_a_trial_and_the_verbs_error_line():
    assert server.log_event("[trial 3 n2:1] loss 2\n") == (
        "line",
        {"node": "n2", "rank": 1, "text": "loss 2", "trial": 3},
    )
    assert server.log_event('{"error": "not a job of yours", "kind": "rejected"}') == (
        "problem",
        {"error": "not a job of yours"},
    )


@pytest.mark.fault
def test_the_server_stops_once_idle_or_once_the_agent_is_installed_again(tmp_path, monkeypatch):
    """An upgrade replaces the agent's files: a server of the old code stops, and the next
    `dashboard open` starts the new one."""
    monkeypatch.setattr(server, "IDLE_CHECK_SECONDS", 0.05)
    harness = Harness(tmp_path)
    dashboard = harness.dashboard
    dashboard.idle_seconds = 3600

    async def stops() -> bool:
        stop = asyncio.Event()
        watcher = asyncio.ensure_future(dashboard.watch_idle(stop))
        try:
            await asyncio.wait_for(stop.wait(), 2)
        except TimeoutError:
            return False
        finally:
            watcher.cancel()
        return True

    assert not asyncio.run(stops())  # used, and the same files
    monkeypatch.setattr(server, "installed", lambda: (1, 2))
    assert asyncio.run(stops())
    monkeypatch.setattr(server, "installed", lambda: dashboard.installed)
    dashboard.idle_seconds, dashboard.last_use = 0.01, 0.0
    assert asyncio.run(stops())
    dashboard.streams = 1  # a page follows a log: not idle
    assert not asyncio.run(stops())


@pytest.mark.security
def test_only_a_logged_in_page_keeps_the_server_from_stopping(tmp_path):
    """Someone knocking without the cookie (another account of the laptop that found the
    port) does not keep the server, and its sessions, alive."""

    async def scenario(h: Harness):
        h.dashboard.last_use = 0.0
        await h.get("/api/jobs")
        await h.get("/")
        await h.get("/login?code=forged")
        assert h.dashboard.last_use == 0.0
        cookie = await h.login()
        h.dashboard.last_use = 0.0
        await h.get("/api/me", headers=cookie)
        assert h.dashboard.last_use > 0

    run(tmp_path, scenario)
