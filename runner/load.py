"""A runner's load, what autoscaling follows: the invocations it is serving right now.

`LoadMeter` wraps the runner's ASGI app: it counts invocations in flight (POST /invoke and /chat,
from the request's start until its last byte, streams included) and answers, itself, without
touching the app:

- `GET /load`: `{"inFlight": n, "waiting": 0}` (plnt's autoscaler polls it; a runner is async and
  serves every request it accepted at once, so none waits in it);
- `GET /metrics`: the same as Prometheus text, `plnt_runner_in_flight_requests` (the Pods metric the
  workflow-runner chart's HPA scales on through a metrics adapter) and
  `plnt_runner_invocations_total` (its rate is the chart's `plnt_invocations_per_second`).

Two counter updates per invocation; nothing else is counted (health checks, /stats, /load). No
secret and no request content is in either answer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

INVOCATION_PATHS = frozenset({"/invoke", "/chat"})
LOAD_PATH = "/load"
METRICS_PATH = "/metrics"
IN_FLIGHT_METRIC = "plnt_runner_in_flight_requests"
INVOCATIONS_METRIC = "plnt_runner_invocations_total"


def load_body(in_flight: int, waiting: int = 0) -> dict[str, int]:
    """GET /load's answer (the same shape a model server's /load gives)."""
    return {"inFlight": in_flight, "waiting": waiting}


def metrics_text(in_flight: int, invocations: int) -> str:
    return (f"# HELP {IN_FLIGHT_METRIC} Invocations being served now (POST /invoke and /chat).\n"
            f"# TYPE {IN_FLIGHT_METRIC} gauge\n{IN_FLIGHT_METRIC} {in_flight}\n"
            f"# HELP {INVOCATIONS_METRIC} Invocations started (POST /invoke and /chat).\n"
            f"# TYPE {INVOCATIONS_METRIC} counter\n{INVOCATIONS_METRIC} {invocations}\n")


class LoadMeter:
    """ASGI wrapper: counts invocations in flight and answers GET /load and GET /metrics."""

    def __init__(self, app: Any, clock: Callable[[], float] = time.monotonic) -> None:
        self.app = app
        self._clock = clock
        self.in_flight = 0
        self.invocations = 0
        self.last_activity = clock()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if path in INVOCATION_PATHS:
            self.in_flight += 1
            self.invocations += 1
            try:
                await self.app(scope, receive, send)
            finally:
                self.in_flight -= 1
                self.last_activity = self._clock()
            return
        if scope.get("method") == "GET" and path == LOAD_PATH:
            await _answer(send, json.dumps(load_body(self.in_flight)).encode(), b"application/json")
        elif scope.get("method") == "GET" and path == METRICS_PATH:
            await _answer(send, metrics_text(self.in_flight, self.invocations).encode(),
                          b"text/plain; version=0.0.4; charset=utf-8")
        else:
            await self.app(scope, receive, send)


async def _answer(send: Any, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})
