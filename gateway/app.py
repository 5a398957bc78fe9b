"""The gateway's HTTP API: one front door for every workflow's runners.

Hot paths, served by plain ASGI handlers in front of FastAPI (measured: FastAPI's routing,
dependency solving and Request/Response objects cost ~130 us of CPU per request on this
project's machine, more than the whole proxy hop; see bench/gateway_overhead.py):

- `POST /workflows/{name}/invoke[?namespace=NS]`: JSON in, JSON out, body passed to the
  runner's `POST /invoke` byte for byte. With `Accept: text/event-stream` the runner's SSE
  stream is passed through chunk by chunk as it arrives (no buffering, `X-Accel-Buffering: no`).
- `POST /v1/chat/completions`: OpenAI chat completions (model = workflow name), translated to
  the runner's `POST /chat`; see openai_compat.py.

Both take `X-Plnt-Preview: N` (the preview of pull request N) and `X-Plnt-Track: stable|canary` (that
track while a canary runs: 409 `no_canary` when none does, 400 for another value).

- `POST /hooks/git`: needs the raw body for the forge's signature and no bearer token
  when signed (see `Gateway.git_hook`, hooks.py).

FastAPI serves the rest: `GET /v1/models`, `GET /workflows`, `GET /workflows/events` (the rows as
Server-Sent Events), `GET /workflows/{name}/stats`, `GET /calls` (the last calls, calls.py),
`GET /metrics`, `GET /healthz` (and whatever `plnt up` adds), after the token and scope check
in `GatewayApp.__call__` (auth.required_scope: unlisted paths need `admin`).

Errors (gateway-made; runner errors pass through with the runner's status and body):
  401 missing/unknown bearer token (`WWW-Authenticate: Bearer`), 403 token not allowed for the
  workflow, 404 unknown workflow, 409 name in several namespaces (invoke), 413 body over
  `max_body_bytes`, 415 body not sent as JSON (`Content-Type`), 421 foreign Host on an open
  loopback gateway, 422 malformed or too deeply nested JSON naming line/column (invoke; chat
  answers 400 as OpenAI does), 502 runner unreachable or broke mid-exchange, 503 nothing
  promoted yet, 504 runner
  silent for `request_timeout_s`. Invoke errors are `{"error": {"type", "message"}}`; /v1
  errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`.

Retries: a refused connect (nothing reached the runner) is retried once: on the new route
table if it was swapped since the request looked (a promotion replaced the runner), else on
another stable replica, else (scale to zero) on the same release once `wake` started its parked
runner again; concurrent requests for one parked release share one wake. Any other failure is not
retried: the runner may have done the work.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from plnt.core import limits as json_limits
from plnt.core import telemetry
from plnt.core.auth import (
    ADMIN,
    ALL,
    FOREIGN_HOST_MESSAGE,
    INVOKE,
    MODELS,
    OPEN_PATHS,
    READ,
    Grant,
    TokenSet,
    host_allowed,
    is_json_media,
    is_loopback_host,
    is_ui_path,
    missing_scope_message,
    open_gateway_hosts,
    required_scope,
)
from plnt.core.routes import (
    PREVIEW_HEADER,
    TRACK_HEADER,
    AmbiguousRoute,
    Backend,
    BadTrack,
    NoCanary,
    PreviewNotFound,
    Route,
    RouteNotReady,
    RouteTable,
    Track,
    forced_track,
    preview_of,
    preview_target,
)
from plnt.core.upstream import UpstreamClient, UpstreamConnectError, UpstreamError, UpstreamResponse, UpstreamTimeout
from plnt.gateway import hooks
from plnt.gateway import openai_compat as oai
from plnt.gateway.calls import MAX_LIMIT as MAX_CALLS_LIMIT
from plnt.gateway.calls import CallLog
from plnt.gateway.metrics import GatewayMetrics
from plnt.gateway.router import Router
from plnt.gateway.sse import COMMENT, SSEParser
from plnt.gateway.ui import mount_ui

log = logging.getLogger("plnt.gateway")

DEFAULT_MAX_BODY_BYTES = 1024 * 1024
# Close idle connections to runners before uvicorn does (its keep-alive timeout is 5 s):
# reusing a connection the server is closing at that very moment fails the request.
_KEEPALIVE_EXPIRY_S = 2.0
# Loopback connects either succeed at once or are refused; a long connect wait only
# delays the 502.
_MAX_CONNECT_TIMEOUT_S = 5.0

ASGIScope = dict[str, Any]
Wake = Callable[[str, str, str], Awaitable[str | None]]  # (namespace, name, release id) -> endpoint or None
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = b"application/json"
# Runner addresses as the drivers make them (loopback processes, Kubernetes services).
_RUNNER_URL = re.compile(r"https?://(?:127(?:\.\d{1,3}){3}|localhost|\[::1\]|[\w.-]+\.svc(?:\.cluster\.local)?)(?::\d+)?")
_SSE = b"text/event-stream"
_SPAN_NAMES = {"invoke": "POST /workflows/{name}/invoke", "chat": "POST /v1/chat/completions"}
_NO_LABELS = ("", "", "", "")


# The 500 bodies, made once: encoding them on every request cost ~2% of a gateway's CPU (py-spy,
# bench/gateway_workers.py --profile).
_INTERNAL_INVOKE = oai.dumps({"error": {"type": "internal", "message": "gateway error"}})
_INTERNAL_CHAT = oai.error_body("gateway error", "server_error", None, "internal")


def _unsupported_type(content_type: bytes | None) -> str:
    got = content_type.decode("latin-1") if content_type is not None else "no Content-Type"
    return f"send the body as JSON with 'Content-Type: application/json' (got {got})"


def _error(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


class _BodyTooLarge(Exception):
    def __init__(self, declared: int | None = None) -> None:
        self.declared = declared

    def headers(self, limit: int) -> list[tuple[bytes, bytes]]:
        # Answered before the body is read: uvicorn reads and discards the rest of it after
        # the response (closing with unread data would reset the connection, and the client
        # could lose the 413). Only an absurd declared size gets the connection closed.
        if self.declared is not None and self.declared > 8 * limit:
            return [(b"connection", b"close")]
        return []


class _ClientGone(Exception):
    pass


class _Reply(Exception):
    """Raised inside a handler to answer with an error right away."""

    def __init__(self, status: int, body: bytes, error_type: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self.status = status
        self.body = body
        self.error_type = error_type
        self.headers = headers or []


class _Outcome:
    """What the metrics record about one request."""

    __slots__ = ("code", "error_type", "labels", "span", "started", "ttft")

    def __init__(self) -> None:
        self.labels: tuple[str, str, str, str] = _NO_LABELS
        self.code = 500
        self.error_type: str | None = None
        self.ttft: float | None = None
        self.started = False  # response headers sent
        self.span: Any = None  # the request's trace span, only when tracing is on (telemetry.ENABLED)


async def _read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            declared = 0  # uvicorn already rejects a malformed Content-Length
        if declared > limit:
            raise _BodyTooLarge(declared)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise _ClientGone
    body = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise _BodyTooLarge
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def _respond(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], content_type: bytes = _JSON) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _plnt_error(status: int, kind: str, message: str, headers: list[tuple[bytes, bytes]] | None = None, **extra: Any) -> _Reply:
    return _Reply(status, oai.dumps({"error": {"type": kind, "message": message, **extra}}), kind, headers)


def _openai_error(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> _Reply:
    return _Reply(status, oai.error_body(message, type_, param, code), code or type_, headers)


def _json_position(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"


def _runner_error_type(body: bytes) -> str:
    try:
        error = json.loads(body).get("error")
        kind = error.get("type") if isinstance(error, dict) else None
    except (ValueError, AttributeError, RecursionError):
        kind = None
    return kind if isinstance(kind, str) and kind else "runner_error"


def _at_event_boundary(chunk: bytes) -> bool:
    return chunk.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


class Gateway:
    """State and hot-path handlers of one gateway app."""

    def __init__(
        self,
        router: Router,
        *,
        tokens: TokenSet,
        metrics: GatewayMetrics,
        request_timeout_s: float,
        connect_timeout_s: float,
        max_body_bytes: int,
        max_connections_per_runner: int,
        on_git_hook: Callable[[], Awaitable[None]] | None = None,
        webhook_secret: bytes | None = None,
        allowed_hosts: frozenset[bytes] | None = None,
        wake: Wake | None = None,
    ) -> None:
        self.router = router
        self.wake = wake
        self._waking: dict[str, asyncio.Future[str | None]] = {}  # release id -> the wake in progress
        self.on_git_hook = on_git_hook
        self.webhook_secret = webhook_secret
        self.allowed_hosts = allowed_hosts  # open loopback mode: the Host names it answers
        self.tokens = tokens
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_body_bytes = max_body_bytes
        self.max_connections_per_runner = max_connections_per_runner
        self.client: UpstreamClient | None = None  # created in the app's lifespan (needs the loop)
        self.calls = CallLog()  # GET /calls: the last calls, no body, no token (calls.py)

    # --- shared steps -----------------------------------------------------------------------

    def _unauthorized(self, presented: bool, openai: bool) -> _Reply:
        challenge = b'Bearer realm="plnt"' + (b', error="invalid_token"' if presented else b"")
        headers = [(b"www-authenticate", challenge)]
        message = "invalid bearer token" if presented else "missing bearer token: send 'Authorization: Bearer TOKEN'"
        if openai:
            return _openai_error(401, message, "invalid_request_error", None, "invalid_api_key", headers)
        return _plnt_error(401, "unauthorized", message, headers)

    def _open(
        self, table: RouteTable, route: Route, name: str, backend: Backend, failed: Backend
    ) -> tuple[Backend, Track] | None:
        """Where to retry after `failed` refused the connection, or None."""
        router = self.router
        current = router.table
        if current is not table:
            # A promotion or rollback swapped the table since this request looked: the new
            # table has the runner that replaced the refusing one.
            try:
                fresh = current.lookup(name, route.namespace)
                if fresh is None:
                    return None
                candidate, track = router.choose(fresh)
            except (AmbiguousRoute, RouteNotReady):
                return None
            if candidate.endpoint != failed.endpoint:
                return candidate, track
            other = router.fallback(fresh, failed)
            return (other, "stable") if other is not None else None
        other = router.fallback(route, failed)
        return (other, "stable") if other is not None else None

    async def _exchange(
        self,
        table: RouteTable,
        route: Route,
        name: str,
        backend: Backend,
        track: Track,
        path: str,
        body: bytes,
        headers: list[tuple[str, str]],
        stream: bool,
        openai: bool,
    ) -> tuple[UpstreamResponse, Backend, Track]:
        """Send to the runner, retrying a refused connect once. On return `backend` is counted
        in flight (the caller must `router.leave` it); on error it is not."""
        client = self.client
        assert client is not None
        router = self.router
        router.enter(backend)
        try:
            response = await client.request(backend.endpoint, "POST", path, body=body, headers=headers, stream=stream)
        except UpstreamConnectError as exc:
            router.leave(backend)
            retry = self._open(table, route, name, backend, backend)
            woke = False
            if retry is None and self.wake is not None:
                retry = await self._woken(route, backend, track)
                woke = retry is not None
            if retry is None:
                raise self._upstream_reply(exc, route, name, backend, openai) from None
            if not woke:
                self.metrics.retried(route.namespace, name)
            log.info("%s workflow=%s/%s from=%s to=%s", "retry-on-woken-runner" if woke else "retry-on-replica",
                     route.namespace, name, backend.endpoint, retry[0].endpoint)
            backend, track = retry
            router.enter(backend)
            try:
                response = await client.request(backend.endpoint, "POST", path, body=body, headers=headers, stream=stream)
            except UpstreamError as exc2:
                router.leave(backend)
                raise self._upstream_reply(exc2, route, name, backend, openai) from None
            except BaseException:
                router.leave(backend)
                raise
        except UpstreamError as exc:
            router.leave(backend)
            raise self._upstream_reply(exc, route, name, backend, openai) from None
        except BaseException:
            router.leave(backend)
            raise
        return response, backend, track

    async def _woken(self, route: Route, backend: Backend, track: Track) -> tuple[Backend, Track] | None:
        """`backend` refused the connection: if its runner parked (scale to zero), start it again
        and answer where it now listens; None if it did not park or cannot start."""
        waking = self._waking.get(backend.release_id)
        if waking is None:
            waking = self._waking[backend.release_id] = asyncio.ensure_future(self._wake(route, backend))
            waking.add_done_callback(lambda done: (self._waking.pop(backend.release_id, None),
                                                   done.cancelled() or done.exception()))  # retrieved: logged in _wake
        try:
            endpoint = await asyncio.shield(waking)  # one request giving up does not cancel the others' wake
        except Exception:  # noqa: BLE001 - logged in _wake; the request gets the refused connect's 502
            return None
        if endpoint is None:
            return None
        return Backend(endpoint=endpoint, version=backend.version, release_id=backend.release_id), track

    async def _wake(self, route: Route, backend: Backend) -> str | None:
        assert self.wake is not None
        try:
            async with asyncio.timeout(self.request_timeout_s):
                endpoint = await self.wake(route.namespace, route.name, backend.release_id)
        except Exception as exc:
            log.warning("runner-wake-failed workflow=%s/%s release=%s: %s", route.namespace, route.name,
                        backend.release_id, exc or type(exc).__name__)
            raise
        if endpoint is not None:
            self.metrics.woke(route.namespace, route.name)
        return endpoint

    def _upstream_reply(self, exc: UpstreamError, route: Route, name: str, backend: Backend, openai: bool) -> _Reply:
        who = f"runner {backend.version} of workflow {route.namespace}/{name}"
        if isinstance(exc, UpstreamConnectError):
            status, kind, message = 502, "upstream_unavailable", f"{who} is unreachable at {backend.endpoint}"
        elif isinstance(exc, UpstreamTimeout):
            status, kind, message = 504, "upstream_timeout", f"{who} did not answer within {self.request_timeout_s:g}s"
        else:
            status, kind, message = 502, "upstream_error", f"{who} failed: {exc}"
        log.debug("upstream-failed %s: %s", who, exc)
        if openai:
            return _openai_error(status, message, "server_error", None, kind)
        return _plnt_error(status, kind, message)

    @staticmethod
    async def _watch_disconnect(receive: Receive, response: UpstreamResponse, gone: list[bool]) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                gone.append(True)
                response.close()  # the runner sees the hang-up and can stop working
                return

    # --- POST /workflows/{name}/invoke --------------------------------------------------------

    async def invoke(self, scope: ASGIScope, receive: Receive, send: Send, name: str) -> None:
        await self._measured("invoke", send, _INTERNAL_INVOKE, lambda t0, outcome: self._invoke(scope, receive, send, name, t0, outcome),
                             scope)

    async def _measured(self, api: str, send: Send, internal_error: bytes,
                        handle: Callable[[float, _Outcome], Awaitable[None]], scope: ASGIScope) -> None:
        """One fast-path request: errors become answers (unless the answer already started), and
        every request ends in the metrics with its outcome."""
        t0 = time.perf_counter()
        self.metrics.started(api)
        outcome = _Outcome()
        if telemetry.ENABLED:  # off: this one check is all tracing costs a request
            outcome.span = telemetry.start_span(_SPAN_NAMES[api], {"http.request.method": "POST"},
                                                parent=telemetry.scope_parent(scope["headers"]), kind="server")
        try:
            await handle(t0, outcome)
        except _Reply as reply:
            outcome.code, outcome.error_type = reply.status, reply.error_type
            if not outcome.started:
                await _respond(send, reply.status, reply.body, reply.headers)
        except _ClientGone:
            outcome.code, outcome.error_type = 499, "client_disconnected"
        except Exception:
            log.exception("%s-failed", api)
            outcome.code, outcome.error_type = 500, "internal"
            if not outcome.started:
                await _respond(send, 500, internal_error, [])
        finally:
            elapsed = time.perf_counter() - t0
            self.metrics.finished(api, outcome.labels, outcome.code, elapsed, outcome.error_type, outcome.ttft)
            self.calls.add(api, outcome.labels, outcome.code, elapsed, outcome.error_type)
            if outcome.span is not None:
                telemetry.end_request(outcome.span, outcome.code, outcome.error_type, outcome.labels, outcome.ttft)

    def _forced(self, route: Route, header: bytes, *, openai: bool) -> tuple[Backend, Track]:
        """The backend of the track X-Plnt-Track names: 400 for another value, 409 `no_canary`
        when it names a canary and none is under test."""
        try:
            return self.router.choose_track(route, forced_track(header) or "stable")
        except BadTrack as exc:
            if openai:
                raise _openai_error(400, str(exc), "invalid_request_error", None, "invalid_track") from None
            raise _plnt_error(400, "invalid_track", str(exc)) from None
        except NoCanary as exc:
            if openai:
                raise _openai_error(409, str(exc), "no_canary", "model", "no_canary") from None
            raise _plnt_error(409, "no_canary", str(exc)) from None

    def _grant(self, authorization: bytes | None, *, openai: bool) -> Grant:
        """What the request's bearer token may use (everything when no tokens are configured)."""
        if not self.tokens.enabled:
            return ALL
        found = self.tokens.check_header(authorization)
        if found is None:
            raise self._unauthorized(authorization is not None, openai=openai)
        return found

    @staticmethod
    def _not_invocable(grant: Grant, what: str, credential: str = "token") -> str:
        if not grant.has(INVOKE):
            return missing_scope_message(INVOKE, f"invoking {what}").replace("this token", f"this {credential}")
        return f"this {credential} may not invoke {what}"

    # --- POST /hooks/git ---------------------------------------------------------------------

    async def git_hook(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        """Wake the reconciler. With a webhook secret: a forge signature that verifies (or an
        admin token) and no bearer token needed; without one: loopback callers only, with an
        admin token when tokens are configured. Hooks only wake: many coalesce into one fetch."""
        try:
            headers = {key: value for key, value in scope["headers"]
                       if key in hooks.SIGNATURE_HEADERS or key in (b"authorization", b"content-length")}
            authorization = headers.get(b"authorization")
            if self.on_git_hook is None:
                raise _plnt_error(404, "not_found", "git hook is not enabled on this gateway")
            if self.webhook_secret is None:
                client = scope.get("client")
                if client is None or not is_loopback_host(client[0]):
                    raise _plnt_error(403, "forbidden", "POST /hooks/git takes only loopback callers unless plnt up "
                                      "has --webhook-secret-file (then the forge signs each hook)")
                if self.tokens.enabled:
                    self._require_admin(authorization, "POST /hooks/git")
            try:
                body = await _read_body(receive, headers.get(b"content-length"), self.max_body_bytes)
            except _BodyTooLarge as exc:
                raise _plnt_error(413, "body_too_large", f"request body is over the {self.max_body_bytes} byte limit",
                                  exc.headers(self.max_body_bytes)) from None
            if self.webhook_secret is not None:
                problem = hooks.verify(self.webhook_secret, headers, body)
                grant = self.tokens.check_header(authorization) if self.tokens.enabled else None
                if problem is not None and not (grant is not None and grant.has(ADMIN)):
                    if grant is not None and not any(name in headers for name in hooks.SIGNATURE_HEADERS):
                        # A known token without a signature: what it lacks is the scope.
                        raise _plnt_error(403, "forbidden", missing_scope_message(ADMIN, "POST /hooks/git"))
                    raise _plnt_error(401, "invalid_signature", problem)
            await self.on_git_hook()
            await _respond(send, 202, b'{"accepted":true}', [])
        except _Reply as reply:
            await _respond(send, reply.status, reply.body, reply.headers)
        except _ClientGone:
            pass

    def _require_admin(self, authorization: bytes | None, what: str) -> None:
        grant = self.tokens.check_header(authorization)
        if grant is None:
            raise self._unauthorized(authorization is not None, openai=False)
        if not grant.has(ADMIN):
            raise _plnt_error(403, "forbidden", missing_scope_message(ADMIN, what))

    async def _invoke(self, scope: ASGIScope, receive: Receive, send: Send, name: str, t0: float, outcome: _Outcome) -> None:
        headers = _pick_headers(scope)
        authorization, accept, content_type = headers.get(b"authorization"), headers.get(b"accept"), headers.get(b"content-type")
        content_length, session = headers.get(b"content-length"), headers.get(b"x-session-id")
        grant = self._grant(authorization, openai=False)
        if self.tokens.enabled:
            if not grant.allows_name(name):
                raise _plnt_error(403, "forbidden", self._not_invocable(grant, f"workflow {name}"))
        if not is_json_media(content_type):
            raise _plnt_error(415, "unsupported_media_type", _unsupported_type(content_type))
        try:
            body = await _read_body(receive, content_length, self.max_body_bytes)
        except _BodyTooLarge as exc:
            raise _plnt_error(413, "body_too_large", f"request body is over the {self.max_body_bytes} byte limit",
                              exc.headers(self.max_body_bytes)) from None
        try:
            parsed = json_limits.loads(body)
        except json_limits.JSONTooDeep as exc:
            raise _plnt_error(422, "invalid_json", f"body is not accepted: {exc}") from None
        except json.JSONDecodeError as exc:
            raise _plnt_error(422, "invalid_json", f"body is not valid JSON: {_json_position(exc)}",
                              line=exc.lineno, column=exc.colno) from None
        except UnicodeDecodeError as exc:
            raise _plnt_error(422, "invalid_json", f"body is not UTF-8 at byte {exc.start}") from None
        if not isinstance(parsed, dict):
            raise _plnt_error(422, "invalid_request", f"body must be a JSON object, got {type(parsed).__name__}")

        namespace = None
        if scope["query_string"]:
            values = parse_qs(scope["query_string"].decode("latin-1")).get("namespace")
            namespace = values[0] if values else None
        try:  # X-Plnt-Preview: N goes to the preview of pull request N, and only then (routes.preview_target)
            target = preview_target(name, headers.get(PREVIEW_HEADER.encode()))
        except PreviewNotFound as exc:
            raise _plnt_error(404, "not_found", str(exc)) from None
        table = self.router.table  # one snapshot for the whole request
        try:
            route = table.lookup(target, namespace)
        except AmbiguousRoute as exc:
            raise _plnt_error(
                409, "ambiguous",
                f"workflow {name!r} exists in namespaces {', '.join(exc.namespaces)}; add ?namespace=<one of them>",
            ) from None
        if route is None:
            where = f" in namespace {namespace}" if namespace is not None else ""
            if target != name:
                raise _plnt_error(404, "not_found", f"no preview of workflow {name}{where} for pull request "
                                  f"{target.rsplit('--pr', 1)[1]}; GET /workflows lists the previews")
            raise _plnt_error(404, "not_found", f"no workflow named {name}{where}; GET /workflows lists them")
        if not grant.allows(route.namespace, name):
            raise _plnt_error(403, "forbidden", self._not_invocable(grant, f"workflow {route.namespace}/{name}"))
        if route.protocol == "openai":
            raise _plnt_error(404, "not_found", f"{route.namespace}/{name} is a ModelDeployment, not a workflow: "
                              f"POST /v1/chat/completions with \"model\": \"{name}\"")
        forced = headers.get(_TRACK)
        try:
            if forced is None:
                backend, track = self.router.choose(route, session=session.decode("latin-1") if session else None)
            else:  # X-Plnt-Track: the caller picks the track (routes.forced_track)
                backend, track = self._forced(route, forced, openai=False)
        except RouteNotReady:
            raise _plnt_error(503, "not_ready", f"workflow {route.namespace}/{name} has no promoted release yet",
                              [(b"retry-after", b"5")]) from None
        outcome.labels = (route.namespace, name, backend.version, track)

        stream = accept is not None and _SSE in accept
        headers = [("content-type", content_type.decode("latin-1") if content_type else "application/json")]
        if stream:
            headers.append(("accept", "text/event-stream"))
        if outcome.span is not None:  # the runner continues this trace (W3C traceparent)
            headers.extend(telemetry.inject({}, outcome.span).items())
        response, backend, track = await self._exchange(
            table, route, target, backend, track, "/invoke", body, headers, stream, openai=False
        )
        outcome.labels = (route.namespace, name, backend.version, track)
        plnt_headers = [(b"x-plnt-version", backend.version.encode()), (b"x-plnt-track", track.encode())]
        try:
            if not stream:
                outcome.code = response.status
                if response.status >= 400:
                    outcome.error_type = _runner_error_type(response.body)
                await _respond(send, response.status, response.body, [*response.relayed_headers(), *plnt_headers],
                               response.header(b"content-type", _JSON))  # type: ignore[arg-type]
                return
            await self._pass_stream(receive, send, response, plnt_headers, t0, outcome)
        finally:
            self.router.leave(backend)

    async def _pass_stream(
        self, receive: Receive, send: Send, response: UpstreamResponse, plnt_headers: list[tuple[bytes, bytes]],
        t0: float, outcome: _Outcome,
    ) -> None:
        content_type = response.header(b"content-type", _JSON) or _JSON
        if response.status != 200 or not content_type.startswith(_SSE):
            # An error (or a runner that does not stream): pass it through as one body.
            try:
                body = b"".join([chunk async for chunk in response.chunks()])
            except UpstreamError as exc:
                raise _plnt_error(502, "upstream_error", f"runner failed: {exc}") from None
            outcome.code = response.status
            if response.status >= 400:
                outcome.error_type = _runner_error_type(body)
            await _respond(send, response.status, body, [*response.relayed_headers(), *plnt_headers], content_type)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", content_type),
                    (b"cache-control", response.stream_cache_control()),
                    (b"x-accel-buffering", b"no"),
                    *response.relayed_headers(stream=True),
                    *plnt_headers,
                ],
            }
        )
        outcome.started = True
        outcome.code = 200
        gone: list[bool] = []
        watcher = asyncio.create_task(self._watch_disconnect(receive, response, gone))
        last = b"\n\n"
        try:
            async for chunk in response.chunks():
                if outcome.ttft is None and not chunk.startswith(b":"):
                    outcome.ttft = time.perf_counter() - t0
                if b"event: error" in chunk:
                    outcome.error_type = "stream_error"
                last = chunk
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as exc:
            if gone:
                outcome.code, outcome.error_type = 499, "client_disconnected"
                return
            outcome.error_type = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
            if _at_event_boundary(last):
                # A partial event cannot be cancelled in SSE; only after a complete one can an
                # error event follow. Otherwise the stream just ends without a `result`.
                error = {"error": {"type": outcome.error_type, "message": f"runner stream failed: {exc}", "step": None}}
                await send({"type": "http.response.body", "body": b"event: error\ndata: " + oai.dumps(error) + b"\n\n",
                            "more_body": True})
        finally:
            watcher.cancel()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    # --- POST /v1/chat/completions ------------------------------------------------------------

    async def chat(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        await self._measured("chat", send, _INTERNAL_CHAT, lambda t0, outcome: self._chat(scope, receive, send, t0, outcome),
                             scope)

    async def _chat(self, scope: ASGIScope, receive: Receive, send: Send, t0: float, outcome: _Outcome) -> None:
        headers = _pick_headers(scope)
        content_length, session = headers.get(b"content-length"), headers.get(b"x-session-id")
        grant = self._grant(headers.get(b"authorization"), openai=True)
        content_type = headers.get(b"content-type")
        if not is_json_media(content_type):
            raise _openai_error(415, _unsupported_type(content_type), "invalid_request_error", None,
                                "unsupported_media_type")
        try:
            body = await _read_body(receive, content_length, self.max_body_bytes)
        except _BodyTooLarge as exc:
            raise _openai_error(413, f"request body is over the {self.max_body_bytes} byte limit",
                                "invalid_request_error", None, "request_too_large", exc.headers(self.max_body_bytes)) from None
        try:
            request = oai.parse_chat_request(json_limits.loads(body))
        except json_limits.JSONTooDeep as exc:
            raise _openai_error(400, f"could not accept the JSON body: {exc}", "invalid_request_error", None,
                                "invalid_json") from None
        except json.JSONDecodeError as exc:
            raise _openai_error(400, f"could not parse the JSON body: {_json_position(exc)}",
                                "invalid_request_error", None, "invalid_json") from None
        except UnicodeDecodeError as exc:
            raise _openai_error(400, f"the body is not UTF-8 at byte {exc.start}", "invalid_request_error",
                                None, "invalid_json") from None
        except oai.InvalidRequest as exc:
            raise _openai_error(400, exc.message, "invalid_request_error", exc.param, "invalid_request") from None

        model = request.model
        namespace, _, name = model.rpartition("/")
        namespace_or_none = namespace or None
        if not (grant.allows(namespace, name) if namespace else grant.allows_name(name)) and not grant.has(MODELS):
            raise _openai_error(403, self._not_invocable(grant, f"model {model}", "API key"), "permission_error",
                                "model", "model_not_allowed")
        try:  # X-Plnt-Preview: N goes to the preview of pull request N, and only then (routes.preview_target)
            target = preview_target(name, headers.get(PREVIEW_HEADER.encode()))
        except PreviewNotFound as exc:
            raise _openai_error(404, str(exc), "invalid_request_error", "model", "model_not_found") from None
        table = self.router.table
        try:
            route = table.lookup(target, namespace_or_none)
        except AmbiguousRoute as exc:
            choices = ", ".join(f"{ns}/{name}" for ns in exc.namespaces)
            raise _openai_error(400, f"model {name!r} is ambiguous; use one of {choices}", "invalid_request_error",
                                "model", "model_ambiguous") from None
        if route is None:
            preview = "" if target == name else f" with a preview for pull request {target.rsplit('--pr', 1)[1]}"
            raise _openai_error(404, f"The model `{model}`{preview} does not exist (GET /v1/models lists the workflows)",
                                "invalid_request_error", "model", "model_not_found")
        if not grant.may_chat(route.namespace, name, is_model=route.protocol == "openai"):
            raise _openai_error(403, f"this API key may not use model {model}", "permission_error", "model", "model_not_allowed")
        forced = headers.get(_TRACK)
        try:
            if forced is None:
                backend, track = self.router.choose(route, session=session.decode("latin-1") if session else None)
            else:  # X-Plnt-Track: the caller picks the track (routes.forced_track)
                backend, track = self._forced(route, forced, openai=True)
        except RouteNotReady:
            raise _openai_error(503, f"model {model} has no promoted release yet", "server_error", None,
                                "model_not_ready", [(b"retry-after", b"5")]) from None
        outcome.labels = (route.namespace, name, backend.version, track)
        if route.protocol == "openai":
            await self._chat_model(send, receive, table, route, target, backend, track, body, request.stream, t0, outcome)
            return

        headers = [("content-type", "application/json")]
        if request.stream:
            headers.append(("accept", "text/event-stream"))
        if outcome.span is not None:  # the runner continues this trace (W3C traceparent)
            headers.extend(telemetry.inject({}, outcome.span).items())
        response, backend, track = await self._exchange(
            table, route, target, backend, track, "/chat", oai.runner_chat_body(request), headers, request.stream, openai=True
        )
        outcome.labels = (route.namespace, name, backend.version, track)
        plnt_headers = [(b"x-plnt-version", backend.version.encode()), (b"x-plnt-track", track.encode())]
        try:
            if not request.stream:
                result = self._chat_result(response.status, response.body)
                outcome.code = 200
                await _respond(send, 200, oai.completion_body(oai.new_id(), model, result, request), plnt_headers)
                return
            await self._chat_stream(receive, send, response, request, model, backend.version, plnt_headers, t0, outcome)
        finally:
            self.router.leave(backend)

    async def _chat_model(self, send: Send, receive: Receive, table: RouteTable, route: Route, target: str,
                          backend: Backend, track: Track, body: bytes, stream: bool, t0: float,
                          outcome: _Outcome) -> None:
        """A ModelDeployment: its server speaks the OpenAI API, so the request goes through as sent
        and the answer comes back as the server gave it (chunks relayed as they arrive)."""
        headers = [("content-type", "application/json")]
        if stream:
            headers.append(("accept", "text/event-stream"))
        if outcome.span is not None:  # the model server continues this trace (W3C traceparent)
            headers.extend(telemetry.inject({}, outcome.span).items())
        response, backend, track = await self._exchange(
            table, route, target, backend, track, "/v1/chat/completions", body, headers, stream, openai=True)
        outcome.labels = (route.namespace, route.name, backend.version, track)
        plnt_headers = [(b"x-plnt-version", backend.version.encode()), (b"x-plnt-track", track.encode())]
        try:
            content_type = response.header(b"content-type", b"application/json") or b"application/json"
            outcome.code = response.status
            if not stream:
                await _respond(send, response.status, response.body, [*response.relayed_headers(), *plnt_headers],
                               content_type)
                return
            await send({"type": "http.response.start", "status": response.status,
                        "headers": [(b"content-type", content_type), (b"cache-control", response.stream_cache_control()),
                                    (b"x-accel-buffering", b"no"), *response.relayed_headers(stream=True),
                                    *plnt_headers]})
            outcome.started = True
            gone: list[bool] = []
            watcher = asyncio.create_task(self._watch_disconnect(receive, response, gone))
            try:
                async for chunk in response.chunks():
                    if outcome.ttft is None and b'"content"' in chunk:
                        outcome.ttft = time.perf_counter() - t0
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except UpstreamError as exc:
                if gone:
                    outcome.code, outcome.error_type = 499, "client_disconnected"
                    return
                outcome.error_type = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
                error = oai.error_body(f"model server stream failed: {exc}", "server_error", None, outcome.error_type)
                await send({"type": "http.response.body", "body": b"data: " + error + b"\n\n", "more_body": True})
            finally:
                watcher.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            response.close()
            self.router.leave(backend)

    @staticmethod
    def _chat_result(status: int, body: bytes) -> dict[str, Any]:
        """The runner's result JSON, or a _Reply in OpenAI's error shape."""
        try:
            data = json.loads(body)
        except (ValueError, RecursionError):
            data = None
        if status == 200 and isinstance(data, dict):
            return data
        if status == 200:
            raise _openai_error(502, "the runner answered something that is not a JSON result", "server_error",
                                None, "bad_upstream_response")
        error = data.get("error") if isinstance(data, dict) else None
        error = error if isinstance(error, dict) else {}
        message = error.get("message") if isinstance(error.get("message"), str) else f"runner answered {status}"
        code = error.get("type") if isinstance(error.get("type"), str) else "runner_error"
        if status < 500:
            return_status = 400 if status == 422 else status
            param = error.get("field") if isinstance(error.get("field"), str) else None
            raise _openai_error(return_status, message, "invalid_request_error", param, code)
        raise _openai_error(status, message, "server_error", None, code)

    async def _chat_stream(
        self, receive: Receive, send: Send, response: UpstreamResponse, request: oai.ChatRequest, model: str, version: str,
        plnt_headers: list[tuple[bytes, bytes]], t0: float, outcome: _Outcome,
    ) -> None:
        content_type = response.header(b"content-type", b"") or b""
        if response.status != 200 or not content_type.startswith(_SSE):
            try:
                body = b"".join([chunk async for chunk in response.chunks()])
            except UpstreamError as exc:
                raise _openai_error(502, f"runner failed: {exc}", "server_error", None, "upstream_error") from None
            self._chat_result(response.status, body)  # raises for errors
            raise _openai_error(502, "the runner did not stream although asked to", "server_error", None,
                                "bad_upstream_response")
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-accel-buffering", b"no"),
                    *plnt_headers,
                ],
            }
        )
        outcome.started = True
        outcome.code = 200
        writer = oai.ChunkWriter(oai.new_id(), model, f"plnt-{version}")
        await send({"type": "http.response.body", "body": writer.first(), "more_body": True})
        parser = SSEParser()
        streamed: list[str] = []
        tokens = 0
        finished = False
        gone: list[bool] = []
        watcher = asyncio.create_task(self._watch_disconnect(receive, response, gone))
        try:
            async for chunk in response.chunks():
                out: list[bytes] = []
                for event in parser.feed(chunk):
                    if event.event == "token":
                        try:
                            text = json.loads(event.data).get("text")
                        except (ValueError, AttributeError, RecursionError):
                            text = None
                        if isinstance(text, str) and text:
                            streamed.append(text)
                            tokens += 1
                            out.append(writer.content(text))
                    elif event.event == "result":
                        try:
                            result = json.loads(event.data)
                        except (ValueError, RecursionError):
                            result = {}
                        result = result if isinstance(result, dict) else {}
                        reply = oai.reply_text(result.get("output"))
                        sent = "".join(streamed)
                        if reply.startswith(sent) and len(reply) > len(sent):
                            # Nothing (or only part) was streamed as tokens: send the rest now.
                            out.append(writer.content(reply[len(sent):]))
                        out.append(writer.stop())
                        if request.include_usage:
                            out.append(writer.usage(oai.usage(result, request, reply, tokens or None)))
                        out.append(writer.DONE)
                        finished = True
                    elif event.event == "error":
                        try:
                            error = json.loads(event.data).get("error") or {}
                        except (ValueError, AttributeError, RecursionError):
                            error = {}
                        message = error.get("message") if isinstance(error, dict) else None
                        code = error.get("type") if isinstance(error, dict) else None
                        out.append(writer.error(message or "the workflow failed", "server_error", code or "runner_error"))
                        outcome.error_type = "stream_error"
                        finished = True
                    elif event.event == COMMENT:
                        out.append(b": ping\n\n")
                    if finished:
                        break
                if out:
                    if outcome.ttft is None and streamed:
                        outcome.ttft = time.perf_counter() - t0
                    await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
                if finished:
                    break
            if not finished:
                outcome.error_type = "stream_error"
                await send({"type": "http.response.body", "more_body": True,
                            "body": writer.error("the runner ended the stream without a result", "server_error",
                                                 "upstream_error")})
        except UpstreamError as exc:
            if gone:
                outcome.code, outcome.error_type = 499, "client_disconnected"
                return
            kind = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
            outcome.error_type = kind
            await send({"type": "http.response.body", "more_body": True,
                        "body": writer.error(f"runner stream failed: {exc}", "server_error", kind)})
        finally:
            watcher.cancel()
            response.close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class GatewayApp(FastAPI):
    """FastAPI with the two hot paths answered before FastAPI's routing (see module docstring),
    and bearer-token checks in front of every route but the probes (`/healthz`, `/readyz`)."""

    gateway: Gateway

    async def __call__(self, scope: ASGIScope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            gateway = self.gateway
            if gateway.allowed_hosts is not None and not host_allowed(scope["headers"], gateway.allowed_hosts):
                await _respond(send, 421, _FOREIGN_HOST, [])
                return
            path: str = scope["path"]
            if scope["method"] == "POST":
                if path.startswith("/workflows/") and path.endswith("/invoke"):
                    name = path[11:-7]
                    if name and "/" not in name:
                        await gateway.invoke(scope, receive, send, name)
                        return
                elif path == "/v1/chat/completions":
                    await gateway.chat(scope, receive, send)
                    return
                elif path == "/hooks/git":
                    await gateway.git_hook(scope, receive, send)
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
                    reply = gateway._unauthorized(authorization is not None, openai=path.startswith("/v1/"))
                    await _respond(send, reply.status, reply.body, reply.headers)
                    return
                needed = required_scope(path)
                if needed is not None and not grant.has(needed):
                    reply = _plnt_error(403, "forbidden", missing_scope_message(needed, f"{scope['method']} {path}"))
                    await _respond(send, reply.status, reply.body, reply.headers)
                    return
                scope["plnt.grant"] = grant
        await super().__call__(scope, receive, send)



_FOREIGN_HOST = oai.dumps({"error": {"type": "misdirected_request", "message": (
    f"{FOREIGN_HOST_MESSAGE}; configure tokens (--tokens-file) to serve other names")}})


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


def _grant(request: Request) -> Grant:
    return request.scope.get("plnt.grant", ALL)


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


def create_app(
    router: Router,
    *,
    list_workflows: Callable[[], list[dict[str, Any]]],
    on_git_hook: Callable[[], Awaitable[None]] | None = None,
    request_timeout_s: float = 60.0,
    tokens: TokenSet | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    connect_timeout_s: float = _MAX_CONNECT_TIMEOUT_S,
    max_connections_per_runner: int = 256,
    webhook_secret: bytes | None = None,
    host: str = "127.0.0.1",
    health: Callable[[], tuple[int, dict[str, Any]]] | None = None,
    wake: Wake | None = None,
    events_poll_s: float = 0.5,
    events_keepalive_s: float = 15.0,
    max_event_streams: int = 64,
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
    """
    gateway = Gateway(
        router,
        tokens=tokens or TokenSet(),
        metrics=GatewayMetrics(),
        request_timeout_s=request_timeout_s,
        connect_timeout_s=min(request_timeout_s, connect_timeout_s),
        max_body_bytes=max_body_bytes,
        max_connections_per_runner=max_connections_per_runner,
        on_git_hook=on_git_hook,
        webhook_secret=webhook_secret,
        allowed_hosts=open_gateway_hosts(host, tokens or TokenSet()),
        wake=wake,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        client = UpstreamClient(
            read_timeout_s=request_timeout_s,
            connect_timeout_s=gateway.connect_timeout_s,
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
    mount_ui(app)  # GET /ui: the web UI (gateway/ui.py)
    app.state.metrics = gateway.metrics

    def visible_rows(grant: Grant) -> list[dict[str, Any]]:
        """Every row for `read`; an invoke-only token sees its workflows. Runner endpoints only
        for `admin`: everyone else reaches runners through the gateway."""
        rows = list_workflows()
        if not grant.has(READ):
            rows = [row for row in rows if grant.allows(str(row.get("namespace")), str(row.get("name")))]
        if not grant.has(ADMIN):
            rows = [_without_runner_urls(row) for row in rows]
        return rows

    @app.get("/workflows")
    async def workflows(request: Request) -> JSONResponse:
        return JSONResponse(visible_rows(_grant(request)))

    # GET /workflows/events: the rows as Server-Sent Events (the UI's live list); see events.py.
    _add_workflow_events(app, visible_rows, poll_s=events_poll_s,
                        keepalive_s=events_keepalive_s, max_streams=max_event_streams)

    # GET /calls: this process's last calls (plnt up with workers: every process's, calls.CallsHub).
    app.state.call_rows = gateway.calls.rows

    @app.get("/calls")
    async def calls(limit: int = 50) -> JSONResponse:
        return JSONResponse(app.state.call_rows(max(0, min(limit, MAX_CALLS_LIMIT))))

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
        assert gateway.client is not None

        admin = _grant(request).has(ADMIN)

        async def one(backend: Backend, track: str) -> dict[str, Any]:
            item: dict[str, Any] = {"version": backend.version, "track": track}
            if admin:
                item["endpoint"] = backend.endpoint
            try:
                response = await gateway.client.request(backend.endpoint, "GET", "/stats")  # type: ignore[union-attr]
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

    return app


__all__ = ["DEFAULT_MAX_BODY_BYTES", "Gateway", "GatewayApp", "create_app"]


# A gateway's first route table usually arrives within a second (the follower retries from 0.5 s on);
# 2 s is what its other requests answer meanwhile (role.py).
_HEALTH_RETRY_AFTER = {"retry-after": "2"}
_TRACK = TRACK_HEADER.encode()
_WANTED_HEADERS = frozenset({b"authorization", b"accept", b"content-type", b"content-length", b"x-session-id",
                             PREVIEW_HEADER.encode(), _TRACK})


def _pick_headers(scope: ASGIScope) -> dict[bytes, bytes]:
    """The few request headers the fast paths read (ASGI header names are lower-case bytes)."""
    return {key: value for key, value in scope["headers"] if key in _WANTED_HEADERS}
