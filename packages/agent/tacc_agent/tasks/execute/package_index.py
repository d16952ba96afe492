"""Why uv could not get a package from the cluster's package cache: the project is truly
missing (fail the build at once), or the cache could not reach upstream this time (a
transient failure: envcache retries the step).

uv's own words do not tell the two apart. The cluster index (devpi-server, roles/
package_cache) inherits PyPI's projects from its mirror base (root/pypi); when the mirror
cannot fetch a project's page from upstream within its request timeout, the derived index
treats the base as holding nothing and answers 404, "The project X does not exist", and uv
says "X was not found in the package registry". So after a not-found the cache itself is
asked again: the project's page on the index, then on each of its bases (devpi's JSON API
names them). A mirror that still cannot reach upstream answers 502 (or does not answer);
one that fetched the page meanwhile (it goes on in the background) answers 200; only a
404 from every one of them is a missing project.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from urllib.parse import urlsplit

PYPI = "https://pypi.org/simple/"  # uv's index when the agent has no package_index
PROBE_TIMEOUT = 30.0
# uv 0.13: "Because numpy was not found in the package registry and you require numpy, ..."
_NOT_FOUND = re.compile(r"\b([A-Za-z0-9][A-Za-z0-9._-]*) was not found in the package registry")
# devpi's own 404 text, where a client prints it.
_NOT_EXIST = re.compile(r"The project ([A-Za-z0-9][A-Za-z0-9._-]*) does not exist")
# uv's lines for a cache that did not answer, or answered with a server error.
_UNREACHABLE = re.compile(
    r"error sending request|timed out|Connection refused|Connection reset|"
    r"server error \(5\d\d|Request failed after \d+ retries|dns error",
    re.IGNORECASE,
)
# devpi's index URL: <server>/<user>/<index>/+simple/
_DEVPI_INDEX = re.compile(r"^(?P<server>https?://.+?)/(?P<index>[^/+]+/[^/+]+)/\+simple/?$")

Getter = Callable[[str, str], tuple[int | None, str]]


class Verdict(Enum):
    PRESENT = "present"
    MISSING = "missing"
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class Diagnosis:
    """What went wrong between uv and the cache: retry (transient) or fail at once."""

    transient: bool
    detail: str


def normalize(name: str) -> str:
    """PEP 503 project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def http_get(url: str, accept: str) -> tuple[int | None, str]:
    """(HTTP status, the start of the answer), or (None, why nothing answered). A
    file:// index (a directory) answers 200 for a page that exists, else 404."""
    # Lazy: urllib.request (http.client, ssl, email) is ~15 ms of every job step's start
    # (envcache imports this module); only a failed environment build probes the index.
    import urllib.error  # lazy start-up import
    import urllib.request  # lazy start-up import

    if urlsplit(url).scheme == "file":
        path = Path(urllib.request.url2pathname(urlsplit(url).path))
        return (200, "") if path.exists() else (404, f"{path}: no such file")
    request = urllib.request.Request(url, headers={"Accept": accept})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT) as answer:  # noqa: S310
            return answer.status, answer.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read(2048).decode(errors="replace")
    except (OSError, ValueError) as err:  # refused, timed out, a bad URL
        return None, str(getattr(err, "reason", err))


def one_line(text: str, limit: int = 200) -> str:
    """An answer's text on one line: devpi's error pages are HTML (its head left out)."""
    body = re.sub(r"(?is)<head>.*?</head>", " ", text)
    return " ".join(html.unescape(re.sub(r"<[^>]*>", " ", body)).split())[:limit]


def missing_projects(output: str) -> list[str]:
    """The projects uv (or the cache) said do not exist, in order, once each."""
    found = _NOT_FOUND.findall(output) + _NOT_EXIST.findall(output)
    return list(dict.fromkeys(normalize(name) for name in found))


def unreachable_line(output: str) -> str | None:
    """uv's line saying the cache did not answer or failed, if there is one."""
    lines = [line.strip() for line in output.splitlines() if _UNREACHABLE.search(line)]
    return lines[-1] if lines else None


def bases(index: str, get: Getter) -> list[str]:
    """The simple-index URLs of the indexes a devpi index inherits from ([] for any
    other index, or when devpi does not say)."""
    match = _DEVPI_INDEX.match(index)
    if not match:
        return []
    status, text = get(f"{match['server']}/{match['index']}", "application/json")
    try:
        names = json.loads(text)["result"]["bases"] if status == 200 else []
    except (ValueError, KeyError, TypeError):
        names = []
    return [f"{match['server']}/{name}/+simple/" for name in names if isinstance(name, str)]


def probe(index: str, project: str, get: Getter = http_get) -> tuple[Verdict, str]:
    """Whether the cache has `project` now, lacks it, or cannot tell (upstream or the
    cache itself unreachable); with what answered. The index first; its bases only
    after a 404 there."""
    asked: list[str] = []
    pending = [index]
    while pending:
        page_index = pending.pop(0)
        asked.append(page_index)
        page = f"{page_index.rstrip('/')}/{normalize(project)}/"
        status, text = get(page, "text/html")
        if status == 200:
            return Verdict.PRESENT, f"{page} answers 200"
        if status != 404:
            why = f"HTTP {status}" if status else "no answer"
            return Verdict.UNREACHABLE, f"{page}: {why} {one_line(text)}".strip()
        if page_index == index:
            pending = bases(index, get)
    return Verdict.MISSING, f"404 from {', '.join(asked)}"


def diagnose(index: str, output: str, get: Getter = http_get) -> Diagnosis | None:
    """Why a uv step failed, as far as the cache is concerned; None when the cache
    answered everything (a conflict, a bad requirement: retrying changes nothing)."""
    where = index or PYPI
    names = missing_projects(output)
    if names:
        verdicts = {name: probe(where, name, get) for name in names}
        unsure = {n: what for n, (verdict, what) in verdicts.items() if verdict != Verdict.MISSING}
        if not unsure:
            return Diagnosis(False, f"has no project {', '.join(names)} (asked again: 404)")
        detail = "; ".join(f"{name} said missing, then {what}" for name, what in unsure.items())
        return Diagnosis(True, detail)
    line = unreachable_line(output)
    return Diagnosis(True, line) if line else None
