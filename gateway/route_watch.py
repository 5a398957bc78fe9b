"""The route watch: how a gateway running on its own follows the route table of the control plane.

The control plane (`plnt up`, later `plnt reconcile`) publishes every new `RouteTable` with the
public status list (`GET /workflows`) as one versioned document, and serves it as a long-poll:

    GET /internal/routes?after=V&epoch=E&wait=S        Authorization: Bearer INTERNAL_TOKEN
    -> 200 RouteTableDoc {epoch, version, routes, workflows}

The answer comes as soon as the publisher's version is newer than `after` (or at once when `epoch`
is not the publisher's: it restarted, so its versions started again), else after `wait` seconds
(capped at 30) with the current doc, whose version the follower already has. 503 while nothing
was published yet; 401/403 without the internal (or an admin) token; 404 when the control plane
has no internal token configured (`--internal-token-file`).

The publisher holds each version as a `Published` snapshot (the table's own `Route`s, cheap to
compare on every status change; its JSON made once, when a follower first asks); the wire model
`RouteTableDoc` is what followers parse and check.

A gateway (`RouteFollower`) loops on it and swaps each new table into its `Router` in one
assignment; on any failure it keeps the table it has and retries with capped, jittered backoff.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal, TypeVar

import httpx
import pydantic_core
from fastapi import Request
from fastapi.responses import JSONResponse, Response
from plnt.core.auth import INTERNAL, Grant, TokenSet, missing_scope_message
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.specs.models import GatewayPolicySpec
from plnt.gateway.router import Router
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

log = logging.getLogger("plnt.gateway.route_watch")

MAX_WAIT_S = 30.0
DEFAULT_WAIT_S = 25.0
# A table of thousands of workflows is a few MiB; anything far bigger is not a route table.
MAX_DOC_BYTES = 32 * 2**20
MAX_ROUTES = 100_000
MIN_POLL_S = 1.0  # a follower asks at most this often when nothing changes


class RouteDocError(ValueError):
    """A route table document that must not be served (the follower keeps its last table)."""


# --- the wire format ------------------------------------------------------------------------------

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
_ENDPOINT = r"^https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?$"


class BackendDoc(BaseModel):
    model_config = _STRICT

    # The gateway connects to it: only http(s)://host[:port], no credentials, no path. A pattern, not
    # urlsplit: checked in pydantic-core, it keeps a 1,000-route doc's parse at a few ms.
    endpoint: str = Field(max_length=2048, pattern=_ENDPOINT)
    version: str = Field(min_length=1, max_length=256)
    release_id: str = Field(min_length=1, max_length=512)


class RouteDoc(BaseModel):
    model_config = _STRICT

    namespace: str = Field(min_length=1, max_length=253)
    name: str = Field(min_length=1, max_length=253)
    stable: BackendDoc | None = None
    canary: BackendDoc | None = None
    # The wire's name for Route.traffic_percent (older plnt processes read and write it)
    canary_percent: int = Field(default=0, ge=0, le=100)
    stable_replicas: tuple[BackendDoc, ...] = ()
    protocol: Literal["runner", "openai"] = "runner"
    # canary.headerRoute: [lower-case header name, value] (absent on the wire when there is none)
    canary_header: tuple[str, str] | None = None
    shadow_percent: int = Field(default=0, ge=0, le=100)
    # A ModelDeployment's spec.fallback (absent on the wire when there is none)
    fallback: str | None = Field(default=None, min_length=1, max_length=253)

    @field_validator("namespace", "name")
    @classmethod
    def _no_slash(cls, value: str) -> str:
        if "/" in value:
            raise ValueError(f"must not contain '/', got {value!r}")
        return value


class RouteTableDoc(BaseModel):
    """One published route table: what `GET /internal/routes` answers."""

    model_config = _STRICT

    kind: Literal["RouteTable"] = "RouteTable"
    epoch: str = Field(min_length=1, max_length=64)  # random per publisher start
    version: int = Field(ge=0)  # grows with each content change within one epoch
    routes: tuple[RouteDoc, ...] = Field(default=(), max_length=MAX_ROUTES)
    workflows: tuple[dict[str, Any], ...] = Field(default=(), max_length=MAX_ROUTES)  # GET /workflows rows
    # The GatewayPolicy of the reconciled commit (quotas and prices); absent: none (an older publisher too).
    policy: GatewayPolicySpec | None = None

    @field_validator("workflows")
    @classmethod
    def _rows(cls, rows: tuple[dict[str, Any], ...]) -> tuple[dict[str, Any], ...]:
        for index, row in enumerate(rows):
            if not isinstance(row.get("name"), str) or not isinstance(row.get("namespace"), str):
                raise ValueError(f"workflows[{index}] needs string 'name' and 'namespace'")
        return rows

    def to_table(self) -> RouteTable:
        """The gateway's table; RouteDocError if the routes do not make one (duplicates, a stable that is
        not the first of its replicas, ...)."""
        try:
            return RouteTable((_route(r) for r in self.routes), self.policy)
        except ValueError as exc:
            raise RouteDocError(f"route table version {self.version}: {exc}") from None

    def same_content(self, other: RouteTableDoc) -> bool:
        return self.routes == other.routes and self.workflows == other.workflows and self.policy == other.policy


def _backend(doc: BackendDoc | None) -> Backend | None:
    return None if doc is None else Backend(doc.endpoint, doc.version, doc.release_id)


def _route(doc: RouteDoc) -> Route:
    return Route(namespace=doc.namespace, name=doc.name, stable=_backend(doc.stable), canary=_backend(doc.canary),
                 traffic_percent=doc.canary_percent, protocol=doc.protocol, canary_header=doc.canary_header,
                 shadow_percent=doc.shadow_percent, fallback=doc.fallback,
                 stable_replicas=tuple(Backend(b.endpoint, b.version, b.release_id) for b in doc.stable_replicas))


def _backend_doc(backend: Backend | None) -> BackendDoc | None:
    if backend is None:
        return None
    # model_construct: the publisher's own tables (Route checked them); followers validate what they get.
    return BackendDoc.model_construct(endpoint=backend.endpoint, version=backend.version, release_id=backend.release_id)


def routes_doc(table: RouteTable) -> tuple[RouteDoc, ...]:
    """The wire form of a table's routes, in a stable order (so equal tables give equal docs)."""
    routes = sorted(table, key=lambda r: (r.namespace, r.name))
    return tuple(
        RouteDoc.model_construct(
            namespace=r.namespace, name=r.name, stable=_backend_doc(r.stable), canary=_backend_doc(r.canary),
            canary_percent=r.traffic_percent, stable_replicas=tuple(_backend_doc(x) for x in r.stable_replicas),
            protocol=r.protocol, canary_header=r.canary_header, shadow_percent=r.shadow_percent, fallback=r.fallback)
        for r in routes
    )


def _problem(error: Any) -> str:
    if error["type"] == "string_pattern_mismatch" and error["loc"][-1] == "endpoint":
        return f"endpoint must be http(s)://HOST[:PORT] with nothing after it, got {error['input']!r}"[:300]
    return str(error["msg"])


def parse_doc_and_table(raw: bytes | str) -> tuple[RouteTableDoc, RouteTable]:
    """A doc from JSON, checked hard, and the table it makes: RouteDocError naming the first problems
    otherwise (a doc that makes no table is refused as a whole)."""
    try:
        doc = RouteTableDoc.model_validate_json(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {_problem(e)}"
                             for e in exc.errors()[:5])
        raise RouteDocError(f"malformed route table document: {problems}") from None
    return doc, doc.to_table()


def parse_doc(raw: bytes | str) -> RouteTableDoc:
    return parse_doc_and_table(raw)[0]


# --- the control plane's side -----------------------------------------------------------------------


def _backend_json(backend: Backend | None) -> dict[str, str] | None:
    if backend is None:
        return None
    return {"endpoint": backend.endpoint, "version": backend.version, "release_id": backend.release_id}


@dataclass(frozen=True, eq=False)
class Published:
    """One version as the publisher holds it: the table's own routes (cheap to compare on every
    status change) and, made once when a follower first asks, its JSON (a `RouteTableDoc`)."""

    epoch: str
    version: int
    routes: tuple[Route, ...]  # sorted by namespace, name
    workflows: tuple[dict[str, Any], ...]
    policy: GatewayPolicySpec | None = None

    def to_table(self) -> RouteTable:
        return RouteTable(self.routes, self.policy)

    @cached_property
    def endpoints(self) -> frozenset[str]:
        """Every runner endpoint this version routes to (a drain waits for one without its runner)."""
        return table_endpoints(self.routes)

    @cached_property
    def json(self) -> bytes:
        # pydantic-core's serializer: ~2x json.dumps on a 1,000-route table (about 5 ms).
        return pydantic_core.to_json({
            "kind": "RouteTable", "epoch": self.epoch, "version": self.version,
            "routes": [{"namespace": r.namespace, "name": r.name, "stable": _backend_json(r.stable),
                        "canary": _backend_json(r.canary), "canary_percent": r.traffic_percent,
                        "stable_replicas": [_backend_json(b) for b in r.stable_replicas],
                        **({"protocol": r.protocol} if r.protocol != "runner" else {}),
                        **({"canary_header": list(r.canary_header)} if r.canary_header else {}),
                        **({"shadow_percent": r.shadow_percent} if r.shadow_percent else {}),
                        **({"fallback": r.fallback} if r.fallback else {})} for r in self.routes],
            "workflows": list(self.workflows),
            **({"policy": self.policy.model_dump(mode="json", by_alias=True)} if self.policy is not None else {}),
        }, fallback=str)

    def to_doc(self) -> RouteTableDoc:
        """The wire form, checked as a follower checks it."""
        return parse_doc(self.json)


def table_endpoints(routes: Iterable[Route]) -> frozenset[str]:
    """The runner endpoints a table's routes name (stable replicas and canaries)."""
    return frozenset(b.endpoint for r in routes for b in (*r.stable_replicas, r.canary) if b is not None)


# A follower whose last poll ended this long ago, with no poll open since, is gone (killed, or cut off
# from the control plane: a drain cannot wait for it). A live one polls again within milliseconds.
FOLLOWER_GONE_S = 5.0
MAX_FOLLOWERS = 10_000  # distinct follower ids kept (a gateway fleet is far smaller)


@dataclass
class FollowerMark:
    """What one following gateway process said with its last poll: the version it serves and the
    newest version it has drained (no request of its own in flight to a runner that version dropped)."""

    epoch: str | None
    applied: int
    drained: int
    polls_open: int = 0
    seen: float = 0.0  # monotonic: when a poll of it last began or ended


@dataclass(frozen=True)
class DrainOutcome:
    """How a wait for gateways to let go of one runner ended."""

    drained: bool
    waited_s: float
    version: int | None  # the first published version without the runner
    followers: int  # live following gateway processes waited for
    lagging: tuple[str, ...] = ()  # what was still holding on at the bound

    def describe(self) -> str:
        if self.drained:
            return f"drained in {self.waited_s:.2f}s (routes version {self.version}, {self.followers} following gateways)"
        return f"not drained after {self.waited_s:.1f}s: {', '.join(self.lagging)}"


class RoutePublisher:
    """Holds the current version and wakes long-polls when it changes.

    `publish` may be called from any thread (status changes come from activities); waiters live on
    the event loop that first called `wait_newer`.

    It also keeps what each following gateway process reported with its polls (`follower=ID`,
    `after=V`: it serves V; `drained=D`: none of its requests is still on a runner D dropped), so that
    a runner leaving the routes is stopped only once every gateway has let go of it (`wait_released`).
    """

    def __init__(self, epoch: str | None = None) -> None:
        self.epoch = epoch or secrets.token_hex(8)
        self._lock = threading.Lock()
        self._doc: Published | None = None
        self._changed = asyncio.Event()  # replaced on every change; the old one is set
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._followers: dict[str, FollowerMark] = {}
        self._followed = asyncio.Event()  # like _changed, for follower marks (only touched on the loop)

    @property
    def doc(self) -> Published | None:
        return self._doc

    @property
    def closed(self) -> bool:
        return self._closed

    def publish(self, table: RouteTable, workflows: list[dict[str, Any]]) -> Published:
        """Make `table` (and the status rows) current; the version grows only if the content changed."""
        routes = tuple(sorted(table, key=lambda r: (r.namespace, r.name)))
        rows = tuple(workflows)
        with self._lock:
            current = self._doc
            if (current is not None and current.routes == routes and current.workflows == rows
                    and current.policy == table.policy):
                return current
            version = 1 if current is None else current.version + 1
            doc = self._doc = Published(self.epoch, version, routes, rows, table.policy)
            changed, self._changed = self._changed, asyncio.Event()
        self._wake(changed)
        return doc

    def close(self) -> None:
        """Answer every waiting long-poll now (a server stopping must not wait out 25 s polls)."""
        with self._lock:
            self._closed = True
            changed, self._changed = self._changed, asyncio.Event()
        self._wake(changed)

    def _wake(self, event: asyncio.Event) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return  # nobody ever waited
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            event.set()
        else:
            loop.call_soon_threadsafe(event.set)

    # --- followers and drains (called on the event loop) -----------------------------------------------

    def poll_began(self, follower: str, *, epoch: str | None, applied: int, drained: int) -> None:
        mark = self._followers.get(follower)
        if mark is None:
            if len(self._followers) >= MAX_FOLLOWERS:
                self._forget_gone(time.monotonic())
            mark = self._followers[follower] = FollowerMark(epoch, applied, drained)
        mark.epoch, mark.applied, mark.drained = epoch, applied, min(drained, applied)
        mark.polls_open += 1
        mark.seen = time.monotonic()
        self._follower_moved()

    def poll_ended(self, follower: str) -> None:
        mark = self._followers.get(follower)
        if mark is not None:
            mark.polls_open = max(0, mark.polls_open - 1)
            mark.seen = time.monotonic()
            self._follower_moved()

    def followers(self) -> dict[str, FollowerMark]:
        return dict(self._followers)

    def _follower_moved(self) -> None:
        moved, self._followed = self._followed, asyncio.Event()
        moved.set()

    def _forget_gone(self, now: float) -> None:
        for follower, mark in list(self._followers.items()):
            if mark.polls_open == 0 and now - mark.seen > FOLLOWER_GONE_S:
                del self._followers[follower]

    def _lagging(self, version: int, now: float) -> list[str]:
        """Live followers that have not drained `version` yet."""
        self._forget_gone(now)
        return [f"gateway {follower} (serves routes version {mark.applied}, drained {mark.drained})"
                for follower, mark in self._followers.items()
                if not (mark.epoch == self.epoch and mark.drained >= version)]

    async def wait_released(self, endpoint: str, timeout_s: float) -> DrainOutcome:
        """Wait, at most `timeout_s`, until a published version routes nothing to `endpoint` and every
        following gateway process serves it with none of its requests still on that runner."""
        started = time.monotonic()
        deadline = started + max(0.0, timeout_s)
        self._loop = asyncio.get_running_loop()
        while True:  # the routes may not have let go yet (a status or a worker's report still on its way)
            with self._lock:
                doc, changed = self._doc, self._changed
            if doc is not None and endpoint not in doc.endpoints:
                break
            if not await _until(changed, deadline):
                return DrainOutcome(False, time.monotonic() - started, None, len(self._followers),
                                    (f"the routes still name {endpoint}",))
        version = doc.version
        while True:
            now = time.monotonic()
            lagging = self._lagging(version, now)
            if not lagging:
                return DrainOutcome(True, now - started, version, len(self._followers))
            # Woken by any follower's poll; at least once a second, so a gone follower is let go of.
            if not await _until(self._followed, min(deadline, now + 1.0)) and time.monotonic() >= deadline:
                return DrainOutcome(False, time.monotonic() - started, version, len(self._followers), tuple(lagging))

    async def wait_newer(self, after: int, timeout_s: float, *, epoch: str | None = None) -> Published | None:
        """The doc as soon as its version is > `after` (at once if `epoch` is given and not ours), else
        the current doc after `timeout_s`; None if nothing was published by then."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            with self._lock:
                doc, changed, closed = self._doc, self._changed, self._closed
            if doc is not None and ((epoch is not None and epoch != doc.epoch) or doc.version > after):
                return doc
            remaining = deadline - time.monotonic()
            if remaining <= 0 or closed:
                return doc
            try:
                async with asyncio.timeout(remaining):
                    await changed.wait()
            except TimeoutError:
                return self._doc


async def _read_request(request: Request, shape: type[_Asked], max_bytes: int, what: str) -> _Asked | Response:
    """The request's JSON body as `shape`, or the 413/400 answer that names what was expected."""
    body = await read_at_most(request, max_bytes)
    if body is None:
        return _json(413, "too_large", f"{what} is at most {max_bytes} bytes")
    try:
        return shape.model_validate_json(body)
    except ValidationError as exc:
        return _json(400, "bad_request", f"expected {{{', '.join(shape.model_fields)}}}: {exc.errors()[0]['msg']}")


async def _until(event: asyncio.Event, deadline: float) -> bool:
    """True once `event` is set, False at the (monotonic) deadline."""
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return event.is_set()
    try:
        async with asyncio.timeout(remaining):
            await event.wait()
    except TimeoutError:
        return False
    return True


def _json(status: int, kind: str, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message}}, status_code=status, headers=headers)


InternalGuard = Callable[[Request, str], "Response | None"]


async def read_at_most(request: Request, limit: int) -> bytes | None:
    """The body of an `/internal/` request, or None once it passes `limit` bytes (answer 413)."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def internal_guard(app: Any, internal_token: str | None) -> InternalGuard:
    """The check in front of every `/internal/` endpoint of a control plane, whether or not the app
    has tokens: the internal token (scope `internal`) or an admin token of the app. Returns the
    refusal to send, or None. Without an internal token configured every such endpoint answers 404."""
    internal = TokenSet([(internal_token, Grant(frozenset(), frozenset({INTERNAL})))]) if internal_token else TokenSet()

    def check(request: Request, what: str) -> Response | None:
        if not internal.enabled:
            return _json(404, "not_found", f"{what} is off: start the control plane with --internal-token-file FILE "
                         "(the same token `plnt gateway` and `plnt worker` send)")
        authorization = request.headers.get("authorization")
        presented = authorization.encode("latin-1") if authorization is not None else None
        grant = internal.check_header(presented) or app.gateway.tokens.check_header(presented)
        if grant is None:
            message = "invalid bearer token" if presented else "missing bearer token: send the internal token"
            return _json(401, "unauthorized", message, {"www-authenticate": 'Bearer realm="plnt"'})
        if not grant.has(INTERNAL):
            return _json(403, "forbidden", missing_scope_message(INTERNAL, what)
                         .replace("give it `scopes=internal` (with its other scopes) in the token file",
                                  "use the internal token (--internal-token-file) or an admin token"))
        return None

    return check


_FOLLOWER_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class DrainRequest(BaseModel):
    """`POST /internal/drain`: wait until no gateway routes to, or has a request on, one runner
    (what a `plnt worker` asks before it stops a runner that left the routes). `leaving`: the runner
    is a Helm release the worker is about to uninstall, which only the control plane's own reads
    would take out of the routes: it takes it out first. `release_id`: which release there leaves (a
    newer worker says so), kept out even when the control plane has not read it yet."""

    model_config = _STRICT

    endpoint: str = Field(max_length=2048, pattern=_ENDPOINT)
    timeout_s: float = Field(gt=0, le=600)
    leaving: bool = False
    release_id: str | None = Field(default=None, min_length=1, max_length=512)


MAX_DRAIN_BODY = 4096


async def release_everywhere(publisher: RoutePublisher, router: Router, endpoint: str, timeout_s: float) -> DrainOutcome:
    """A runner leaving the routes is let go of everywhere: by this process's own requests (`router`)
    and by every gateway process following `publisher`. At most `timeout_s`."""
    own, followers = await asyncio.gather(router.drain_endpoint(endpoint, timeout_s=timeout_s),
                                          publisher.wait_released(endpoint, timeout_s))
    if own:
        return followers
    return DrainOutcome(False, followers.waited_s, followers.version, followers.followers,
                        ("this process's own requests", *followers.lagging))


class WakeRequest(BaseModel):
    """`POST /internal/wake`: start the parked runner of one release again (scale to zero)."""

    model_config = _STRICT

    namespace: str = Field(min_length=1, max_length=253)
    name: str = Field(min_length=1, max_length=253)
    release_id: str = Field(min_length=1, max_length=512)


_Asked = TypeVar("_Asked", bound=BaseModel)


MAX_WAKE_BODY = 4096


def add_control_routes(app: Any, publisher: RoutePublisher, internal_token: str | None,
                       wake: Callable[[str, str, str], Awaitable[str | None]] | None = None,
                       leaving: Callable[[str, str | None], object] | None = None) -> None:
    """Mount `GET /internal/routes` on a gateway app (plnt up's, or the reconcile role's), and with
    `wake`, `POST /internal/wake` (what plnt up's gateway workers ask when a runner parked); their
    auth is `internal_guard`'s. `leaving(endpoint, release_id)`: takes a release a worker uninstalls
    out of the routes and publishes them (a drain request's `leaving`)."""
    guard = internal_guard(app, internal_token)

    if wake is not None:
        @app.post("/internal/wake", include_in_schema=False)
        async def internal_wake(request: Request) -> Response:
            """200 {"endpoint"} once the release's runner serves again; 404 when it did not park."""
            if (refused := guard(request, "POST /internal/wake")) is not None:
                return refused
            asked = await _read_request(request, WakeRequest, MAX_WAKE_BODY, "a wake request")
            if isinstance(asked, Response):
                return asked
            endpoint = await wake(asked.namespace, asked.name, asked.release_id)
            if endpoint is None:
                return _json(404, "not_parked", f"release {asked.release_id} of {asked.namespace}/{asked.name} is not "
                             "a parked runner plnt can start")
            return JSONResponse({"endpoint": endpoint})

    @app.post("/internal/drain", include_in_schema=False)
    async def internal_drain(request: Request) -> Response:
        """200 {drained, waited_s, version, followers, lagging} once every gateway let go of the
        runner at `endpoint`, or at `timeout_s` (then drained is false and lagging says who holds on)."""
        if (refused := guard(request, "POST /internal/drain")) is not None:
            return refused
        asked = await _read_request(request, DrainRequest, MAX_DRAIN_BODY, "a drain request")
        if isinstance(asked, Response):
            return asked
        if asked.leaving and leaving is not None:
            leaving(asked.endpoint, asked.release_id)
        outcome = await release_everywhere(publisher, app.gateway.router, asked.endpoint, asked.timeout_s)
        return JSONResponse({"drained": outcome.drained, "waited_s": round(outcome.waited_s, 3),
                             "version": outcome.version, "followers": outcome.followers,
                             "lagging": list(outcome.lagging)})

    @app.get("/internal/routes", include_in_schema=False)
    async def internal_routes(request: Request) -> Response:
        if (refused := guard(request, "GET /internal/routes")) is not None:
            return refused
        query = request.query_params
        follower = query.get("follower") or None
        try:
            after = int(query.get("after", "-1"))
            drained = int(query.get("drained", "-1"))
            wait = float(query.get("wait", str(DEFAULT_WAIT_S)))
            if not wait >= 0:  # also refuses NaN
                raise ValueError("wait must be >= 0")
            if follower is not None and not _FOLLOWER_ID.fullmatch(follower):
                raise ValueError("follower must be 1 to 64 letters, digits, '-' or '_'")
        except ValueError as exc:
            return _json(400, "bad_request", f"after=INT&epoch=STR&wait=SECONDS[&follower=ID&drained=INT] expected: {exc}")
        epoch = query.get("epoch") or None
        if follower is None:  # a gateway that does not report what it drained: not waited for
            doc = await publisher.wait_newer(after, min(wait, MAX_WAIT_S), epoch=epoch)
        else:
            publisher.poll_began(follower, epoch=epoch, applied=after, drained=drained)
            try:
                doc = await publisher.wait_newer(after, min(wait, MAX_WAIT_S), epoch=epoch)
            finally:
                publisher.poll_ended(follower)
        if publisher.closed:
            return _json(503, "stopping", "the control plane is stopping; retry", {"retry-after": "2"})
        if doc is None:
            return _json(503, "no_route_table", "no route table published yet; retry", {"retry-after": "1"})
        # Serialised once per version, off the loop (a 1,000-route table takes a few ms).
        raw = doc.__dict__.get("json") or await asyncio.to_thread(lambda: doc.json)
        return Response(raw, media_type="application/json")


# --- the gateway's side ---------------------------------------------------------------------------------


class ControlWaker:
    """A gateway's `wake` (gateway/app.py) through the control plane: `POST {control_url}/internal/wake`."""

    def __init__(self, control_url: str, token: str, timeout_s: float = 60.0) -> None:
        self.url = f"{control_url.rstrip('/')}/internal/wake"
        self._headers = {"authorization": f"Bearer {token}"}
        self._client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(timeout_s, connect=5.0))

    async def __call__(self, namespace: str, name: str, release_id: str) -> str | None:
        response = await self._client.post(self.url, headers=self._headers, json={
            "namespace": namespace, "name": name, "release_id": release_id})
        if response.status_code == 404:  # did not park, or a control plane that does not wake runners
            return None
        if response.status_code != 200:
            raise FollowError(f"POST {self.url} answered {response.status_code}: {_error_message(response.text[:500])}")
        endpoint = response.json().get("endpoint")
        if not isinstance(endpoint, str) or not re.match(_ENDPOINT, endpoint):
            raise FollowError(f"POST {self.url}: no valid endpoint in the answer")
        return endpoint

    async def aclose(self) -> None:
        await self._client.aclose()



class FollowError(Exception):
    """One failed watch request (the reason is logged, never the token)."""


class RouteFollower:
    """Follows `GET {control_url}/internal/routes` and swaps each new table into `router`."""

    def __init__(
        self,
        control_url: str,
        token: str,
        router: Router,
        *,
        wait_s: float = DEFAULT_WAIT_S,
        backoff_initial_s: float = 0.5,
        backoff_max_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.control_url = control_url.rstrip("/")
        self._headers = {"authorization": f"Bearer {token}"}
        self.router = router
        self.wait_s = min(wait_s, MAX_WAIT_S)
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        # The answer may take `wait_s`; past it plus a margin, the control plane is hung, not polling.
        self._client = client or httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(self.wait_s + 5.0, connect=5.0))
        self._own_client = client is None
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.doc: RouteTableDoc | None = None
        self.received_at: float | None = None  # wall clock of the last doc taken
        self.connected = False
        self.unreachable_since: float | None = None  # wall clock of the first failure of this outage
        self.last_error: str | None = None
        self.failures = 0  # in a row
        # Reported with each poll, so the control plane stops a runner only once this process let go of
        # it: who we are, and the newest version (of our epoch) none of our requests is behind.
        self.follower_id = secrets.token_hex(8)
        self._drained = -1
        self._endpoints: frozenset[str] = frozenset()  # what the current table routes to
        self._stale_watch: asyncio.Future[Any] | None = None
        self._report_now = asyncio.Event()  # our requests on a dropped runner ended: say so at once

    # state ------------------------------------------------------------------------------------------

    @property
    def has_table(self) -> bool:
        return self.doc is not None

    def workflows(self) -> list[dict[str, Any]]:
        return [dict(row) for row in self.doc.workflows] if self.doc is not None else []

    def state(self) -> dict[str, Any]:
        """For /healthz: what table is served and whether the control plane answers."""
        return {
            "control_url": self.control_url,
            "routes_version": self.doc.version if self.doc else None,
            "routes_epoch": self.doc.epoch if self.doc else None,
            "routes": len(self.doc.routes) if self.doc else 0,
            "received_at": self.received_at,
            "control": "connected" if self.connected else "unreachable" if self.unreachable_since else "connecting",
            "unreachable_since": self.unreachable_since,
            "last_error": self.last_error,
        }

    # the loop -----------------------------------------------------------------------------------------

    def backoff_s(self) -> float:
        """Capped exponential with jitter: half the step fixed, half random, so a fleet of gateways
        does not retry in lockstep after the control plane comes back."""
        step = min(self.backoff_max_s, self.backoff_initial_s * 2 ** min(self.failures - 1, 30))
        return step / 2 + self._rng.random() * step / 2

    async def run(self) -> None:
        """Follow until cancelled."""
        try:
            while True:
                started = time.monotonic()
                self._report_now.clear()
                poll = asyncio.ensure_future(self.poll_once())
                report = asyncio.ensure_future(self._report_now.wait())
                try:
                    await asyncio.wait({poll, report}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    report.cancel()
                    if not poll.done():  # (also when run itself is cancelled)
                        poll.cancel()
                        await asyncio.gather(poll, return_exceptions=True)
                if poll.cancelled():
                    continue  # a runner we dropped has no request of ours left: poll again, saying so
                try:
                    taken = poll.result()
                except FollowError as exc:
                    self._failed(str(exc))
                    await self._sleep(self.backoff_s())
                    continue
                # An answer with nothing new long before `wait_s` is not how the watch behaves (a
                # proxy that ends long-polls early?): pace it rather than spin.
                elapsed = time.monotonic() - started
                if not taken and elapsed < MIN_POLL_S:
                    await self._sleep(MIN_POLL_S - elapsed)
        finally:
            if self._own_client:
                await self._client.aclose()

    async def poll_once(self) -> bool:
        """One watch request; True if a new table was taken. FollowError on any failure."""
        params: dict[str, str] = {"after": str(self.doc.version if self.doc else -1),
                                  "wait": f"{self.wait_s:g}", "follower": self.follower_id,
                                  "drained": str(self.drained_version())}
        if self.doc is not None:
            params["epoch"] = self.doc.epoch
        url = f"{self.control_url}/internal/routes"
        try:
            async with self._client.stream("GET", url, params=params, headers=self._headers) as response:
                if response.status_code != 200:
                    body = (await _head(response, 500)).decode("utf-8", "replace")
                    hint = ("; check --internal-token-file: it must hold the control plane's internal token"
                            if response.status_code in (401, 403) else "")
                    raise FollowError(f"GET {url} answered {response.status_code}: {_error_message(body)}{hint}")
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > MAX_DOC_BYTES:
                        raise FollowError(f"GET {url}: route table document over {MAX_DOC_BYTES} bytes")
                    chunks.append(chunk)
        except httpx.HTTPError as exc:
            raise FollowError(f"GET {url}: {type(exc).__name__}: {exc or 'no detail'}") from None
        try:
            # Off the loop: a 1,000-route doc takes tens of ms to check and build, which the loop then
            # shares in GIL slices instead of stalling invocations for all of it.
            doc, table = await asyncio.to_thread(parse_doc_and_table, b"".join(chunks))
        except RouteDocError as exc:
            raise FollowError(f"GET {url}: {exc}; keeping route table version "
                              f"{self.doc.version if self.doc else '(none)'}") from None
        self._reachable()
        return self.take(doc, table)

    def take(self, doc: RouteTableDoc, table: RouteTable | None = None) -> bool:
        """Serve `doc` if it is newer than ours (or from another epoch). One assignment swaps the table."""
        current = self.doc
        if current is not None and doc.epoch == current.epoch and doc.version <= current.version:
            return False
        if table is None:
            table = doc.to_table()
        self.router.replace(table)
        if current is not None and doc.epoch != current.epoch:
            self._drained = -1  # versions start again: what we drained of the old epoch says nothing
        self._endpoints = table_endpoints(table)
        self.doc = doc
        self.received_at = time.time()
        log.info("routes-updated version=%d epoch=%s routes=%d%s", doc.version, doc.epoch, len(doc.routes),
                 " (control plane restarted: new epoch)" if current is not None and doc.epoch != current.epoch else "")
        return True

    def drained_version(self) -> int:
        """The newest version of our table's epoch that none of our requests is behind: the current
        one once no request of ours is on a runner it dropped (requests pick runners from the current
        table only, so such requests only end). Until then the last such version, and a watch on
        those requests reports the new one when they end."""
        if self.doc is None:
            return -1
        behind = self.router.endpoints_in_flight() - self._endpoints
        if not behind:
            self._drained = self.doc.version
        elif self._stale_watch is None or self._stale_watch.done():
            self._stale_watch = asyncio.ensure_future(self._watch_behind(behind))
        return self._drained

    async def _watch_behind(self, endpoints: frozenset[str]) -> None:
        await asyncio.gather(*(self.router.drain_endpoint(e) for e in endpoints))
        self._report_now.set()

    def _failed(self, reason: str) -> None:
        self.failures += 1
        self.connected = False
        self.last_error = reason
        if self.unreachable_since is None:
            self.unreachable_since = time.time()
            serving = (f"serving route table version {self.doc.version}" if self.doc
                       else "no route table yet: invocations get 503")
            log.warning("control-unreachable url=%s: %s; %s; retrying with backoff up to %gs",
                        self.control_url, reason, serving, self.backoff_max_s)
        else:
            log.debug("control-still-unreachable: %s", reason)

    def _reachable(self) -> None:
        if not self.connected:
            if self.unreachable_since is not None:
                log.info("control-reachable url=%s after %.1fs", self.control_url, time.time() - self.unreachable_since)
            else:
                log.info("control-reachable url=%s", self.control_url)
        self.connected = True
        self.unreachable_since = None
        self.last_error = None
        self.failures = 0


async def _head(response: httpx.Response, limit: int) -> bytes:
    """At most `limit` bytes of an error body (never the whole of an unbounded one)."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= limit:
            break
    return data[:limit]


def _error_message(body: str) -> str:
    try:
        error = json.loads(body).get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return error["message"]
    except (ValueError, AttributeError):
        pass
    return body.strip() or "(empty body)"
