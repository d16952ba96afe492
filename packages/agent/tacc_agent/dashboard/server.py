"""`tacc-agent dashboard serve`: one user's dashboard server on the login node, an aiohttp
application on a Unix socket in the user's private directory (dashboard.place).

Who gets in:
- the socket: only its user can connect (0700 directory, 0600 socket), and every request's
  peer is checked again (SO_PEERCRED: the server's own uid), so what reaches it comes
  through that user's SSH login (`dashboard connect`, run by tcloud's forward);
- the browser: a one-time code (`dashboard open`, signed with the server's secret) at
  /login buys a session cookie (HttpOnly, SameSite=Strict, named for the local port); every
  /api/ call needs it, so another account on the researcher's laptop that finds the local
  port gets nothing;
- the Host header must name the laptop's loopback (127.0.0.1, localhost, [::1]), so a web
  page that rebinds its own name to 127.0.0.1 is refused; a POST (cancel, halt) needs the
  header X-Tacc-Dashboard and, when the browser sends one, an Origin of the same host;
- every answer forbids framing and scripts or styles from anywhere but the server itself
  (Content-Security-Policy default-src 'self'): the page loads nothing from the internet.

The server exits once nothing used it for the config's dashboard_idle_seconds with no log
stream open, or once the agent is installed again (an upgrade); the next `tcloud
dashboard` starts another (with a new secret: old cookies end with it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import secrets
import signal
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from tacc_agent.dashboard import place
from tacc_agent.dashboard.views import ViewError, Views
from tacc_agent.self_command import AGENT
from tacc_contract import verbs

STATIC = Path(__file__).parent / "static"
HOST = re.compile(r"(?:127\.0\.0\.1|localhost|\[::1\]):([0-9]{1,5})")
COOKIE = "tacc-dashboard-{port}"
JOB = r"{job:[0-9]+(?:_[0-9]+)?}"
POST_HEADER = "X-Tacc-Dashboard"
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'; "
        "base-uri 'none'; form-action 'self'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
ENDED_MESSAGE = "Your dashboard session has ended: run `tcloud dashboard` again."
LOG_TAIL = 2000  # lines of each node a page starts with
PING_SECONDS = 15.0  # an SSE comment, so a closed page is noticed while a job is quiet
LOG_LINE = re.compile(r"\[(?:trial ([0-9]+) )?([^\]\s:]+)(?::([0-9]+))?\] ?(.*)", re.S)
LONGEST_LINE = 1 << 20
IDLE_CHECK_SECONDS = 30.0
WORKERS = 4  # verbs at once (a page asks for its jobs, quota and GPUs together)


def peer_uid(sock: socket.socket | None) -> int | None:
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    data = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", data)[1]


def installed() -> tuple[int, int] | None:
    """This file as installed now (inode, mtime): another after the agent's reinstall."""
    try:
        found = os.stat(__file__)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def log_event(line: str) -> tuple[str, dict]:
    """One line of `job logs` as the page's event: its node, rank (and trial) and text;
    the verb's error line (JSON) as a problem."""
    line = line.rstrip("\n")
    if line.startswith("{"):
        with contextlib.suppress(ValueError):
            answer = json.loads(line)
            if isinstance(answer, dict) and "error" in answer:
                return "problem", {"error": str(answer["error"])}
    found = LOG_LINE.fullmatch(line)
    if found is None:
        return "line", {"node": None, "rank": None, "text": line}
    trial, node, rank, text = found.groups()
    event = {"node": node, "rank": int(rank) if rank else None, "text": text}
    return "line", {**event, "trial": int(trial)} if trial else event


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class Dashboard:
    """The application and its state: the sessions it gave out, when it was last used,
    how many log streams are open."""

    def __init__(
        self,
        views: Views,
        codes: place.Codes,
        idle_seconds: float,
        settings: Sequence[str] = (),
    ) -> None:
        self.views = views
        self.codes = codes
        self.idle_seconds = idle_seconds
        self.settings = list(settings)
        self.sessions: set[str] = set()
        self.last_use = time.monotonic()
        self.streams = 0
        self.pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="dashboard-verb")
        self.installed = installed()

    # --- the gate ---------------------------------------------------------------------

    @web.middleware
    async def gate(self, request: web.Request, handler: Callable) -> web.StreamResponse:
        uid = peer_uid(request.transport.get_extra_info("socket") if request.transport else None)
        if uid is not None and uid != os.getuid():
            return error(403, "this dashboard is another user's")
        host = HOST.fullmatch(request.headers.get("Host", ""))
        if host is None:
            return error(403, "the Host header must be the local address tcloud listens on")
        if request.cookies.get(COOKIE.format(port=host[1])) in self.sessions:
            self.last_use = time.monotonic()  # only a logged-in page keeps the server
        elif request.path.startswith("/api/"):
            return error(401, ENDED_MESSAGE)
        if request.method == "POST" and not self.same_origin(request):
            return error(403, "a change must come from the dashboard's own page")
        try:
            return await handler(request)
        except ViewError as exc:
            return error(exc.status, str(exc))

    @staticmethod
    async def add_headers(_request: web.Request, response: web.StreamResponse) -> None:
        """Every answer's, aiohttp's own (404, 405, 400) and the gate's refusals too."""
        for name, value in HEADERS.items():
            response.headers.setdefault(name, value)

    @staticmethod
    def same_origin(request: web.Request) -> bool:
        origin = request.headers.get("Origin")
        own = f"http://{request.headers.get('Host', '')}"
        return request.headers.get(POST_HEADER) == "1" and origin in (None, own)

    # --- pages ------------------------------------------------------------------------

    async def index(self, _request: web.Request) -> web.StreamResponse:
        return web.FileResponse(STATIC / "index.html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        if not self.codes.take(request.query.get("code", "")):
            return web.Response(
                status=401,
                text="This login link was used already or has expired: run "
                "`tcloud dashboard` again.\n",
            )
        session = secrets.token_urlsafe(32)
        self.sessions.add(session)
        self.last_use = time.monotonic()
        port = HOST.fullmatch(request.headers["Host"])[1]
        response = web.HTTPSeeOther("/")
        response.headers.add(
            "Set-Cookie",
            f"{COOKIE.format(port=port)}={session}; Path=/; HttpOnly; SameSite=Strict",
        )
        raise response

    # --- the API ----------------------------------------------------------------------

    async def answer(self, work: Callable[..., object], *args: object) -> web.Response:
        loop = asyncio.get_running_loop()
        return web.json_response(await loop.run_in_executor(self.pool, work, *args))

    def api(self, work: Callable[..., object]) -> Callable[[web.Request], Awaitable]:
        async def handler(request: web.Request) -> web.Response:
            return await self.answer(work, *request.match_info.values())

        return handler

    async def logs(self, request: web.Request) -> web.StreamResponse:
        job = request.match_info["job"]
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        process = await asyncio.create_subprocess_exec(
            *self.log_command(job),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            limit=LONGEST_LINE * 2,
        )
        self.streams += 1
        try:
            await self.relay_lines(process, response)
            if await process.wait() == 0:
                state = await self.final_state(job)
                await response.write(sse("end", {"state": state}))
        except (ConnectionError, RuntimeError):
            pass  # the page went away
        finally:
            self.streams -= 1
            self.last_use = time.monotonic()
            if process.returncode is None:
                process.kill()
                await process.wait()
        return response

    def log_command(self, job: str) -> list[str]:
        """`tacc-agent job logs --follow`, the verb `tcloud logs -f` runs, as the caller."""
        return [
            *AGENT,
            *self.settings,
            *verbs.JOB_LOGS.request(job=job, follow=True, tail=LOG_TAIL),
        ]

    async def relay_lines(self, process, response: web.StreamResponse) -> None:
        while True:
            try:
                line = await asyncio.wait_for(process.stdout.readline(), PING_SECONDS)
            except TimeoutError:
                await response.write(b": ping\n\n")
                continue
            if not line:
                return
            await response.write(sse(*log_event(line.decode(errors="replace"))))

    async def final_state(self, job: str) -> str:
        loop = asyncio.get_running_loop()
        try:
            status = await loop.run_in_executor(self.pool, self.views.job, job)
        except ViewError:
            return "UNKNOWN"
        return str(status.get("state", "UNKNOWN")) if isinstance(status, dict) else "UNKNOWN"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self.gate], client_max_size=64 * 1024)
        app.on_response_prepare.append(self.add_headers)
        views = self.views
        app.router.add_get("/", self.index)
        app.router.add_get("/login", self.login)
        app.router.add_static("/static", STATIC, follow_symlinks=False)
        app.router.add_get("/api/me", self.api(views.whoami))
        app.router.add_get("/api/jobs", self.api(views.jobs))
        app.router.add_get(f"/api/jobs/{JOB}", self.api(views.job))
        app.router.add_get(f"/api/jobs/{JOB}/logs", self.logs)
        app.router.add_get(f"/api/jobs/{JOB}/usage", self.api(views.usage))
        app.router.add_post(f"/api/jobs/{JOB}/cancel", self.api(views.cancel))
        app.router.add_post(f"/api/jobs/{JOB}/halt", self.api(views.halt))
        app.router.add_get("/api/quota", self.api(views.quota))
        app.router.add_get("/api/usage", self.api(views.hours))
        app.router.add_get("/api/gpus", self.api(views.gpus))
        app.router.add_get("/api/ops/nodes", self.api(views.ops_nodes))
        app.router.add_get("/api/ops/queue", self.api(views.ops_queue))
        app.router.add_get("/api/ops/utilisation", self.api(views.ops_utilisation))
        app.router.add_get("/api/ops/alerts", self.api(views.ops_alerts))
        return app

    def idle(self) -> bool:
        return self.streams == 0 and time.monotonic() - self.last_use > self.idle_seconds

    async def watch_idle(
        self, stop: asyncio.Event, bound: Callable[[], bool] = lambda: True
    ) -> None:
        """Stop once idle; once the agent was installed again (an upgrade: the next
        `dashboard open` or `connect` starts the new code); or once the socket is gone
        (its directory removed: pam_systemd's /run/user/UID at the user's last logout)."""
        while not stop.is_set():
            await asyncio.sleep(min(IDLE_CHECK_SECONDS, self.idle_seconds))
            if self.idle() or installed() != self.installed or not bound():
                stop.set()


def same_file(path: Path, inode: int) -> bool:
    try:
        return path.stat().st_ino == inode
    except OSError:
        return False


async def serve(dashboard: Dashboard, path: Path) -> None:
    """Serve on the socket at path (bound under another name, made 0600, then moved into
    place whole) until idle or SIGTERM; the socket is removed when it is still ours."""
    runner = web.AppRunner(dashboard.app(), access_log=None)
    await runner.setup()
    partial = path.with_name(f"{path.name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    site = web.UnixSite(runner, str(partial))
    await site.start()
    os.chmod(partial, 0o600)
    os.replace(partial, path)
    bound = path.stat().st_ino
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        loop.add_signal_handler(number, stop.set)
    watcher = asyncio.ensure_future(dashboard.watch_idle(stop, lambda: same_file(path, bound)))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        if same_file(path, bound):
            path.unlink()
        await runner.cleanup()
        dashboard.pool.shutdown(wait=False, cancel_futures=True)


def run(dashboard_of: Callable[[place.Codes], Dashboard]) -> int:
    """The server of the caller's private directory, with a new secret; 0 when it stopped
    (idle or asked)."""
    where = place.private_directory()
    codes = place.Codes(place.write_secret(where))
    asyncio.run(serve(dashboard_of(codes), where / place.SOCKET))
    return 0
