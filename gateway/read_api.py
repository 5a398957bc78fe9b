"""The gateway's read endpoints, served by FastAPI after the token and scope check in `GatewayApp`
(auth.required_scope): `GET /workflows` (the status rows), `GET /workflows/events` (the rows as
Server-Sent Events: the UI's live list), `GET /calls` (the last calls, calls.py),
`GET /workflows/{name}/stats` (the runners' own stats), `GET /v1/models[/{model}]` (OpenAI's model
list), `GET /healthz` and `GET /metrics`.

Runner addresses are shown to `admin` tokens only: everyone else reaches runners through the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from plnt.core.auth import ADMIN, ALL, READ, Grant
from plnt.core.routes import AmbiguousRoute, Backend, preview_of
from plnt.core.specs.models import GatewayPolicySpec
from plnt.core.upstream import UpstreamError
from plnt.gateway import openai_compat as oai
from plnt.gateway.calls import MAX_LIMIT as MAX_CALLS_LIMIT
from plnt.gateway.forward import Gateway
from plnt.gateway.quotas import limits_rows, usage_rows
from plnt.gateway.replies import ASGIScope, Receive, Send
from plnt.gateway.router import Router

# Runner addresses as the drivers make them (loopback processes, Kubernetes services).
_RUNNER_URL = re.compile(r"https?://(?:127(?:\.\d{1,3}){3}|localhost|\[::1\]|[\w.-]+\.svc(?:\.cluster\.local)?)(?::\d+)?")
# A gateway's first route table usually arrives within a second (the follower retries from 0.5 s on);
# 2 s is what its other requests answer meanwhile (role.py).
_HEALTH_RETRY_AFTER = {"retry-after": "2"}

ListWorkflows = Callable[[], list[dict[str, Any]]]
Health = Callable[[], tuple[int, dict[str, Any]]]


def add_read_api(app: FastAPI, gateway: Gateway, *, list_workflows: ListWorkflows, health: Health | None,
                 events_poll_s: float, events_keepalive_s: float, max_event_streams: int) -> None:
    def visible_rows(grant: Grant) -> list[dict[str, Any]]:
        """Every row for `read`; an invoke-only token sees its workflows. Runner endpoints only
        for `admin`."""
        rows = list_workflows()
        if not grant.has(READ):
            rows = [row for row in rows if grant.allows(str(row.get("namespace")), str(row.get("name")))]
        if not grant.has(ADMIN):
            rows = [_without_runner_urls(row) for row in rows]
        return rows

    @app.get("/workflows")
    async def workflows(request: Request) -> JSONResponse:
        return JSONResponse(visible_rows(_grant(request)))

    _add_workflow_events(app, visible_rows, poll_s=events_poll_s, keepalive_s=events_keepalive_s,
                         max_streams=max_event_streams)

    # GET /calls: this process's last calls (plnt up with workers: every process's, calls.CallsHub).
    app.state.call_rows = gateway.calls.rows

    @app.get("/calls")
    async def calls(limit: int = 50) -> JSONResponse:
        return JSONResponse(app.state.call_rows(max(0, min(limit, MAX_CALLS_LIMIT))))

    _add_runner_stats(app, gateway)

    @app.get("/healthz")
    async def healthz() -> Any:
        if health is None:
            return {"status": "ok"}
        code, body = health()
        # Not ready yet (a plnt gateway before its first route table): when to ask again.
        return JSONResponse(body, status_code=code, headers=_HEALTH_RETRY_AFTER if code == 503 else None)

    # plnt up with gateway workers replaces it with the sum over its processes (workers.WorkerMetrics).
    app.state.render_metrics = gateway.metrics.render

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(app.state.render_metrics(), media_type=gateway.metrics.content_type)

    @app.get("/usage")
    async def usage(request: Request) -> JSONResponse:
        return JSONResponse(usage_body(app.state.render_metrics(), gateway.router.table.policy, _grant(request),
                                       gateway.tokens.enabled))

    _add_models(app, gateway.router)


def usage_body(metrics_text: bytes, policy: GatewayPolicySpec | None, grant: Grant, tokens_enabled: bool) -> dict[str, Any]:
    """`GET /usage`: per token name, namespace and workflow the requests, prompt and completion tokens and
    cost since the gateway processes started (the sum over plnt up's processes, as /metrics), and the
    GatewayPolicy's limits. An admin token (or an open gateway) sees every token; others their own name."""
    rows, limits = usage_rows(metrics_text), limits_rows(policy)
    if tokens_enabled and not grant.has(ADMIN):
        rows = [row for row in rows if row["token"] == grant.label]
        limits = [row for row in limits if row["token"] in (grant.label, "*")]
    return {"currency": policy.currency if policy is not None else None, "usage": rows, "limits": limits}


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def _grant(request: Request) -> Grant:
    return request.scope.get("plnt.grant", ALL)


def _without_runner_urls(row: dict[str, Any]) -> dict[str, Any]:
    """A status row for callers who do not need runner addresses (they go through the gateway)."""
    endpoint = row.get("endpoint")
    clean = {key: value for key, value in row.items() if key != "endpoint"}
    for key in ("message", "lastError"):
        text = clean.get(key)
        if isinstance(text, str):
            if isinstance(endpoint, str) and endpoint:
                text = text.replace(endpoint, "<runner>")
            clean[key] = _RUNNER_URL.sub("<runner>", text)
    return clean


class _WorkflowEvents(Response):
    """The body of one `GET /workflows/events` stream (see _add_workflow_events): sent until the
    client hangs up; `release` runs whatever ends it."""

    def __init__(self, rows_json: Callable[[], bytes], poll_s: float, keepalive_s: float,
                 release: Callable[[], None], stopping: Callable[[], bool]) -> None:
        super().__init__(media_type="text/event-stream")
        self.rows_json, self.poll_s, self.keepalive_s, self.release = rows_json, poll_s, keepalive_s, release
        self.stopping = stopping  # the server is shutting down: end the stream (within poll_s)

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8"),
                                    (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]})
            last: bytes | None = None
            quiet_since = time.monotonic()
            while not gone.is_set() and not self.stopping():
                body = self.rows_json()
                now = time.monotonic()
                if body != last:
                    last, quiet_since = body, now
                    await send({"type": "http.response.body", "body": b"event: workflows\ndata: " + body + b"\n\n",
                                "more_body": True})
                elif now - quiet_since >= self.keepalive_s:
                    quiet_since = now
                    await send({"type": "http.response.body", "body": b": keepalive\n\n", "more_body": True})
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await gone.wait()
            if not gone.is_set():  # the server stops: end the response properly (the UI reconnects)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the connection broke while sending
        finally:
            watcher.cancel()
            self.release()


def _add_workflow_events(app: FastAPI, visible_rows: Callable[[Grant], list[dict[str, Any]]], *, poll_s: float,
                         keepalive_s: float, max_streams: int) -> None:
    """`GET /workflows/events`: `event: workflows` with `{"workflows": rows}` (the rows of GET /workflows
    for this token) on connect and whenever they change (checked every `poll_s`, sent only on change),
    `: keepalive` every `keepalive_s`; at most `max_streams` at once per process (then 503). A FastAPI
    route: the invoke and chat hot paths are answered before FastAPI and never see it."""
    open_streams = [0]
    # One body per token's view and poll, however many streams (UI tabs) show it: at 1,000
    # workflows the rows' JSON is the cost, not the sending.
    made: dict[Grant, tuple[float, bytes]] = {}

    def rows_json(grant: Grant) -> bytes:
        now = time.monotonic()
        last = made.get(grant)
        if last is not None and now - last[0] < poll_s / 2:
            return last[1]
        if len(made) > 2 * max_streams:  # grants of streams long gone
            made.clear()
        body = oai.dumps({"workflows": visible_rows(grant)})
        made[grant] = (now, body)
        return body

    def release() -> None:
        open_streams[0] -= 1

    @app.get("/workflows/events")
    async def workflow_events(request: Request) -> Response:
        if open_streams[0] >= max_streams:
            return _error(503, "too_many_streams", f"this gateway process already serves {max_streams} event "
                          "streams; retry later, or poll GET /workflows", {"retry-after": "5"})
        grant = _grant(request)
        open_streams[0] += 1  # released when the stream ends (_WorkflowEvents.__call__)
        return _WorkflowEvents(lambda: rows_json(grant), poll_s, keepalive_s, release,
                               lambda: getattr(app.state, "stopping", False))

    app.state.open_event_streams = lambda: open_streams[0]


def _add_runner_stats(app: FastAPI, gateway: Gateway) -> None:
    router = gateway.router

    @app.get("/workflows/{name}/stats")
    async def workflow_stats(name: str, request: Request, namespace: str | None = None) -> JSONResponse:
        """The runners' own `GET /stats` (step cache and the like), per backend."""
        try:
            route = router.table.lookup(name, namespace)
        except AmbiguousRoute as exc:
            return _error(409, "ambiguous", f"{exc}")
        if route is None:
            return _error(404, "not_found", f"no workflow named {name}")
        backends: list[tuple[Backend, str]] = [(b, "stable") for b in route.stable_replicas]
        if route.canary is not None:
            backends.append((route.canary, "canary"))
        client = gateway.client
        assert client is not None
        admin = _grant(request).has(ADMIN)

        async def one(backend: Backend, track: str) -> dict[str, Any]:
            item: dict[str, Any] = {"version": backend.version, "track": track}
            if admin:
                item["endpoint"] = backend.endpoint
            try:
                response = await client.request(backend.endpoint, "GET", "/stats")
                item["status"] = response.status
                item["stats"] = json.loads(response.body) if response.status == 200 else None
            except (UpstreamError, ValueError, RecursionError) as exc:
                item["status"] = None
                item["error"] = str(exc) or type(exc).__name__
                if not admin:
                    item["error"] = _RUNNER_URL.sub("<runner>", item["error"]).replace(backend.endpoint, "<runner>")
            return item

        items = await asyncio.gather(*(one(b, t) for b, t in backends))
        return JSONResponse({"namespace": route.namespace, "name": name, "backends": items})


def _add_models(app: FastAPI, router: Router) -> None:
    """`GET /v1/models` and `GET /v1/models/{model}`: the models (workflows and ModelDeployments) this
    token may chat with, named as /v1/chat/completions takes them."""

    def visible_models(grant: Grant) -> list[tuple[str, str]]:
        # Previews are no models of their own: they answer a model's name with X-Plnt-Preview.
        routes = [r for r in router.table if r.stable is not None and grant.allows(r.namespace, r.name)
                  and preview_of(r.name) is None]
        counts: dict[str, int] = {}
        for r in router.table:
            counts[r.name] = counts.get(r.name, 0) + 1
        return sorted((r.name if counts[r.name] == 1 else f"{r.namespace}/{r.name}", r.namespace) for r in routes)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        return Response(oai.models_body(visible_models(_grant(request))), media_type="application/json")

    @app.get("/v1/models/{model:path}")
    async def model(model: str, request: Request) -> Response:
        for model_id, owner in visible_models(_grant(request)):
            if model_id == model or f"{owner}/{model_id}" == model:
                return Response(oai.dumps(oai.model_obj(model_id, owner)), media_type="application/json")
        return Response(
            oai.error_body(f"The model `{model}` does not exist", "invalid_request_error", "model", "model_not_found"),
            status_code=404, media_type="application/json",
        )
