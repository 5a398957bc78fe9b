"""The metric gate's client: one PromQL instant query against Prometheus, one number, one threshold.

`query_value` asks Prometheus's HTTP API (`GET {url}/api/v1/query`) and returns the single value of
the answer: a scalar, or a vector of exactly one sample. `compare` holds that value against the
gate's `max` and/or `min` (both inclusive) and says why in one line.

Errors say what happens next: GateUnavailable (Prometheus unreachable, slow, 5xx or "unavailable":
the gate is tried again) or GateUnusable (an answer no verdict can come from: a bad query, no
series or several, a range vector, NaN, a body over `max_bytes`, not JSON: someone must fix the
query). Every message names the query and the Prometheus URL, never the URL's user:password, which
is sent as HTTP basic auth instead.
"""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit

import httpx
from plnt.reconciler.errors import GateUnavailable, GateUnusable

MAX_QUERY_IN_MESSAGE = 200
# Prometheus's own error types that mean "ask again later" whatever the HTTP status says
RETRYABLE_ERROR_TYPES = frozenset({"unavailable", "timeout", "canceled"})


async def query_value(url: str, query: str, *, timeout_s: float = 10.0, max_bytes: int = 1_048_576,
                      client: httpx.AsyncClient | None = None) -> float:
    """The single value `query` evaluates to now on the Prometheus at `url`,
    http(s)://[user:password@]host[:port][/path] (the user:password goes as basic auth)."""
    base, auth, where = _split_url(url, query)
    about = f"(query {_shorten(query)!r}, Prometheus {where})"
    # Prometheus's own `timeout` makes it stop evaluating once plnt has stopped waiting
    params = {"query": query, "timeout": f"{timeout_s:g}"}
    try:
        # one deadline for the whole exchange: httpx's timeout is per connect/read, so a slow
        # trickle of bytes could otherwise go on for ever
        async with asyncio.timeout(timeout_s):
            if client is None:
                async with httpx.AsyncClient(trust_env=False) as own:
                    status, body, over = await _get(own, f"{base}/api/v1/query", params, auth, timeout_s, max_bytes)
            else:
                status, body, over = await _get(client, f"{base}/api/v1/query", params, auth, timeout_s, max_bytes)
    except (TimeoutError, httpx.TimeoutException):
        raise GateUnavailable(f"Prometheus did not answer within {timeout_s:g}s {about}: plnt asks again") from None
    except httpx.HTTPError as exc:
        # exc's text cannot hold the credentials: they never were part of the request's URL
        raise GateUnavailable(f"Prometheus cannot be reached ({type(exc).__name__}: {exc}) {about}: plnt asks again") from None

    answer = _json(body)
    error = _error_text(answer, body)
    error_type = answer.get("errorType") if isinstance(answer, dict) else None
    if status >= 500 or status == 429 or error_type in RETRYABLE_ERROR_TYPES:
        raise GateUnavailable(f"Prometheus answered HTTP {status}: {error} {about}: plnt asks again")
    if status in (400, 422):
        raise GateUnusable(f"Prometheus refused the query (HTTP {status}): {error} {about}: fix the query")
    if status in (401, 403):
        raise GateUnusable(f"Prometheus refused plnt's credentials (HTTP {status}) {about}: fix the gate's URL credentials")
    if status != 200:
        raise GateUnusable(f"Prometheus answered HTTP {status}: {error} {about}: is this the Prometheus URL?")
    if over:
        raise GateUnusable(f"Prometheus answered more than {max_bytes} bytes {about}: a gate's query must give one value")
    if not isinstance(answer, dict):
        raise GateUnusable(f"Prometheus answered something that is not its JSON API: {error} {about}: "
                           f"is this the Prometheus URL?")
    if answer.get("status") != "success":
        raise GateUnusable(f"Prometheus answered status {answer.get('status')!r}: {error} {about}")
    return _single_value(answer.get("data"), about)


def compare(value: float, *, max: float | None = None, min: float | None = None, what: str = "value") -> tuple[bool, str]:
    """(passed, why in one line): `value` against `max` and/or `min`, both inclusive. NaN never passes."""
    if max is None and min is None:
        raise ValueError("a metric gate needs max, min or both")
    if max is not None and min is not None and min > max:
        raise ValueError(f"min {min:g} is above max {max:g}: no value could pass")
    shown = f"{what} {value:.6g}"
    if max is not None and not value <= max:  # `not <=`, so NaN fails
        return False, f"{shown} > max {max:.6g}"
    if min is not None and not value >= min:
        return False, f"{shown} < min {min:.6g}"
    if max is None:
        return True, f"{shown} >= min {min:.6g}"
    if min is None:
        return True, f"{shown} <= max {max:.6g}"
    return True, f"{shown} within [min {min:.6g}, max {max:.6g}]"


async def _get(client: httpx.AsyncClient, endpoint: str, params: dict[str, str], auth: httpx.BasicAuth | None,
               timeout_s: float, max_bytes: int) -> tuple[int, bytes, bool]:
    """(status, at most max_bytes of the body, whether there was more): never more than that is held."""
    async with client.stream("GET", endpoint, params=params, auth=auth, timeout=timeout_s) as response:
        body = bytearray()
        # decoded bytes are counted, so a small gzip body that inflates past the cap is stopped too
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > max_bytes:
                return response.status_code, bytes(body[:max_bytes]), True
        return response.status_code, bytes(body), False


def _split_url(url: str, query: str) -> tuple[str, httpx.BasicAuth | None, str]:
    """(the base URL without credentials, basic auth from its user:password, the URL to show)."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (a port that is not a number raises here, not deep in httpx)
    except ValueError:
        parts = None
    hostport = parts.netloc.rpartition("@")[2] if parts else ""
    where = SplitResult(parts.scheme, hostport, parts.path, "", "").geturl() if parts else "(unparsable)"
    where = where or "(empty)"
    if not parts or parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise GateUnusable(f"the Prometheus URL {where} is not http(s)://[user:password@]host[:port][/path] "
                           f"(query {_shorten(query)!r}): fix the gate")
    auth = None
    if parts.username is not None:
        auth = httpx.BasicAuth(unquote(parts.username), unquote(parts.password or ""))
    return SplitResult(parts.scheme, hostport, parts.path.rstrip("/"), "", "").geturl(), auth, where


def _single_value(data: Any, about: str) -> float:
    """The one number of an instant query's `data` (scalar, or vector of one sample)."""
    if not isinstance(data, dict):
        raise GateUnusable(f"Prometheus answered no data {about}")
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        sample = result
    elif kind == "vector" and isinstance(result, list):
        if not result:
            raise GateUnusable(f"the query returned no series {about}: check the metric name and labels, or append "
                               f"`or vector(0)` if no series means 0 (sum() of no series is no series too)")
        if len(result) > 1:
            labels = "; ".join(_labels(item) for item in result[:3]) + ("; ..." if len(result) > 3 else "")
            raise GateUnusable(f"the query returned {len(result)} series ({labels}) {about}: aggregate it "
                               f"(sum, max, ...) to one")
        item = result[0] if isinstance(result[0], dict) else {}
        if "histogram" in item:
            raise GateUnusable(f"the query returned a native histogram, not a number {about}: "
                               f"use histogram_quantile() or histogram_count()")
        sample = item.get("value")
    elif kind == "matrix":
        raise GateUnusable(f"the query returned a range vector (a [duration] selector) {about}: reduce it to one "
                           f"value, e.g. rate(...[5m]) or avg_over_time(...[5m]), then aggregate")
    else:
        raise GateUnusable(f"the query returned a {kind} result, not a number {about}")
    try:
        value = float(sample[1])  # [timestamp, "value"]: Prometheus sends numbers as strings ("NaN", "+Inf")
    except (TypeError, ValueError, IndexError, KeyError):
        raise GateUnusable(f"Prometheus answered a sample that is not [time, number]: {str(sample)[:100]} {about}") from None
    if math.isnan(value):
        raise GateUnusable(f"the query returned NaN (a division by zero, e.g. no requests in the window) {about}: "
                           f"no verdict can come from it; decide what no traffic means: `(...) >= 0 or vector(0)` "
                           f"counts it as 0")
    return value


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def _error_text(answer: Any, body: bytes) -> str:
    """Prometheus's own `error` when it sent one, else the start of the body."""
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        return answer["error"]
    text = body[:200].decode("utf-8", "replace").strip()
    return repr(text) if text else "(empty body)"


def _labels(item: Any) -> str:
    metric = item.get("metric") if isinstance(item, dict) else None
    if not isinstance(metric, dict):
        return "?"
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(metric.items())) + "}"


def _shorten(query: str) -> str:
    flat = " ".join(query.split())
    return flat if len(flat) <= MAX_QUERY_IN_MESSAGE else flat[: MAX_QUERY_IN_MESSAGE - 3] + "..."
