"""The gateway's HTTP API: one front door for every workflow's runners.

`POST /workflows/{name}/invoke` is proxied to the runner chosen by the `Router`; the
reconciler swaps the router's table live, so this module never caches routes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from .routes import AmbiguousRoute, Backend, Route, RouteNotReady, Router, RouteTable, Track

# Close idle connections to runners before uvicorn does (its keep-alive timeout is 5 s):
# reusing a connection the server is closing at that very moment fails the request.
_KEEPALIVE_EXPIRY_S = 2.0
# Loopback connects either succeed at once or are refused; a long connect wait only
# delays the 502.
_MAX_CONNECT_TIMEOUT_S = 5.0


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


def create_app(
    router: Router,
    *,
    list_workflows: Callable[[], list[dict[str, Any]]],
    on_git_hook: Callable[[], Awaitable[None]] | None = None,
    request_timeout_s: float = 60.0,
) -> FastAPI:
    """Build the gateway app. The shared httpx client lives in the app lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        timeout = httpx.Timeout(request_timeout_s, connect=min(request_timeout_s, _MAX_CONNECT_TIMEOUT_S))
        # trust_env=False: runners are on 127.0.0.1; an HTTP(S)_PROXY from the environment
        # must never capture that traffic.
        async with httpx.AsyncClient(
            timeout=timeout,
            trust_env=False,
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=_KEEPALIVE_EXPIRY_S),
        ) as client:
            app.state.http = client
            yield

    app = FastAPI(title="plnt gateway", lifespan=lifespan)

    @app.post("/workflows/{name}/invoke")
    async def invoke(name: str, request: Request, namespace: str | None = None) -> Response:
        # Raw bytes both ways: the gateway neither re-parses nor re-serialises the payload,
        # so runner bodies (including their error bodies) arrive exactly as sent.
        # Read before routing, so no await separates choosing a runner from counting it.
        body = await request.body()
        content_type = request.headers.get("content-type", "application/json")
        client: httpx.AsyncClient = request.app.state.http

        async def send(backend: Backend) -> httpx.Response:
            # Counted from the choice on, so Router.drain never misses this request.
            with router.in_flight(backend):
                return await client.post(
                    f"{backend.endpoint}/invoke", content=body, headers={"content-type": content_type}
                )

        table = router.table  # one snapshot for the whole request
        try:
            route = table.lookup(name, namespace)
        except AmbiguousRoute as exc:
            return _error(
                409,
                "ambiguous",
                f"workflow {name!r} exists in namespaces {', '.join(exc.namespaces)}; "
                f"add ?namespace=<one of them>",
            )
        if route is None:
            where = f" in namespace {namespace}" if namespace is not None else ""
            return _error(404, "not_found", f"no workflow named {name}{where}; GET /workflows lists them")
        try:
            backend, track = router.choose(route)
        except RouteNotReady:
            return _error(
                503,
                "not_ready",
                f"workflow {route.namespace}/{name} has no promoted release yet",
                headers={"Retry-After": "5"},
            )

        try:
            try:
                upstream = await send(backend)
            except httpx.ConnectError:
                # Refused connect: nothing reached the runner, so retrying cannot run the
                # workflow twice. Typical cause: a promotion or rollback replaced this runner
                # between our lookup and the connect; the new table has the new one.
                retry = _rechoose(router, table, route, name, backend)
                if retry is None:
                    raise
                backend, track = retry
                upstream = await send(backend)
        except httpx.ConnectError:
            return _error(
                502,
                "upstream_unavailable",
                f"runner {backend.version} of workflow {route.namespace}/{name} is unreachable at {backend.endpoint}",
            )
        except httpx.TimeoutException:
            return _error(
                504,
                "upstream_timeout",
                f"runner {backend.version} of workflow {route.namespace}/{name} did not answer "
                f"within {request_timeout_s:g}s",
            )
        except httpx.TransportError as exc:
            # The connection broke mid-exchange; the runner may have done the work, so no retry.
            return _error(
                502,
                "upstream_error",
                f"runner {backend.version} of workflow {route.namespace}/{name} failed: {type(exc).__name__}",
            )

        headers = {"x-plnt-version": backend.version, "x-plnt-track": track}
        return Response(
            content=upstream.content,
            status_code=upstream.status_code,
            headers=headers,
            media_type=upstream.headers.get("content-type", "application/json"),
        )

    @app.get("/workflows")
    async def workflows() -> JSONResponse:
        return JSONResponse(list_workflows())

    @app.post("/hooks/git", status_code=202)
    async def git_hook() -> JSONResponse:
        if on_git_hook is None:
            return _error(404, "not_found", "git hook is not enabled on this gateway")
        await on_git_hook()
        return JSONResponse({"accepted": True}, status_code=202)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _rechoose(
    router: Router, used: RouteTable, route: Route, name: str, failed: Backend
) -> tuple[Backend, Track] | None:
    """Backend to retry on after a refused connect, or None if nothing changed.

    Only a table swap since the request started justifies a retry; a dead runner in an
    unchanged table is reported (502) rather than hidden.
    """
    current = router.table
    if current is used:
        return None
    try:
        fresh = current.lookup(name, route.namespace)
        if fresh is None:
            return None
        backend, track = router.choose(fresh)
    except (AmbiguousRoute, RouteNotReady):
        return None
    if backend == failed:
        return None
    return backend, track
