"""The dashboard's static front end (tacc_agent/dashboard/static/, issue [25]), read as
text, no browser: the vendored uPlot is the pinned release; our own page and script load
nothing from outside the server (the cluster may have no route out); the script never
turns API text into markup (job names and log lines are the user's own); the page has
nothing the server's Content-Security-Policy refuses (inline script, event handler
attributes, style attributes); and the ids and attributes the browser tests rely on
are all there."""

from __future__ import annotations

import hashlib
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

import tacc_agent

STATIC = Path(tacc_agent.__file__).parent / "dashboard" / "static"

# uPlot 1.6.32 (MIT), as tools/vendor_uplot.sh fetches it (`npm pack uplot@1.6.32`) and
# copies it here; a version bump reruns the script and updates these sums.
VENDORED = {
    "uPlot.iife.min.js": "19c8d4c6ad88929a79f4ae49d6f7161566dfd0ba3d15cc495e974f787eb78f1f",
    "uPlot.min.css": "df630c6a8d6f8eeaff264b50f73ce5b114f646ffd9a0bb74f049b0a00135fa04",
    "uPlot.LICENSE": "8f989229699b4fe2f1a0432d0e9edc338a8a911e250e2d1b01ecd770a5f5b1bd",
}

# What the browser tests find the page by.
HOOK_IDS = (
    "user",
    "jobs",
    "quota",
    "gpus",
    "job-state",
    "job-nodes",
    "cancel",
    "halt",
    "logs",
    "log-filter",
    "nav-ops",
    "ops-nodes",
    "ops-queue",
    "ops-alerts",
)
HOOK_NAMES = (
    "data-job",
    "data-gpu-type",
    "data-host",
    "data-chart",
    "data-points",
    "data-node",
    "problem",
    "chart",
)

# Ways of turning a string into markup or code.
UNSAFE = re.compile(
    r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|\beval\s*\(|\bnew\s+Function\b"
    r"|\bset(?:Timeout|Interval)\(\s*['\"`]"
)


def read(name: str) -> str:
    return (STATIC / name).read_text(encoding="utf-8")


class Tags(HTMLParser):
    """Every start tag of index.html with its attributes, and each <script>'s body."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.script_bodies: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._in_script = True
            self.script_bodies.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.script_bodies[-1] += data


def index_tags() -> Tags:
    parser = Tags()
    parser.feed(read("index.html"))
    return parser


@pytest.mark.parametrize("name", sorted(VENDORED))
def test_vendored_uplot_is_the_pinned_release(name: str) -> None:
    digest = hashlib.sha256((STATIC / name).read_bytes()).hexdigest()
    assert digest == VENDORED[name], f"{name} is not the file tools/vendor_uplot.sh pins"


def test_index_loads_only_from_the_server() -> None:
    tags = index_tags().tags
    urls = [attrs[key] or "" for _, attrs in tags for key in ("src", "href") if key in attrs]
    for url in urls:
        local = url.startswith(("/", "#")) and not url.startswith("//")
        assert local or url.startswith("data:"), f"index.html loads {url!r} from outside"
    loaded = {url for url in urls if url.startswith("/static/")}
    expected = {"/static/uPlot.iife.min.js", "/static/uPlot.min.css"}
    assert {*expected, "/static/app.js", "/static/style.css"} <= loaded
    for url in loaded:
        assert (STATIC / url.removeprefix("/static/")).is_file(), url


@pytest.mark.parametrize("name", ["index.html", "app.js", "style.css"])
def test_our_files_name_no_outside_url(name: str) -> None:
    text = read(name)
    assert not re.search(r"https?:", text), f"{name} names an http(s) URL"
    assert not re.search(r"['\"`(]\s*//", text), f"{name} has a scheme-relative (//host) URL"
    assert "@import" not in text


def test_script_fetches_and_streams_only_the_api() -> None:
    script = read("app.js")
    calls = re.findall(r"\b(fetch|EventSource|api|post)\(\s*([^,)]*)", script)
    assert {verb for verb, _ in calls} >= {"fetch", "EventSource", "api", "post"}
    for verb, argument in calls:
        if argument[:1] in "'\"`":
            assert argument[1:].startswith("/api/"), f"{verb}({argument}"
        else:
            # a path built by the helpers below, or api()'s own parameter
            assert argument.startswith(("apiJob(", "path")), f"{verb}({argument}"
    assert "'/api/jobs/' + encodeURIComponent(" in script
    assert "'#/job/' + encodeURIComponent(" in script


def test_script_never_makes_markup_or_code_of_text() -> None:
    script = read("app.js")
    found = [match.group(0) for match in UNSAFE.finditer(script)]
    assert not found, f"app.js uses {found}"
    # the Content-Security-Policy refuses style attributes: looks go through classes only
    assert not re.search(r"setAttribute\(\s*['\"]style['\"]", script)


def test_index_has_nothing_the_policy_refuses() -> None:
    parser = index_tags()
    for tag, attrs in parser.tags:
        handlers = [name for name in attrs if name.startswith("on")]
        assert not handlers, f"<{tag}> has inline handlers {handlers}"
        assert "style" not in attrs, f"<{tag}> has a style attribute"
        assert tag != "style", "index.html has a <style> element"
        if tag == "script":
            assert attrs.get("src"), "index.html has a <script> without src"
    assert all(not body.strip() for body in parser.script_bodies), "inline <script> body"


def test_every_test_hook_is_there() -> None:
    page, script = read("index.html"), read("app.js")
    for hook in HOOK_IDS:
        assert f'id="{hook}"' in page or f"'{hook}'" in script, f"no #{hook}"
    for name in HOOK_NAMES:
        assert f"'{name}'" in script, f"app.js never sets {name}"
    assert "dataset.ready = '1'" in script
    assert "dataset.ready = '0'" in script
