"""The browser tests' plumbing: Debian's Chromium, headless, driven by Selenium.

A dashboard test gets a driver from `chromium()`, waits for the page with `wait_ready`
(the page sets `<body data-ready="1">` once it has drawn its data) or `wait_for` (an
element), and keeps what it saw with `screenshot`:

    with chromium() as driver:
        driver.get(url)
        wait_ready(driver)
        assert wait_for(driver, "#jobs tbody tr").text
        screenshot(driver, "researcher-jobs")

The browser and its driver are the host's packages (`chromium`, `chromium-driver`: the
Makefile's BROWSER_PACKAGES), named by path, so Selenium Manager never runs and nothing
is downloaded. Screenshots go to $TACC_TEST_ARTIFACTS, else
.cache/test-artifacts/dashboard/ in the repository (git-ignored, kept after the run).
"""

from __future__ import annotations

import os
import re
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.chrome.webdriver import WebDriver as Chrome
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.wait import WebDriverWait

from tests.conftest import ROOT

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WINDOW = (1400, 1000)
ARTIFACTS_ENV = "TACC_TEST_ARTIFACTS"
DEFAULT_ARTIFACTS = ROOT / ".cache" / "test-artifacts" / "dashboard"
# Headless, as root (Chromium's sandbox refuses root), no GPU, shared memory in /tmp
# (/dev/shm is small in containers), and nothing that reaches the network by itself
# (component updates, first-run pages, background fetches). No proxy either: the pages
# under test are on this machine or the lab's bridge, never behind http_proxy.
ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    f"--window-size={WINDOW[0]},{WINDOW[1]}",
    "--no-proxy-server",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-sync",
)


@contextmanager
def chromium() -> Iterator[Chrome]:
    """A headless Chromium driven through Debian's chromedriver, with a private profile
    that is removed (and the browser ended) when the block ends."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if missing:
        raise RuntimeError(
            f"{', '.join(missing)} missing: `make deps` installs the host packages "
            "chromium and chromium-driver"
        )
    with tempfile.TemporaryDirectory(prefix="tacc-chromium-", ignore_cleanup_errors=True) as home:
        options = Options()
        options.binary_location = str(CHROMIUM)
        for argument in (*ARGUMENTS, f"--user-data-dir={home}"):
            options.add_argument(argument)
        # Selenium's own calls go to chromedriver on localhost, never through a proxy the
        # environment names (the switch is deprecated for a ClientConfig that Chrome()
        # does not take yet).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            options.ignore_local_proxy_environment_variables()
        # Both paths given: Selenium skips Selenium Manager (no driver or browser download).
        driver = Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            yield driver
        finally:
            driver.quit()


def artifacts_dir() -> Path:
    """Where screenshots go ($TACC_TEST_ARTIFACTS, else .cache/test-artifacts/dashboard),
    created."""
    folder = Path(os.environ.get(ARTIFACTS_ENV) or DEFAULT_ARTIFACTS)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver: Chrome, name: str) -> Path:
    """Save the viewport (1400x857: the 1400x1000 window less headless Chromium's own
    bars) as NAME.png in the artifacts folder (replacing one of that name)
    and return its path; each run of characters other than letters, digits, '.' and '_'
    becomes one '-' ("timeout-#jobs li" -> timeout-jobs-li.png)."""
    safe = re.sub(r"[^A-Za-z0-9._]+", "-", name.removesuffix(".png")).strip(".-") or "page"
    path = artifacts_dir() / f"{safe}.png"
    path.write_bytes(driver.get_screenshot_as_png())
    return path


def wait_for(driver: Chrome, css: str, timeout: float = 30) -> WebElement:
    """The first element matching the CSS selector once it is displayed. On timeout, a
    screenshot of the page is saved and named in the error."""
    try:
        return WebDriverWait(driver, timeout).until(
            expected_conditions.visibility_of_element_located((By.CSS_SELECTOR, css))
        )
    except TimeoutException as err:
        shot = screenshot(driver, f"timeout-{css}")
        raise TimeoutException(
            f"no visible {css!r} on {driver.current_url} after {timeout} s (screenshot: {shot})"
        ) from err


def wait_ready(driver: Chrome, timeout: float = 30) -> None:
    """Wait until the page says it has drawn its data: `document.body.dataset.ready` is
    "1". On timeout, a screenshot of the page is saved and named in the error."""
    script = "return document.body ? document.body.dataset.ready || null : null"
    try:
        WebDriverWait(driver, timeout).until(lambda d: d.execute_script(script) == "1")
    except TimeoutException as err:
        shot = screenshot(driver, "timeout-ready")
        raise TimeoutException(
            f"{driver.current_url} never set data-ready=1 in {timeout} s (screenshot: {shot})"
        ) from err
