"""The invocation log: the last calls a gateway answered (`GET /calls`), kept in memory with a bound.

Each gateway process records its own calls where the metrics record them (`forward.Gateway.measured`): one
tuple appended to a bounded deque, no body, no token, no header. Under `plnt up` with gateway worker
processes a call lands on any process, so the workers push their new calls to plnt up's process
(`push_calls`, like `push_metrics`: only when there is something new, at most every PUSH_S) and
`/calls` is forwarded there (gateway/role.py), where `CallsHub` merges every process's log by time.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import Response
from plnt.core.traffic import TrafficLedger

log = logging.getLogger("plnt.gateway.calls")

DEFAULT_CALLS = 200  # per process: what the UI's log shows at most
MAX_LIMIT = 1000
CALLS_PATH = "/internal/gateway-calls"
PUSH_S = 0.25  # a worker's call is in plnt up's log within about this long
MAX_PUSH_BYTES = 2 * 2**20

# (at epoch s, api, namespace, workflow, version, track, code, latency s, error type or None)
Call = tuple[float, str, str, str, str, str, int, float, "str | None"]
_FIELDS = 9


def call_json(call: Call) -> dict[str, Any]:
    at, api, namespace, workflow, version, track, code, latency_s, error_type = call
    return {"at": round(at, 3), "api": api, "namespace": namespace, "workflow": workflow, "version": version,
            "track": track, "code": code, "latencyMs": round(latency_s * 1000, 2), "errorType": error_type}


class CallLog:
    """One process's last `size` calls. `add` is a tuple and a deque append (the hot path's cost)."""

    def __init__(self, size: int = DEFAULT_CALLS) -> None:
        self.size = size
        self.calls: deque[Call] = deque(maxlen=size)
        self.count = 0  # calls ever added: a pusher sends what came since its last push
        self.ledger: TrafficLedger | None = None  # plnt up's process: each release's traffic (core/traffic.py)

    def add(self, api: str, labels: tuple[str, str, str, str], code: int, latency_s: float,
            error_type: str | None) -> None:
        namespace, workflow, version, track = labels
        at = time.time()
        self.calls.append((at, api, namespace, workflow, version, track, code, latency_s, error_type))
        self.count += 1
        if self.ledger is not None:
            self.ledger.add(namespace, workflow, version, track, at, code, latency_s)

    def since(self, count: int) -> list[Call]:
        """The calls added after the `count`-th (at most the ones still kept)."""
        new = min(self.count - count, len(self.calls))
        return list(self.calls)[len(self.calls) - new:] if new > 0 else []

    def rows(self, limit: int) -> list[dict[str, Any]]:
        return [call_json(call) for call in newest(list(self.calls), limit)]


def newest(calls: list[Call], limit: int) -> list[Call]:
    return sorted(calls, key=lambda call: call[0], reverse=True)[:max(0, limit)]


def _valid(item: Any) -> Call | None:
    """A pushed call as it must be (a worker holds the internal token; still, nothing else is kept)."""
    if not isinstance(item, list) or len(item) != _FIELDS:
        return None
    at, api, namespace, workflow, version, track, code, latency, error_type = item
    if not (isinstance(at, (int, float)) and api in ("invoke", "chat") and isinstance(code, int)
            and isinstance(latency, (int, float)) and (error_type is None or isinstance(error_type, str))
            and all(isinstance(v, str) and len(v) <= 256 for v in (namespace, workflow, version, track))):
        return None
    return (float(at), api, namespace, workflow, version, track, code, float(latency),
            error_type[:100] if error_type else error_type)


class CallsHub:
    """plnt up's side: its own log and each worker's pushed calls, merged by time for `GET /calls`."""

    def __init__(self, own: CallLog) -> None:
        self.own = own
        self.workers: dict[int, deque[Call]] = {}

    def rows(self, limit: int) -> list[dict[str, Any]]:
        calls = list(self.own.calls)
        for kept in self.workers.values():
            calls.extend(kept)
        return [call_json(call) for call in newest(calls, limit)]

    def take(self, index: int, items: list[Any]) -> int:
        kept = self.workers.setdefault(index, deque(maxlen=self.own.size))
        taken = 0
        ledger = self.own.ledger
        for item in items:
            call = _valid(item)
            if call is not None:
                kept.append(call)
                taken += 1
                if ledger is not None:
                    at, _, namespace, workflow, version, track, code, latency_s, _ = call
                    ledger.add(namespace, workflow, version, track, at, code, latency_s)
        return taken

    def mount(self, app: Any, internal_token: str) -> None:
        from plnt.gateway.route_watch import internal_guard, read_at_most

        guard = internal_guard(app, internal_token)

        @app.put(CALLS_PATH + "/{index}", include_in_schema=False)
        async def put_calls(index: int, request: Request) -> Response:
            if (refused := guard(request, f"PUT {CALLS_PATH}")) is not None:
                return refused
            body = await read_at_most(request, MAX_PUSH_BYTES)
            if body is None:
                return Response(status_code=413)
            try:
                items = json.loads(body)
            except ValueError as exc:
                return Response(f"not JSON: {exc}", status_code=400)
            if not isinstance(items, list):
                return Response("expected a JSON list of calls", status_code=400)
            self.take(index, items)
            return Response(status_code=204)

        app.state.call_rows = self.rows


async def push_calls(calls: CallLog, control_url: str, index: int, internal_token: str,
                     every_s: float = PUSH_S, client_factory: Callable[[], httpx.AsyncClient] | None = None) -> None:
    """The worker's side: its new calls to the control plane, checked every `every_s`, sent only
    when there are any, until cancelled. A failed push is sent again with the next ones."""
    url = f"{control_url.rstrip('/')}{CALLS_PATH}/{index}"
    headers = {"authorization": f"Bearer {internal_token}", "content-type": "application/json"}
    pushed = calls.count
    factory = client_factory or (lambda: httpx.AsyncClient(trust_env=False, timeout=10))
    async with factory() as client:
        while True:
            await asyncio.sleep(every_s)
            count = calls.count
            if count == pushed:
                continue
            body = json.dumps(calls.since(pushed), separators=(",", ":")).encode()
            try:
                response = await client.put(url, content=body, headers=headers)
                if response.status_code == 204:
                    pushed = count
                else:
                    log.warning("calls-push-refused status=%d", response.status_code)
            except httpx.HTTPError as exc:
                log.debug("calls-push-failed: %s", type(exc).__name__)


__all__ = ["CALLS_PATH", "DEFAULT_CALLS", "MAX_LIMIT", "CallLog", "CallsHub", "call_json", "push_calls"]
