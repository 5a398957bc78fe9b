"""The gateway's HTTP API: one front door for every workflow's runners.

Hot paths, served by plain ASGI handlers in front of FastAPI (measured: FastAPI's routing,
dependency solving and Request/Response objects cost ~130 us of CPU per request on this
project's machine, more than the whole proxy hop; see bench/gateway_overhead.py):

- `POST /workflows/{name}/invoke[?namespace=NS]`: JSON in, JSON out, or the runner's SSE stream
  passed through as it arrives (invoke.py).
- `POST /v1/chat/completions`: OpenAI chat completions (model = workflow name), translated to
  the runner's `POST /chat` (chat.py, openai_compat.py).

Both go through forward.py (token, body, backend choice, the hop to the runner and its retries,
metrics and tracing) and relay.py (the answer back), and take `X-Plnt-Preview: N` (the preview of pull request N) and
`X-Plnt-Track: stable|canary` (that track while a canary runs: 409 `no_canary` when none does, 400
for another value).

- `POST /hooks/git`: needs the raw body for the forge's signature and no bearer token
  when signed (hooks.GitHook).

FastAPI serves the rest (read_api.py: `GET /v1/models`, `GET /workflows`, `GET /workflows/events`,
`GET /workflows/{name}/stats`, `GET /calls`, `GET /metrics`, `GET /healthz`; and whatever `plnt up`
adds), after the token and scope check in `GatewayApp.__call__` (auth.required_scope: unlisted paths
need `admin`).

Errors (gateway-made; runner errors pass through with the runner's status and body):
  401 missing/unknown bearer token (`WWW-Authenticate: Bearer`), 403 token not allowed for the
  workflow, 404 unknown workflow, 409 name in several namespaces (invoke), 413 body over
  `max_body_bytes`, 415 body not sent as JSON (`Content-Type`), 421 foreign Host on an open
  loopback gateway, 422 malformed or too deeply nested JSON naming line/column (invoke; chat
  answers 400 as OpenAI does), 502 runner unreachable or broke mid-exchange, 503 nothing
  promoted yet, 504 runner silent for `request_timeout_s`. Invoke errors are
  `{"error": {"type", "message"}}`; /v1 errors are OpenAI's `{"error": {"message", "type", "param",
  "code"}}` (replies.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from plnt.core.auth import (
    FOREIGN_HOST_MESSAGE,
    OPEN_PATHS,
    TokenSet,
    host_allowed,
    is_ui_path,
    missing_scope_message,
    open_gateway_hosts,
    required_scope,
)
from plnt.core.upstream import UpstreamClient
from plnt.gateway import openai_compat as oai
from plnt.gateway.chat import chat
from plnt.gateway.forward import Gateway, Wake
from plnt.gateway.hooks import GitHook
from plnt.gateway.invoke import invoke
from plnt.gateway.metrics import GatewayMetrics
from plnt.gateway.quotas import Quotas
from plnt.gateway.read_api import Health, ListWorkflows, add_read_api
from plnt.gateway.replies import OPENAI, PLNT, ASGIScope, Receive, Send, plnt_error, respond
from plnt.gateway.router import Router
from plnt.gateway.ui import mount_ui

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Close idle connections to runners before uvicorn does (its keep-alive timeout is 5 s):
# reusing a connection the server is closing at that very moment fails the request.
_KEEPALIVE_EXPIRY_S = 2.0
# Loopback connects either succeed at once or are refused; a long connect wait only
# delays the 502.
_MAX_CONNECT_TIMEOUT_S = 5.0

_FOREIGN_HOST = oai.dumps({"error": {"type": "misdirected_request", "message": (
    f"{FOREIGN_HOST_MESSAGE}; configure tokens (--tokens-file) to serve other names")}})


class GatewayApp(FastAPI):
    """FastAPI with the two hot paths answered before FastAPI's routing (see module docstring),
    and bearer-token checks in front of every route but the probes (`/healthz`, `/readyz`)."""

    gateway: Gateway
    git_hook: GitHook

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            gateway = self.gateway
            if gateway.allowed_hosts is not None and not host_allowed(scope["headers"], gateway.allowed_hosts):
                await respond(send, 421, _FOREIGN_HOST, [])
                return
            path: str = scope["path"]
            if scope["method"] == "POST":
                if path.startswith("/workflows/") and path.endswith("/invoke"):
                    name = path[11:-7]
                    if name and "/" not in name:
                        await invoke(gateway, scope, receive, send, name)
                        return
                elif path == "/v1/chat/completions":
                    await chat(gateway, scope, receive, send)
                    return
                elif path == "/hooks/git":
                    await self.git_hook(scope, receive, send)
                    return
            # /internal/ paths check their own token (the internal one), open gateway or not.
            # The UI's shell (static, no data) is open too; its data calls carry a token (gateway/ui.py).
            if (gateway.tokens.enabled and path not in OPEN_PATHS and not path.startswith("/internal/")
                    and not is_ui_path(path)):
                authorization = None
                for key, value in scope["headers"]:
                    if key == b"authorization":
                        authorization = value
                        break
                grant = gateway.tokens.check_header(authorization)
                if grant is None:
                    reply = (OPENAI if path.startswith("/v1/") else PLNT).unauthorized(authorization is not None)
                    await respond(send, reply.status, reply.body, reply.headers)
                    return
                needed = required_scope(path)
                if needed is not None and not grant.has(needed):
                    reply = plnt_error(403, "forbidden", missing_scope_message(needed, f"{scope['method']} {path}"))
                    await respond(send, reply.status, reply.body, reply.headers)
                    return
                scope["plnt.grant"] = grant
        await super().__call__(scope, receive, send)


def create_app(
    router: Router,
    *,
    list_workflows: ListWorkflows,
    on_git_hook: Callable[[], Awaitable[None]] | None = None,
    request_timeout_s: float = 60.0,
    tokens: TokenSet | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    connect_timeout_s: float = _MAX_CONNECT_TIMEOUT_S,
    max_connections_per_runner: int = 256,
    webhook_secret: bytes | None = None,
    host: str = "127.0.0.1",
    health: Health | None = None,
    wake: Wake | None = None,
    events_poll_s: float = 0.5,
    events_keepalive_s: float = 15.0,
    max_event_streams: int = 64,
    gateway_processes: int = 1,
) -> GatewayApp:
    """Build the gateway app. The runner client lives in the app lifespan.

    `tokens`: None or empty runs the gateway open (callers decide whether that is allowed,
    see auth.exposure_problem). `request_timeout_s`: longest silence from a runner (no byte)
    before 504; for streams, between two chunks. `webhook_secret`: POST /hooks/git needs a
    forge signature made with it (see hooks.py). `host`: the address served on; an open
    gateway on a loopback address answers only loopback Host names (DNS rebinding).
    `health`: (status code, body) of `GET /healthz` (the gateway role answers 503 until it has a
    route table); default 200 `{"status": "ok"}`. `wake(namespace, name, release_id)`: start a
    parked runner (scale to zero) again; its endpoint, or None when that release did not park.
    `gateway_processes`: how many processes serve this gateway's port; each enforces that share of the
    GatewayPolicy's limits (quotas.py).
    """
    tokens = tokens or TokenSet()
    gateway = Gateway(
        router,
        tokens=tokens,
        metrics=GatewayMetrics(),
        request_timeout_s=request_timeout_s,
        max_body_bytes=max_body_bytes,
        allowed_hosts=open_gateway_hosts(host, tokens),
        wake=wake,
        quotas=Quotas(1 / max(1, gateway_processes)),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = UpstreamClient(
            read_timeout_s=request_timeout_s,
            connect_timeout_s=min(request_timeout_s, connect_timeout_s),
            max_connections=max_connections_per_runner,
            keepalive_expiry_s=_KEEPALIVE_EXPIRY_S,
        )
        gateway.client = client
        app.state.http = client
        try:
            yield
        finally:
            gateway.client = None
            await client.aclose()

    app = GatewayApp(title="plnt gateway", lifespan=lifespan)
    app.gateway = gateway
    app.git_hook = GitHook(on_git_hook, webhook_secret, tokens, max_body_bytes)
    mount_ui(app)  # GET /ui: the web UI (gateway/ui.py)
    app.state.metrics = gateway.metrics
    add_read_api(app, gateway, list_workflows=list_workflows, health=health, events_poll_s=events_poll_s,
                 events_keepalive_s=events_keepalive_s, max_event_streams=max_event_streams)
    return app


__all__ = ["DEFAULT_MAX_BODY_BYTES", "Gateway", "GatewayApp", "create_app"]
