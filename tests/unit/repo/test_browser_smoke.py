"""The browser tests' plumbing (tests/integration/browser.py) works on this machine, no
lab: Debian's headless Chromium loads a page from a local HTTP server, the helpers wait
for it and read its DOM, a screenshot lands in the artifacts folder, the private profile
is gone afterwards, and Selenium Manager (which downloads drivers) never runs.

Chromium and chromedriver are host packages the Makefile installs (`make deps`): a
missing one is a failure, not a skip."""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.common.selenium_manager import SeleniumManager

from tests.conftest import ROOT
from tests.integration import browser

# Draws its list a moment after loading, then says so, as the dashboard's pages do.
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>smoke</title></head>
<body><h1>TACC dashboard smoke</h1><ul id="jobs"></ul>
<script>
setTimeout(() => {
  for (const name of ["alice", "bob"]) {
    const item = document.createElement("li");
    item.textContent = name;
    document.getElementById("jobs").append(item);
  }
  document.body.dataset.ready = "1";
}, 200);
</script></body></html>
"""


class QuietHandler(SimpleHTTPRequestHandler):
    """Serves the test's folder without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def site(tmp_path) -> Iterator[str]:
    """The page's URL on a local HTTP server."""
    (tmp_path / "index.html").write_text(PAGE)
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(QuietHandler, directory=tmp_path))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/index.html"
    server.shutdown()
    server.server_close()
    thread.join()


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def test_headless_chromium_loads_a_page_waits_for_it_and_saves_a_screenshot(
    site, tmp_path, monkeypatch
):
    def download(*_args: object) -> dict:
        raise AssertionError("Selenium Manager ran: it would download a driver or a browser")

    monkeypatch.setattr(SeleniumManager, "binary_paths", download)
    monkeypatch.setenv(browser.ARTIFACTS_ENV, str(tmp_path / "artifacts"))
    with browser.chromium() as driver:
        profile = Path(driver.capabilities["chrome"]["userDataDir"])
        assert profile.is_dir() and profile.name.startswith("tacc-chromium-")
        assert driver.capabilities["browserVersion"].split(".")[0].isdigit()
        driver.get(site)
        browser.wait_ready(driver, timeout=10)
        items = browser.wait_for(driver, "#jobs li", timeout=10)
        assert items.text == "alice"
        assert driver.execute_script(
            "return [...document.querySelectorAll('#jobs li')].map(li => li.textContent)"
        ) == ["alice", "bob"]
        assert driver.execute_script("return navigator.webdriver") is True
        assert driver.get_window_size() == {"width": 1400, "height": 1000}
        shot = browser.screenshot(driver, "smoke page")
        with pytest.raises(TimeoutException, match=r"no visible '#nothing'.*screenshot: "):
            browser.wait_for(driver, "#nothing", timeout=0.5)
    assert shot == tmp_path / "artifacts" / "smoke-page.png"
    width, height = png_size(shot)
    assert width == 1400 and 0 < height <= 1000, (width, height)
    assert (tmp_path / "artifacts" / "timeout-nothing.png").is_file()
    assert not profile.exists()


def test_artifacts_go_under_the_repositorys_cache_unless_the_environment_says(
    tmp_path, monkeypatch
):
    monkeypatch.delenv(browser.ARTIFACTS_ENV, raising=False)
    assert browser.artifacts_dir() == ROOT / ".cache" / "test-artifacts" / "dashboard"
    assert browser.artifacts_dir().is_dir()
    monkeypatch.setenv(browser.ARTIFACTS_ENV, str(tmp_path / "elsewhere"))
    assert browser.artifacts_dir() == tmp_path / "elsewhere"
    assert (tmp_path / "elsewhere").is_dir()
