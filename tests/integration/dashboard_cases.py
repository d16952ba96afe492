"""Issue [25] on the slurm lab, in a real browser (Debian's Chromium driven by Selenium):
`tcloud dashboard` as alice shows her running job, its live logs and its CPU plot from
Prometheus, and nothing of bob's job; bob's page shows nothing of alice's; olga (in
tacc_admins) sees the ops view: the nodes and the whole queue. Screenshots of each view
are kept as test artifacts (tests/integration/browser.py says where).

Collected as part of test_slurm_cluster.py (which imports these tests), on its lab.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tacc_lab.demo import researcher_env
from tests.conftest import BIN
from tests.integration.browser import chromium, screenshot, wait_for, wait_ready
from tests.integration.lab_helpers import node_sh, submit, wait_state
from tests.integration.labs import SLURM_LAB

ALICE_JOB_NAME = "alice-dashboard-train"
BOB_JOB_NAME = "bob-private-experiment"
AGENT_VENV = "/opt/tacc-agent/venv"  # roles/tacc_agent: tacc_agent_prefix + /venv
# alice's program: a line a second and a busy CPU, for 240 s (cancelled by the last case).
BUSY = """import time
start = time.time()
step = 0
while time.time() - start < 240:
    end = time.time() + 1
    while time.time() < end:
        pass
    step += 1
    print(f"alice step {step}", flush=True)
"""


def task(root: Path, name: str, run: str, program: str = "") -> Path:
    root.mkdir()
    limits = {"nodes": 1, "mem": "100M", "time": "10"}
    (root / "tcloud.yaml").write_text(json.dumps({"name": name, "resources": limits, "run": [run]}))
    if program:
        (root / "busy.py").write_text(program)
    return root


@pytest.fixture(scope="module")
def running_jobs(alice, bob, tmp_path_factory) -> Iterator[dict[str, str]]:
    """alice's busy job and bob's quiet one, both running, one node each."""
    root = tmp_path_factory.mktemp("dashboard")
    jobs = {
        "alice": submit(alice, task(root / "a", ALICE_JOB_NAME, "python3 busy.py", BUSY)),
        "bob": submit(bob, task(root / "b", BOB_JOB_NAME, "echo bob here; sleep 300")),
    }
    try:
        wait_state(alice, jobs["alice"], ("RUNNING",))
        wait_state(bob, jobs["bob"], ("RUNNING",))
        yield jobs
    finally:
        alice("cancel", jobs["alice"])
        bob("cancel", jobs["bob"])


@contextlib.contextmanager
def dashboard(user: str) -> Iterator[str]:
    """`tcloud dashboard --no-browser` as user, running; its one-time login address."""
    process = subprocess.Popen(
        [str(BIN / "tcloud"), "dashboard", "--no-browser"],
        env=researcher_env(SLURM_LAB, user),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        if not line.startswith("dashboard: http://127.0.0.1:"):
            process.kill()
            raise AssertionError(f"tcloud dashboard said {line!r}: {process.stderr.read()}")
        yield line.removeprefix("dashboard: ").strip()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            raise


def absent(page: str, *words: str) -> None:
    """None of words in the page; else where the first one is."""
    for word in words:
        at = page.find(word)
        assert at < 0, f"{word!r} on the page: ...{page[max(0, at - 300) : at + 100]}..."


def home_of(login: str) -> str:
    return login.split("login?", 1)[0]


def points(driver, chart: str) -> int:
    element = driver.find_element("css selector", f'div.chart[data-chart="{chart}"]')
    return int(element.get_attribute("data-points") or 0)


def wait_points(driver, chart: str, seconds: float = 120) -> int:
    """The chart's points once it has some; Prometheus scrapes every 5 s in the lab and
    the page draws again every 15 s."""
    deadline = time.monotonic() + seconds
    while (found := points(driver, chart)) == 0:
        assert time.monotonic() < deadline, f"no {chart} plot: {driver.page_source[-3000:]}"
        time.sleep(1)
    return found


def test_d1_alice_sees_her_job_its_logs_and_its_plot_and_nothing_of_bobs(running_jobs):
    mine, bobs = running_jobs["alice"], running_jobs["bob"]
    with dashboard("alice") as login, chromium() as driver:
        driver.get(login)
        wait_ready(driver)
        assert driver.find_element("css selector", "#user").text == "alice"
        wait_for(driver, f'#jobs tr[data-job="{mine}"]')
        assert driver.find_elements("css selector", "#nav-ops") == []
        wait_for(driver, "#usage tr[data-usage-month]")  # `tcloud usage`: her hours
        screenshot(driver, "researcher-jobs")
        page = driver.page_source
        assert ALICE_JOB_NAME in page
        absent(page, BOB_JOB_NAME, "bob", f'data-job="{bobs}"', f"#/job/{bobs}")

        driver.get(f"{home_of(login)}#/job/{mine}")
        wait_ready(driver)
        assert driver.find_element("css selector", "#job-state").text == "RUNNING"
        wait_for(driver, '#job-nodes tr[data-host="n2"], #job-nodes tr[data-host="n3"]')
        deadline = time.monotonic() + 60
        while "alice step" not in driver.find_element("css selector", "#logs").text:
            assert time.monotonic() < deadline, driver.find_element("css selector", "#logs").text
            time.sleep(1)
        assert wait_points(driver, "cpu") > 0
        screenshot(driver, "researcher-job")


@pytest.mark.security
def test_d2_no_page_of_bobs_shows_alices_job_name_or_owner(running_jobs):
    """bob's home page, alice's job by its id, and its usage: never her job's name, her
    name, or her figures."""
    alices = running_jobs["alice"]
    with dashboard("bob") as login, chromium() as driver:
        driver.get(login)
        wait_ready(driver)
        wait_for(driver, f'#jobs tr[data-job="{running_jobs["bob"]}"]')
        seen = [driver.page_source]
        home = home_of(login)
        driver.get(f"{home}#/job/{alices}")
        wait_ready(driver)
        seen.append(driver.page_source)
        screenshot(driver, "researcher-refused")  # bob's page on alice's job: refused
        for api in (f"api/jobs/{alices}", f"api/jobs/{alices}/usage", "api/ops/queue"):
            driver.get(f"{home}{api}")
            seen.append(driver.page_source)
    for page in seen:
        absent(page, ALICE_JOB_NAME, "alice", f'data-job="{alices}"')


@pytest.mark.security
def test_d3_the_broker_gives_bob_none_of_alices_series(running_jobs):
    """Straight at the broker with bob's own MUNGE credential, from the login node."""
    ask = (
        "import json, sys; from tacc_agent.config import load_config; "
        "from tacc_agent.dashboard import broker_client; "
        "url = load_config(None).dashboard_broker_url; "
        "print(json.dumps(broker_client.ask(url, json.loads(sys.argv[1]))))"
    )
    now = time.time()

    def as_bob(request: dict) -> str:
        python = f"{AGENT_VENV}/bin/python -I -c {shlex.quote(ask)}"
        script = f"runuser -u bob -- {python} {shlex.quote(json.dumps(request))}"
        answered = node_sh(SLURM_LAB, "login1", script)
        return answered.stdout + answered.stderr

    request = {"ask": "job", "job": running_jobs["alice"], "start": now - 300, "end": now}
    answer = json.loads(as_bob(request).splitlines()[0])
    assert answer["series"] == [], answer
    queue = as_bob({"ask": "queue"})
    assert "alice" not in queue and ALICE_JOB_NAME not in queue, queue
    assert "HTTP 403" in queue and "tacc_admins" in queue, queue  # refused, saying who may


def test_d4_olga_of_tacc_admins_sees_the_nodes_and_the_whole_queue(running_jobs, alice, bob):
    """The last of these cases: it cancels both jobs at its end, so the module's next
    cases (which need every CPU of n2 and n3) do not wait for them to run out."""
    try:
        see_the_ops_view(running_jobs)
    finally:
        alice("cancel", running_jobs["alice"])
        bob("cancel", running_jobs["bob"])


def see_the_ops_view(running_jobs: dict[str, str]) -> None:
    with dashboard("olga") as login, chromium() as driver:
        driver.get(login)
        wait_ready(driver)
        wait_for(driver, "#nav-ops")
        driver.get(f"{home_of(login)}#/ops")
        wait_ready(driver)
        wait_for(driver, '#ops-nodes tr[data-node="n2"]')
        wait_for(driver, '#ops-nodes tr[data-node="n3"]')
        wait_for(driver, f'#ops-queue tr[data-job="{running_jobs["alice"]}"]')
        wait_for(driver, f'#ops-queue tr[data-job="{running_jobs["bob"]}"]')
        screenshot(driver, "ops")
