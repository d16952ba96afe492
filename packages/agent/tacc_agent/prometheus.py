"""The cluster's Prometheus over its HTTP API (config.prometheus_url): instant queries
(the ops usage report's GPU time, tasks/accounting/gpu_time_used.py), range queries and
the firing alerts (the dashboard's broker, dashboard/broker.py).

Every request goes straight to Prometheus (no http_proxy: cluster nodes often have one
set, and urllib's no_proxy knows no address ranges), within the caller's timeout, and
reads at most MOST_BYTES of the answer. Anything but a successful answer of the shape
asked for is PrometheusUnavailable, with a line saying why.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request

MOST_BYTES = 64 << 20
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class PrometheusUnavailable(Exception):
    """Prometheus did not answer, or not with a query result."""


def usable_url(url: str) -> str | None:
    """Why url cannot be Prometheus' address; None when it can."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return f"prometheus_url {url!r} is not an http:// or https:// address"
    return None


def api(base_url: str, path: str, arguments: dict[str, str], timeout: float) -> dict:
    """The `data` of a successful answer to GET <base_url>/api/v1/<path>?<arguments>."""
    query = f"?{urllib.parse.urlencode(arguments)}" if arguments else ""
    url = f"{base_url.rstrip('/')}/api/v1/{path}{query}"
    try:
        with DIRECT.open(url, timeout=timeout) as answer:
            body = answer.read(MOST_BYTES)
    except urllib.error.HTTPError as exc:  # Prometheus says why in its JSON body
        body = exc.read(MOST_BYTES)
        if not body:
            raise PrometheusUnavailable(f"HTTP {exc.code}") from None
    except (OSError, ValueError) as exc:  # refused, unreachable, timed out, bad URL
        raise PrometheusUnavailable(str(getattr(exc, "reason", exc))) from None
    try:
        reply = json.loads(body)
    except ValueError:
        raise PrometheusUnavailable("its answer is not JSON") from None
    if not isinstance(reply, dict) or reply.get("status") != "success":
        error = reply.get("error") if isinstance(reply, dict) else None
        raise PrometheusUnavailable(f"the query failed: {error or 'no status'}")
    data = reply.get("data")
    if not isinstance(data, dict):
        raise PrometheusUnavailable("its answer holds no data")
    return data


def result_of(data: dict, kind: str) -> list[dict]:
    """The result list of a query's data, which must be of `kind` (vector, matrix)."""
    if data.get("resultType") != kind:
        raise PrometheusUnavailable(f"the query's answer is not a {kind}")
    result = data.get("result")
    return [item for item in result if isinstance(item, dict)] if isinstance(result, list) else []


def query(base_url: str, expression: str, at: float, timeout: float) -> list[dict]:
    """An instant query's vector ([{"metric": {...}, "value": [time, "text"]}])."""
    arguments = {"query": expression, "time": f"{at:.3f}"}
    return result_of(api(base_url, "query", arguments, timeout), "vector")


def query_range(
    base_url: str, expression: str, start: float, end: float, step: float, timeout: float
) -> list[dict]:
    """A range query's matrix ([{"metric": {...}, "values": [[time, "text"], ...]}])."""
    arguments = {
        "query": expression,
        "start": f"{start:.3f}",
        "end": f"{end:.3f}",
        "step": f"{step:g}",
    }
    return result_of(api(base_url, "query_range", arguments, timeout), "matrix")


def alerts(base_url: str, timeout: float) -> list[dict]:
    """The alerts Prometheus holds, pending and firing ([{"labels", "annotations",
    "state", "activeAt", "value"}])."""
    found = api(base_url, "alerts", {}, timeout).get("alerts")
    return [item for item in found if isinstance(item, dict)] if isinstance(found, list) else []


def label_value(text: str) -> str:
    """`text` as a PromQL string literal (double quotes; backslash, quote and control
    characters escaped as Go reads them), for a label matcher."""
    return json.dumps(text, ensure_ascii=False)
