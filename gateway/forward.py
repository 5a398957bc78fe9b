"""What both hot paths (invoke.py, chat.py) do with a request: measure it, check its token and body,
choose the backend of its route and send it to that runner (relay.py brings the answer back).

Choosing: X-Plnt-Track names the track (routes.forced_track); otherwise the router splits stable and
canary (by X-Session-Id when sent); a model's chat goes to its conversation's stable replica
(affinity.py) when the router's cache affinity is on. Sending: a failed attempt is sent once more when
retry.py says so (before the caller got a byte: nothing reached the runner, the runner said nothing
ran, or a model's canary failed), to a stable replica other than the failed one, looked up in the new
route table if it was swapped since the request looked (a promotion replaced the runner); a refused
connect with no other replica (scale to zero) goes to the same release once `wake` started its parked
runner again (concurrent requests for one parked release share one wake). The failed attempt is
recorded as its own call (metrics, call log, the compare gate's ledger: a canary's failure stays the
canary's), the answer names the first backend and the reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from plnt.core import telemetry
from plnt.core.auth import ALL, Grant, TokenSet, is_json_media
from plnt.core.routes import (
    FALLBACK_HEADER,
    NOT_STARTED_HEADER,
    PREVIEW_HEADER,
    SHADOW_HEADER,
    TRACK_HEADER,
    AmbiguousRoute,
    Backend,
    BadTrack,
    NoCanary,
    Route,
    RouteNotReady,
    RouteTable,
    Track,
    forced_track,
)
from plnt.core.upstream import UpstreamClient, UpstreamConnectError, UpstreamError, UpstreamResponse, UpstreamTimeout
from plnt.gateway import retry as retries
from plnt.gateway.calls import CallLog
from plnt.gateway.metrics import GatewayMetrics
from plnt.gateway.quotas import Quotas, call_cost
from plnt.gateway.replies import (
    ASGIScope,
    BodyTooLarge,
    ClientGone,
    ErrorShape,
    Headers,
    Receive,
    Reply,
    Send,
    read_body,
    respond,
)
from plnt.gateway.router import Router

log = logging.getLogger("plnt.gateway")

Wake = Callable[[str, str, str], Awaitable[str | None]]  # (namespace, name, release id) -> endpoint or None

Api = Literal["invoke", "chat"]

SSE = b"text/event-stream"
MAX_SHADOWS = 32  # mirrored requests in flight per gateway process (canary.shadowPercent)
_SPAN_NAMES = {"invoke": "POST /workflows/{name}/invoke", "chat": "POST /v1/chat/completions"}
_NO_LABELS = ("", "", "", "")
_NOT_STARTED = NOT_STARTED_HEADER.encode()
_FALLBACK = FALLBACK_HEADER.encode()
_TRACK = TRACK_HEADER.encode()
_SHADOW = SHADOW_HEADER.encode()
_WANTED_HEADERS = frozenset({b"authorization", b"accept", b"content-type", b"content-length", b"x-session-id",
                             PREVIEW_HEADER.encode(), _TRACK, _SHADOW})


@dataclass(frozen=True, slots=True)
class StreamShape:
    """What a streamed answer's bytes mean to the gateway (relay.py sends them on; a mirror reads
    them to their end)."""

    is_token: Callable[[bytes], bool]  # this chunk carries the first token (time to first token)
    failure_event: Callable[[str, str, bytes], bytes | None]  # (error type, failure, last chunk) -> event or None
    error_marker: bytes | None = None  # a chunk holding it is the upstream's own error event
    # How many token events a chunk holds (time per output token, completion tokens); None: not counted.
    count_tokens: Callable[[bytes], int] | None = None
    # The completion tokens an answer (a stream's usage chunk, or a whole body) says it generated, if it says.
    completion_tokens: Callable[[bytes], int | None] | None = None
    # The prompt tokens an answer says it read (a stream says them in its usage chunk, if asked to).
    prompt_tokens: Callable[[bytes], int | None] | None = None

    def clock(self) -> TokenClock | None:
        """A clock for one stream's tokens, when this kind of stream counts them."""
        return TokenClock() if self.count_tokens is not None else None

    def observe(self, chunk: bytes, outcome: Outcome, clock: TokenClock | None) -> None:
        """What one chunk of the stream tells the metrics: the first token's time, the tokens (into
        `clock`), the upstream's own error."""
        if outcome.ttft is None and self.is_token(chunk):
            outcome.ttft = time.perf_counter() - outcome.t0
        if clock is not None and self.count_tokens is not None:
            clock.tokens(self.count_tokens(chunk), time.perf_counter())
            if self.completion_tokens is not None and (said := self.completion_tokens(chunk)) is not None:
                clock.reported = said
            if self.prompt_tokens is not None and (prompt := self.prompt_tokens(chunk)) is not None:
                clock.prompt = prompt
        if self.error_marker is not None and self.error_marker in chunk:
            outcome.error_type = "stream_error"


class TokenClock:
    """A stream's tokens as they pass: the first's and last's time and how many, for TPOT."""

    __slots__ = ("count", "first", "last", "prompt", "reported")

    def __init__(self) -> None:
        self.count = 0
        self.first = self.last = 0.0
        self.reported: int | None = None  # what the answer's usage said
        self.prompt: int | None = None  # the prompt tokens the answer's usage said

    def tokens(self, n: int, now: float) -> None:
        if n <= 0:
            return
        if self.count == 0:
            self.first = now
        self.last = now
        self.count += n

    def into(self, outcome: Outcome) -> None:
        if self.count >= 2:
            outcome.tpot = (self.last - self.first) / (self.count - 1)
        tokens = self.reported if self.reported is not None else self.count
        outcome.tokens = tokens if tokens or self.reported is not None else None
        if self.prompt is not None:
            outcome.prompt_tokens = self.prompt


def runner_error_type(body: bytes) -> str:
    """The `error.type` of a runner's (or model server's) error answer, for the metrics."""
    try:
        error = json.loads(body).get("error")
        kind = error.get("type") if isinstance(error, dict) else None
    except (ValueError, AttributeError, RecursionError):
        kind = None
    return kind if isinstance(kind, str) and kind else "runner_error"


def request_headers(scope: ASGIScope) -> dict[bytes, bytes]:
    """The few request headers the hot paths read (ASGI header names are lower-case bytes)."""
    return {key: value for key, value in scope["headers"] if key in _WANTED_HEADERS}


class Outcome:
    """What the metrics record about one request."""

    __slots__ = ("api", "code", "error_type", "failure", "fallback_of", "first", "labels", "prompt_tokens", "reason",
                 "span", "started", "t0", "token", "tokens", "tpot", "ttft")

    def __init__(self, t0: float, api: Api = "invoke") -> None:
        self.t0 = t0  # request received (perf_counter)
        self.api: Api = api
        self.labels: tuple[str, str, str, str] = _NO_LABELS
        self.code = 500
        self.error_type: str | None = None
        self.ttft: float | None = None  # streams: request received -> first token sent (s)
        self.tpot: float | None = None  # streams of 2 tokens or more: (last token - first) / (tokens - 1) (s)
        self.tokens: int | None = None  # completion tokens, where the answer says or the stream counted them
        self.prompt_tokens: int | None = None  # prompt tokens, where the answer says them
        self.token: str | None = None  # the caller's token name (usage, quotas); None: a mirror, nobody's
        self.started = False  # response headers sent
        self.span: Any = None  # the request's trace span, only when tracing is on (telemetry.ENABLED)
        # Retries and fallbacks (retry.py). On the answered call: `first` the backend first tried ("track
        # version"), `reason` why it was left; on a failed attempt's own record: `reason` alone.
        self.first: str | None = None
        self.reason: str | None = None
        self.fallback_of: str | None = None  # the model the caller named, when its fallback answered
        self.failure: retries.Failure | None = None  # why the last attempt failed (the fallback reads it)


class Exchange:
    """A runner's answer to a forwarded request, and the backend that gave it: counted in flight
    until `release`."""

    __slots__ = ("_router", "backend", "fallback", "response", "track")

    def __init__(self, router: Router, response: UpstreamResponse, backend: Backend, track: Track) -> None:
        self._router = router
        self.response = response
        self.backend = backend
        self.track = track
        self.fallback: str | None = None  # the fallback model that answered (chat.py)

    def plnt_headers(self) -> Headers:
        """Which release answered (X-Plnt-Version) on which track (X-Plnt-Track), and X-Plnt-Fallback
        naming the fallback model when it answered."""
        headers = [(b"x-plnt-version", self.backend.version.encode()), (b"x-plnt-track", self.track.encode())]
        if self.fallback is not None:
            headers.append((_FALLBACK, self.fallback.encode()))
        return headers

    def release(self) -> None:
        self.response.close()  # idempotent: a no-op once the body was read to its end
        self._router.leave(self.backend)


class Waker:
    """Starts a parked runner (scale to zero) again for the requests its connect refused; concurrent
    requests for one release share one wake."""

    def __init__(self, wake: Wake, metrics: GatewayMetrics, timeout_s: float) -> None:
        self.wake = wake
        self.metrics = metrics
        self.timeout_s = timeout_s
        self._waking: dict[str, asyncio.Future[str | None]] = {}  # release id -> the wake in progress

    async def woken(self, route: Route, backend: Backend) -> Backend | None:
        """Where `backend`'s runner listens once started again; None if it did not park or cannot start."""
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
        return Backend(endpoint=endpoint, version=backend.version, release_id=backend.release_id)

    async def _wake(self, route: Route, backend: Backend) -> str | None:
        try:
            async with asyncio.timeout(self.timeout_s):
                endpoint = await self.wake(route.namespace, route.name, backend.release_id)
        except Exception as exc:
            log.warning("runner-wake-failed workflow=%s/%s release=%s: %s", route.namespace, route.name,
                        backend.release_id, exc or type(exc).__name__)
            raise
        if endpoint is not None:
            self.metrics.woke(route.namespace, route.name)
        return endpoint


class Gateway:
    """What the hot paths of one gateway app share: its route table, tokens, metrics and runner client,
    and the steps every request takes."""

    def __init__(
        self,
        router: Router,
        *,
        tokens: TokenSet,
        metrics: GatewayMetrics,
        request_timeout_s: float,
        max_body_bytes: int,
        allowed_hosts: frozenset[bytes] | None = None,
        wake: Wake | None = None,
        quotas: Quotas | None = None,
    ) -> None:
        self.router = router
        self.tokens = tokens
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.max_body_bytes = max_body_bytes
        self.allowed_hosts = allowed_hosts  # open loopback mode: the Host names it answers
        self.waker = Waker(wake, metrics, request_timeout_s) if wake is not None else None
        self.client: UpstreamClient | None = None  # created in the app's lifespan (needs the loop)
        self.calls = CallLog()  # GET /calls: the last calls, no body, no token (calls.py)
        self.quotas = quotas or Quotas()  # the GatewayPolicy's limits, this process's share (quotas.py)
        self._shadows: set[asyncio.Task[None]] = set()  # mirrors in flight (canary.shadowPercent)
        self._shadow_rng = random.Random()
        router.placed = lambda route, spilled: metrics.placed(route.namespace, route.name, spilled)

    async def measured(self, api: Api, errors: ErrorShape, scope: ASGIScope, send: Send,
                       handle: Callable[[Outcome], Awaitable[None]]) -> None:
        """One hot-path request: errors become answers (unless the answer already started), and
        every request ends in the metrics with its outcome."""
        outcome = Outcome(time.perf_counter(), api)
        self.metrics.started(api)
        if telemetry.ENABLED:  # off: this one check is all tracing costs a request
            outcome.span = telemetry.start_span(_SPAN_NAMES[api], {"http.request.method": "POST"},
                                                parent=telemetry.scope_parent(scope["headers"]), kind="server")
        try:
            await handle(outcome)
        except Reply as reply:
            outcome.code, outcome.error_type = reply.status, reply.error_type
            if not outcome.started:
                await respond(send, reply.status, reply.body, reply.headers)
        except ClientGone:
            outcome.code, outcome.error_type = 499, "client_disconnected"
        except Exception:
            log.exception("%s-failed", api)
            outcome.code, outcome.error_type = 500, "internal"
            if not outcome.started:
                await respond(send, 500, errors.internal, [])
        finally:
            self.record(api, outcome)

    def record(self, api: Api, outcome: Outcome) -> None:
        """A finished call (a caller's, or a mirror's on track "shadow") in the metrics, the call log
        (GET /calls, and the compare gate's ledger through it) and its trace span: one path for both."""
        elapsed = time.perf_counter() - outcome.t0
        self.metrics.finished(api, outcome.labels, outcome.code, elapsed, outcome.error_type, outcome.ttft)
        self.calls.add(api, outcome.labels, outcome.code, elapsed, outcome.error_type, outcome.ttft, outcome.tpot,
                       outcome.tokens, outcome.first, outcome.reason, outcome.fallback_of)
        if outcome.span is not None:
            telemetry.end_request(outcome.span, outcome.code, outcome.error_type, outcome.labels, outcome.ttft)
        if outcome.token is not None and outcome.labels[1]:  # a caller's request that reached a workflow
            self._use(outcome.token, outcome)

    def _use(self, token: str, outcome: Outcome) -> None:
        """A caller's call in the usage (per token name and workflow) and charged to its quotas."""
        namespace, workflow = outcome.labels[0], outcome.labels[1]
        prompt, completion = outcome.prompt_tokens or 0, outcome.tokens or 0
        policy = self.router.table.policy
        cost = call_cost(policy, namespace, workflow, prompt, completion)
        self.metrics.used(token, namespace, workflow, prompt, completion, cost)
        self.quotas.charge(policy, token, prompt + completion, cost)

    def admit(self, grant: Grant, outcome: Outcome, errors: ErrorShape) -> None:
        """The caller's token within its GatewayPolicy limits, or 429 with Retry-After naming the limit."""
        token = outcome.token = grant.label
        denial = self.quotas.admit(self.router.table.policy, token)
        if denial is not None:
            self.metrics.denied(token, denial.limit)
            raise errors.over_quota(denial.limit, token, denial.retry_after_s, denial.message)

    def model_over_limit(self, route: Route, errors: ErrorShape) -> Reply | None:
        """A ModelDeployment's own requests per minute (the GatewayPolicy's `models`): None when this request
        fits (one taken), else the 429 to answer (chat.py may send the request to the model's fallback instead)."""
        denial = self.quotas.admit_model(self.router.table.policy, route.namespace, route.name)
        if denial is None:
            return None
        return errors.over_quota(denial.limit, "", denial.retry_after_s, denial.message)

    def shadow(self, route: Route, name: str, chosen: tuple[Backend, Track], headers: dict[bytes, bytes],
               api: Api, path: str, body: bytes, stream: StreamShape | None) -> None:
        """canary.shadowPercent: a share of the requests the stable answers (invocations and chat
        completions, streamed or not) is also sent to the canary, in the background, marked
        X-Plnt-Shadow (a runner does not run its sideEffects steps) and its answer discarded: `path`
        and `body` as the stable got them, a stream read to its end. Recorded as track "shadow"
        (metrics, /calls, the compare gate's ledger). A request that is itself marked X-Plnt-Shadow
        (a runner's LLM call during a mirrored invocation) is not mirrored again. At most
        MAX_SHADOWS at once: beyond that a mirror is skipped, never queued."""
        canary = route.canary
        if (canary is None or route.shadow_percent <= 0 or chosen[1] != "stable" or headers.get(_SHADOW) == b"1"
                or len(self._shadows) >= MAX_SHADOWS or self._shadow_rng.random() * 100 >= route.shadow_percent):
            return
        outcome = Outcome(time.perf_counter(), api)
        outcome.labels = (route.namespace, name, canary.version, "shadow")
        self.metrics.started(api)
        task = asyncio.create_task(self._mirror(api, canary, path, body, stream, outcome))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _mirror(self, api: Api, canary: Backend, path: str, body: bytes, stream: StreamShape | None,
                      outcome: Outcome) -> None:
        headers = [("content-type", "application/json"), (SHADOW_HEADER, "1")]
        if stream is not None:
            headers.append(("accept", "text/event-stream"))
        try:
            client = self.client
            if client is None:  # the app is shutting down
                raise UpstreamConnectError("the gateway is stopping")
            if stream is None:
                async with asyncio.timeout(self.request_timeout_s):
                    response = await client.request(canary.endpoint, "POST", path, body=body, headers=headers)
                outcome.code = response.status
            else:  # read to its end as a caller would, each chunk within the client's read timeout
                response = await client.request(canary.endpoint, "POST", path, body=body, headers=headers,
                                                stream=True)
                outcome.code, outcome.started = response.status, True
                clock = stream.clock()
                try:
                    async for chunk in response.chunks():
                        stream.observe(chunk, outcome, clock)
                finally:
                    response.close()
                    if clock is not None:
                        clock.into(outcome)
            if outcome.code >= 400:
                outcome.error_type = "shadow_error"
        except (UpstreamError, TimeoutError, OSError) as exc:
            timed_out = isinstance(exc, (TimeoutError, UpstreamTimeout))
            if not outcome.started:  # no answer at all
                outcome.code, outcome.error_type = 504 if timed_out else 502, "shadow_unreachable"
            else:  # a stream that broke off: recorded as relay.py records a caller's
                outcome.error_type = "upstream_timeout" if timed_out else "upstream_error"
        finally:
            self.record(api, outcome)

    def grant(self, authorization: bytes | None, errors: ErrorShape) -> Grant:
        """What the request's bearer token may use (everything when no tokens are configured)."""
        if not self.tokens.enabled:
            return ALL
        found = self.tokens.check_header(authorization)
        if found is None:
            raise errors.unauthorized(authorization is not None)
        return found

    async def json_body(self, receive: Receive, headers: dict[bytes, bytes], errors: ErrorShape) -> bytes:
        """The request body, sent as JSON (415 otherwise) and within `max_body_bytes` (413)."""
        content_type = headers.get(b"content-type")
        if not is_json_media(content_type):
            raise errors.unsupported_type(content_type)
        try:
            return await read_body(receive, headers.get(b"content-length"), self.max_body_bytes)
        except BodyTooLarge as exc:
            raise errors.too_large(self.max_body_bytes, exc) from None

    def choose(self, route: Route, headers: dict[bytes, bytes], errors: ErrorShape, what: str,
               raw_headers: Iterable[tuple[bytes, bytes]] = (), conversation: bytes | None = None,
               ) -> tuple[Backend, Track]:
        """The backend for this request: the track X-Plnt-Track names (400 for another value, 409
        `no_canary` when it names a canary and none is under test), the canary for a request of its
        header cohort (canary.headerRoute, looked up in `raw_headers`: the name is the spec's), else
        the router's pick (among stable replicas by `conversation`, a model chat's affinity.conversation_key,
        when given). `what` names the route in the 503 of a route with nothing promoted yet."""
        forced = headers.get(_TRACK)
        try:
            cohort = route.canary_header
            if forced is None and cohort is not None and route.canary is not None:
                name, value = cohort[0].encode("latin-1"), cohort[1].encode("latin-1")
                if any(k == name and v == value for k, v in raw_headers):
                    return route.canary, "canary"
            if forced is None:
                session = headers.get(b"x-session-id")
                return self.router.choose(route, session=session.decode("latin-1") if session else None,
                                          conversation=conversation)
            return self.router.choose_track(route, forced_track(forced) or "stable", conversation=conversation)
        except BadTrack as exc:
            raise errors.bad_track(str(exc)) from None
        except NoCanary as exc:
            raise errors.no_canary(str(exc)) from None
        except RouteNotReady:
            raise errors.not_ready(what) from None

    async def forward(
        self, table: RouteTable, route: Route, target: str, name: str, chosen: tuple[Backend, Track],
        path: str, body: bytes, *, content_type: str, stream: bool, outcome: Outcome, errors: ErrorShape,
        forced: bool = False, conversation: bytes | None = None,
    ) -> Exchange:
        """POST `body` to `path` of the chosen backend of `route` (`target` in `table`; `name` as the
        caller named it, for the metrics), sent once more where retry.py says (`forced`: the request named
        its track). An answer that is itself a failure (a 5xx) comes back as an Exchange when it is not
        retried; `conversation`: a model chat's affinity key, which a retry on another replica keeps to.
        The caller must `release` the exchange."""
        backend, track = chosen
        outcome.labels = (route.namespace, name, backend.version, track)
        headers = [("content-type", content_type)]
        if stream:
            headers.append(("accept", "text/event-stream"))
        if outcome.span is not None:  # the runner continues this trace (W3C traceparent)
            headers.extend(telemetry.inject({}, outcome.span).items())
        side_effects = route.protocol == "runner"
        try:
            response = await self._send(backend, path, body, headers, stream)
        except UpstreamError as exc:
            failure = outcome.failure = retries.error_failure(exc)
            retry = None
            if retries.retry_target(retries.Attempt(failure, track, side_effects, forced=forced)) is not None:
                retry = self._retry_target(table, route, target, backend, conversation)
            if retry is None and failure == "connect_refused" and self.waker is not None:
                woken = await self.waker.woken(route, backend)
                if woken is not None:  # the same release started again: not a retry on another runner
                    log.info("retry-on-woken-runner workflow=%s/%s from=%s to=%s", route.namespace, target,
                             backend.endpoint, woken.endpoint)
                    backend = woken
                    response = await self._send_once(route, target, backend, path, body, headers, stream, errors,
                                                     outcome)
                    outcome.labels = (route.namespace, name, backend.version, track)
                    return Exchange(self.router, response, backend, track)
            if retry is None:
                raise self._failed(exc, route, target, backend, errors) from None
            failed = self._failed(exc, route, target, backend, errors)
            self.attempt_failed(outcome, failed.status, failed.error_type, failure)
        else:
            failure = retries.status_failure(response.status, response.header(_NOT_STARTED) == b"1")
            retry = None
            if failure is not None and retries.retry_target(
                    retries.Attempt(failure, track, side_effects, forced=forced)) is not None:
                retry = self._retry_target(table, route, target, backend, conversation)
            if retry is None:
                outcome.failure = failure
                outcome.labels = (route.namespace, name, backend.version, track)
                return Exchange(self.router, response, backend, track)
            assert failure is not None
            error_type = runner_error_type(response.body) if not stream else failure
            response.close()
            self.router.leave(backend)
            self.attempt_failed(outcome, response.status, error_type, failure)
        self.metrics.retried(route.namespace, target, failure)
        log.info("retry workflow=%s/%s reason=%s from=%s (%s) to=%s", route.namespace, target, failure,
                 backend.endpoint, track, retry[0].endpoint)
        outcome.first, outcome.reason = f"{track} {backend.version}", failure
        backend, track = retry
        outcome.labels = (route.namespace, name, backend.version, track)
        response = await self._send_once(route, target, backend, path, body, headers, stream, errors, outcome)
        outcome.failure = retries.status_failure(response.status, response.header(_NOT_STARTED) == b"1")
        return Exchange(self.router, response, backend, track)

    async def _send_once(self, route: Route, target: str, backend: Backend, path: str, body: bytes,
                         headers: list[tuple[str, str]], stream: bool, errors: ErrorShape,
                         outcome: Outcome) -> UpstreamResponse:
        """The last attempt: its failure is the answer (a Reply)."""
        try:
            return await self._send(backend, path, body, headers, stream)
        except UpstreamError as exc:
            outcome.failure = retries.error_failure(exc)
            raise self._failed(exc, route, target, backend, errors) from None

    def attempt_failed(self, outcome: Outcome, code: int, error_type: str, reason: str) -> None:
        """A failed attempt that is sent again (or to a fallback model) as its own call: the metrics, the
        call log and the compare gate's ledger count it against the release that failed (outcome.labels),
        nobody's usage. The caller's call is recorded when it is answered."""
        attempt = Outcome(outcome.t0, outcome.api)
        attempt.labels, attempt.code, attempt.error_type, attempt.reason = outcome.labels, code, error_type, reason
        self.metrics.started(outcome.api)
        self.record(outcome.api, attempt)

    async def _send(self, backend: Backend, path: str, body: bytes, headers: list[tuple[str, str]],
                    stream: bool) -> UpstreamResponse:
        """One attempt; on return `backend` is counted in flight, on error it is not."""
        client = self.client
        assert client is not None
        self.router.enter(backend)
        try:
            return await client.request(backend.endpoint, "POST", path, body=body, headers=headers, stream=stream)
        except BaseException:
            self.router.leave(backend)
            raise

    def _retry_target(self, table: RouteTable, route: Route, name: str, failed: Backend,
                      conversation: bytes | None = None) -> tuple[Backend, Track] | None:
        """A stable replica other than `failed` to retry on, or None: of the new route table if a
        promotion or rollback swapped it since this request looked (it has the runner that replaced
        the failed one)."""
        router = self.router
        current = router.table
        if current is not table:
            try:
                fresh = current.lookup(name, route.namespace)
            except AmbiguousRoute:
                return None
            if fresh is None:
                return None
            route = fresh
        other = router.other_replica(route, failed, conversation=conversation)
        return (other, "stable") if other is not None else None

    def _failed(self, exc: UpstreamError, route: Route, name: str, backend: Backend, errors: ErrorShape) -> Reply:
        who = f"runner {backend.version} of workflow {route.namespace}/{name}"
        if isinstance(exc, UpstreamConnectError):
            status, kind, message = 502, "upstream_unavailable", f"{who} is unreachable at {backend.endpoint}"
        elif isinstance(exc, UpstreamTimeout):
            status, kind, message = 504, "upstream_timeout", f"{who} did not answer within {self.request_timeout_s:g}s"
        else:
            status, kind, message = 502, "upstream_error", f"{who} failed: {exc}"
        log.debug("upstream-failed %s: %s", who, exc)
        return errors.upstream(status, kind, message)
