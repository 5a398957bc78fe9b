"""The invocation log: the last calls a gateway answered (`GET /calls`), kept in memory with a bound,
and what feeds the control plane's traffic ledger (core/traffic.py, the compare gate's data).

Each gateway process records its own calls where the metrics record them (`forward.Gateway.record`):
one tuple appended to a bounded deque, no body, no token, no header. Every gateway process that
follows a control plane (a `plnt gateway`, its worker processes, `plnt up`'s gateway workers) pushes
its new calls there (`CallsPusher`, like `push_metrics`: when there is something new, at most every
PUSH_S, and at least every HEARTBEAT_S so the control plane knows it is alive), where `CallsHub`
merges every process's log by time for `GET /calls` and adds each call to the ledger, which
`GET /internal/traffic` reads for a `plnt worker`'s compare gate (the internal token for both).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

import httpx
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from plnt.core.traffic import TRAFFIC_PATH, TrafficLedger, TrafficReading

log = logging.getLogger("plnt.gateway.calls")

DEFAULT_CALLS = 200  # per process: what the UI's log shows at most, and at most what one push carries
MAX_LIMIT = 1000
CALLS_PATH = "/internal/gateway-calls"
PUSH_S = 0.25  # a gateway's call is in the control plane's ledger within about this long
HEARTBEAT_S = 2.0  # a gateway with no new call still pushes (an empty list) this often
SILENT_S = 10.0  # a gateway not heard from for this long is named by a traffic reading ("silent")
MAX_PUSH_BYTES = 2 * 2**20
MAX_SOURCES = 1000  # gateway processes kept apart in the hub (a fleet is far smaller)
_SOURCE = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# (at epoch s, api, namespace, workflow, version, track, code, latency s, error type or None,
#  ttft s or None, tpot s or None, completion tokens or None,
#  first or None, reason or None, fallback of or None): retries and fallbacks (gateway/retry.py). The answered
#  call of a retry names the backend first tried ("track version") and why it was left; a failed attempt that
#  was sent again is a call of its own, with the reason and no `first`; `fallback of` is the model the caller
#  named when its fallback model answered (`workflow` is the fallback's name).
Call = tuple[float, str, str, str, str, str, int, float, "str | None", "float | None", "float | None", "int | None",
             "str | None", "str | None", "str | None"]
_FIELDS = 15
_OLD_FIELDS = (9, 12)  # gateways of the versions before TTFT, TPOT and tokens, and before retries


def call_json(call: Call) -> dict[str, Any]:
    (at, api, namespace, workflow, version, track, code, latency_s, error_type, ttft_s, tpot_s, tokens, first, reason,
     fallback_of) = call
    return {"at": round(at, 3), "api": api, "namespace": namespace, "workflow": workflow, "version": version,
            "track": track, "code": code, "latencyMs": round(latency_s * 1000, 2), "errorType": error_type,
            "ttftMs": None if ttft_s is None else round(ttft_s * 1000, 2),
            "tpotMs": None if tpot_s is None else round(tpot_s * 1000, 2), "tokens": tokens,
            # a retry or fallback answered: the backend first tried and why it was left
            "retry": None if first is None else {"from": first, "reason": reason},
            # this attempt failed and the request was sent again (retry, or to the fallback model): why
            "retried": reason if first is None else None,
            "fallbackOf": fallback_of}


def _to_ledger(ledger: TrafficLedger, call: Call) -> None:
    at, _, namespace, workflow, version, track, code, latency_s, _, ttft_s, tpot_s, tokens = call[:12]
    ledger.add(namespace, workflow, version, track, at, code, latency_s, (ttft_s, tpot_s, tokens))


class CallLog:
    """One process's last `size` calls. `add` is a tuple and a deque append (the hot path's cost)."""

    def __init__(self, size: int = DEFAULT_CALLS) -> None:
        self.size = size
        self.calls: deque[Call] = deque(maxlen=size)
        self.count = 0  # calls ever added: a pusher sends what came since its last push
        self.ledger: TrafficLedger | None = None  # a control plane's process: each release's traffic (core/traffic.py)

    def add(self, api: str, labels: tuple[str, str, str, str], code: int, latency_s: float,
            error_type: str | None, ttft_s: float | None = None, tpot_s: float | None = None,
            tokens: int | None = None, first: str | None = None, reason: str | None = None,
            fallback_of: str | None = None) -> None:
        namespace, workflow, version, track = labels
        call = (time.time(), api, namespace, workflow, version, track, code, latency_s, error_type, ttft_s, tpot_s,
                tokens, first, reason, fallback_of)
        self.calls.append(call)
        self.count += 1
        if self.ledger is not None:
            _to_ledger(self.ledger, call)

    def since(self, count: int) -> list[Call]:
        """The calls added after the `count`-th (at most the ones still kept)."""
        new = min(self.count - count, len(self.calls))
        return list(self.calls)[len(self.calls) - new:] if new > 0 else []

    def rows(self, limit: int) -> list[dict[str, Any]]:
        return [call_json(call) for call in newest(list(self.calls), limit)]


def newest(calls: list[Call], limit: int) -> list[Call]:
    return sorted(calls, key=lambda call: call[0], reverse=True)[:max(0, limit)]


def _figure(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and value >= 0)


def _valid(item: Any) -> Call | None:
    """A pushed call as it must be (a gateway holds the internal token; still, nothing else is kept)."""
    if isinstance(item, list) and len(item) in _OLD_FIELDS:
        item = [*item, *(None,) * (_FIELDS - len(item))]
    if not isinstance(item, list) or len(item) != _FIELDS:
        return None
    at, api, namespace, workflow, version, track, code, latency, error_type, ttft, tpot, tokens, *retry = item
    if not (isinstance(at, (int, float)) and api in ("invoke", "chat") and isinstance(code, int)
            and isinstance(latency, (int, float)) and (error_type is None or isinstance(error_type, str))
            and all(isinstance(v, str) and len(v) <= 256 for v in (namespace, workflow, version, track))
            and _figure(ttft) and _figure(tpot) and (tokens is None or (isinstance(tokens, int) and 0 <= tokens < 2**31))
            and all(v is None or (isinstance(v, str) and len(v) <= 256) for v in retry)):
        return None
    first, reason, fallback_of = retry
    return (float(at), api, namespace, workflow, version, track, code, float(latency),
            error_type[:100] if error_type else error_type, None if ttft is None else float(ttft),
            None if tpot is None else float(tpot), tokens, first, reason, fallback_of)


class CallsHub:
    """A control plane's side: its own log and each gateway process's pushed calls, merged by time for
    `GET /calls`, each call also added to the ledger; and when each process was last heard from."""

    def __init__(self, own: CallLog) -> None:
        self.own = own
        self.sources: OrderedDict[str, deque[Call]] = OrderedDict()  # least recently heard first
        self._heard: dict[str, tuple[float, float]] = {}  # source -> (wall clock, monotonic) of its last push

    def rows(self, limit: int) -> list[dict[str, Any]]:
        calls = list(self.own.calls)
        for kept in self.sources.values():
            calls.extend(kept)
        return [call_json(call) for call in newest(calls, limit)]

    def take(self, source: str, items: list[Any], *, last: bool = False) -> int:
        """A push from `source`; `last`: it is stopping (its calls stay counted; it is not missed)."""
        kept = self.sources.get(source)
        if kept is None:
            log.info("gateway-calls-from source=%s", source)
            kept = self.sources[source] = deque(maxlen=self.own.size)
            while len(self.sources) > MAX_SOURCES:
                gone, _ = self.sources.popitem(last=False)
                self._heard.pop(gone, None)
        self.sources.move_to_end(source)
        self._heard[source] = (time.time(), time.monotonic())
        taken = 0
        ledger = self.own.ledger
        for item in items:
            call = _valid(item)
            if call is not None:
                kept.append(call)
                taken += 1
                if ledger is not None:
                    _to_ledger(ledger, call)
        if last:
            log.info("gateway-calls-last source=%s", source)
            self._heard.pop(source, None)
        return taken

    def reading(self, namespace: str, name: str, canary: str, stable: str, since: float) -> TrafficReading:
        """The ledger's reading, with the gateway processes it rests on: this process and every one heard
        from since `since`; those not heard from for SILENT_S are named (their calls since are missing)."""
        assert self.own.ledger is not None
        now = time.monotonic()
        heard = {source: mono for source, (wall, mono) in self._heard.items() if wall >= since}
        silent = tuple(sorted(source for source, mono in heard.items() if now - mono > SILENT_S))
        return self.own.ledger.reading(namespace, name, canary, stable, since).model_copy(
            update={"gateways": 1 + len(heard) - len(silent), "silent": silent})

    def mount(self, app: Any, internal_token: str | None) -> None:
        """`PUT /internal/gateway-calls/{source}` (a gateway's push) and, with a ledger,
        `GET /internal/traffic` (a worker's read); both need the internal token."""
        from plnt.gateway.route_watch import internal_guard, read_at_most

        guard = internal_guard(app, internal_token)

        @app.put(CALLS_PATH + "/{source}", include_in_schema=False)
        async def put_calls(source: str, request: Request, last: bool = False) -> Response:
            if (refused := guard(request, f"PUT {CALLS_PATH}")) is not None:
                return refused
            if not _SOURCE.fullmatch(source):
                return Response("the source is 1 to 64 letters, digits, '.', '-' or '_'", status_code=400)
            body = await read_at_most(request, MAX_PUSH_BYTES)
            if body is None:
                return Response(status_code=413)
            try:
                items = json.loads(body)
            except ValueError as exc:
                return Response(f"not JSON: {exc}", status_code=400)
            if not isinstance(items, list):
                return Response("expected a JSON list of calls", status_code=400)
            self.take(source, items, last=last)
            return Response(status_code=204)

        app.state.call_rows = self.rows
        if self.own.ledger is None:
            return

        @app.get(TRAFFIC_PATH, include_in_schema=False)
        async def traffic(request: Request, namespace: str, name: str, canary: str, stable: str,
                          since: float) -> Response:
            if (refused := guard(request, f"GET {TRAFFIC_PATH}")) is not None:
                return refused
            if max(len(namespace), len(name), len(canary), len(stable)) > 256 or not math.isfinite(since):
                return JSONResponse({"error": {"type": "bad_request", "message": (
                    "namespace, name, canary and stable are at most 256 characters; since is epoch seconds")}},
                    status_code=400)
            reading = self.reading(namespace, name, canary, stable, since)
            return Response(reading.model_dump_json(by_alias=True), media_type="application/json")


def source_name() -> str:
    """How a gateway process names itself to the control plane: host (a pod's name) and pid."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{socket.gethostname()}-{os.getpid()}")
    return name[-64:]


class CallsPusher:
    """A gateway process's side: its new calls to the control plane, checked every `every_s`, sent
    when there are any or `heartbeat_s` passed, until cancelled; `leave()` sends the rest and says it
    stops. A failed push is sent again with the next ones (at most the log's size: a sample beyond)."""

    def __init__(self, calls: CallLog, control_url: str, source: str, internal_token: str, *,
                 every_s: float = PUSH_S, heartbeat_s: float = HEARTBEAT_S,
                 client_factory: Callable[[], httpx.AsyncClient] | None = None) -> None:
        self.calls = calls
        self.url = f"{control_url.rstrip('/')}{CALLS_PATH}/{source}"
        self._headers = {"authorization": f"Bearer {internal_token}", "content-type": "application/json"}
        self.every_s = every_s
        self.heartbeat_s = heartbeat_s
        self._factory = client_factory or (lambda: httpx.AsyncClient(trust_env=False, timeout=10))
        self.pushed = calls.count
        self._refused: int | None = None  # the status last logged, so a refusing control plane is said once

    async def _push(self, client: httpx.AsyncClient, *, last: bool = False) -> bool:
        count = self.calls.count
        body = json.dumps(self.calls.since(self.pushed), separators=(",", ":")).encode()
        try:
            response = await client.put(self.url, content=body, headers=self._headers,
                                        params={"last": "true"} if last else None)
        except httpx.HTTPError as exc:
            log.debug("calls-push-failed: %s", type(exc).__name__)
            return False
        if response.status_code == 204:
            self.pushed, self._refused = count, None
            return True
        if response.status_code != self._refused:  # (the URL has no secret; the token is in a header)
            log.warning("calls-push-refused status=%d url=%s", response.status_code, self.url)
            self._refused = response.status_code
        return False

    async def run(self) -> None:
        async with self._factory() as client:
            last_push = -math.inf  # the first push at once: the control plane knows this process from its start
            while True:
                if self.calls.count != self.pushed or time.monotonic() - last_push >= self.heartbeat_s:
                    if await self._push(client):
                        last_push = time.monotonic()
                await asyncio.sleep(self.every_s)

    async def leave(self, timeout_s: float = 2.0) -> None:
        """The calls not pushed yet, marked last (the control plane does not miss a gateway that stopped)."""
        try:
            async with asyncio.timeout(timeout_s), self._factory() as client:
                await self._push(client, last=True)
        except TimeoutError:
            log.debug("calls-last-push-timed-out")


__all__ = ["CALLS_PATH", "DEFAULT_CALLS", "MAX_LIMIT", "TRAFFIC_PATH", "CallLog", "CallsHub", "CallsPusher",
           "call_json", "source_name"]
