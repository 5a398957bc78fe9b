"""A small HTTP/1.1 client for the gateway's hop to its runners (loopback, plain HTTP).

Why not httpx: measured on this project's 2-core machine (uvloop), an `httpx.AsyncClient`
spends 0.6 ms of CPU per small POST at concurrency 1 and 1.3 ms at concurrency 16 (its pool
lock and per-request object graph dominate). The gateway's budget is <= 1 ms *added* latency
and >= 1,000 invocations/s per core for the whole proxy hop, so that alone would exceed it.
This client is an `asyncio.Protocol` with httptools' C parser (both already installed with
uvicorn[standard]): one `transport.write` per request, one future per exchange, a pool of
keep-alive connections per runner. It only speaks what runners speak: HTTP/1.1, identity or
chunked bodies, no TLS, no redirects, no proxies.

Errors are split by what they mean for a retry:
- `UpstreamConnectError`: the connection could not be opened; nothing reached the runner,
  so the request may safely go to another replica.
- `UpstreamTimeout`: no byte from the runner for `read_timeout_s`; its subclass
  `UpstreamConnectTimeout`: the connect took longer than `connect_timeout_s`, or every pooled
  connection stayed busy (nothing was sent).
- `UpstreamBroken`: the connection broke mid-exchange; the runner may have done the work.
"""

from __future__ import annotations

import asyncio
import collections
import select
from collections.abc import AsyncIterator, Iterable
from urllib.parse import urlsplit

import httptools

__all__ = [
    "HOP_BY_HOP",
    "UpstreamBroken",
    "UpstreamClient",
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

# Pause reading from a streaming runner when this much is buffered and not yet forwarded.
_STREAM_HIGH_WATER = 256 * 1024

# Response headers the gateway relays from a runner or model server: every end-to-end header
# (x-request-id, openai-processing-ms, vary, cache-control, ratelimit ...) but these.
# Hop-by-hop (RFC 9110 7.6.1, with the older Keep-Alive, Proxy-Connection, Proxy-Authenticate):
# they describe the gateway's own connection to the runner, not the caller's.
HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"proxy-authenticate",
                        b"proxy-authorization", b"te", b"trailer", b"transfer-encoding", b"upgrade"})
_NOT_RELAYED = HOP_BY_HOP | {
    # The gateway frames the body itself (content-length, or chunked for a stream it may end with
    # an error event) and names its type itself; uvicorn sets server and date.
    b"content-length", b"content-type", b"server", b"date",
    # These act on the gateway's whole origin (every workflow, every model, the UI), for which no
    # one backend speaks: a model server has no business setting cookies there, pinning HSTS,
    # advertising other services, or challenging for credentials the gateway never forwards.
    b"set-cookie", b"set-cookie2", b"strict-transport-security", b"alt-svc", b"www-authenticate",
    # A redirect's target is the runner's loopback address.
    b"location", b"content-location",
}
# A stream's own headers are the gateway's (see UpstreamResponse.stream_cache_control).
_NOT_RELAYED_STREAM = _NOT_RELAYED | {b"cache-control", b"x-accel-buffering"}
# By prefix: the gateway's own headers (a runner must not spoof X-Plnt-Version) and CORS, whose
# preflights the gateway answers, not the backend.
_NOT_RELAYED_PREFIXES = (b"x-plnt-", b"access-control-")
# Whether to relay a header, by name, decided once per name (a runner sends the same few on every
# answer); bounded, so a runner inventing names cannot grow it: past the bound, decided each time.
_RELAY: dict[bytes, bool] = dict.fromkeys(_NOT_RELAYED, False)
_RELAY_STREAM: dict[bytes, bool] = dict.fromkeys(_NOT_RELAYED_STREAM, False)
_RELAY_MEMO_MAX = 512
# Connection values that name no other header (the common ones: no parsing for them).
_PLAIN_CONNECTION = frozenset({b"keep-alive", b"close", b"Keep-Alive", b"Close", b"upgrade", b"Upgrade"})
# A stream's cache-control directives at least as strict as the gateway's default "no-cache".
_NO_CACHE_DIRECTIVES = frozenset({b"no-cache", b"no-store"})


class UpstreamError(Exception):
    """Base class: the runner could not be reached or did not answer properly."""


class UpstreamConnectError(UpstreamError):
    """No connection: refused, unreachable. Nothing was sent."""


class UpstreamTimeout(UpstreamError):
    """Connect took too long, or the runner sent nothing for the read timeout."""


class UpstreamConnectTimeout(UpstreamTimeout):
    """No connection within the connect timeout, or none free in the pool. Nothing was sent."""


class UpstreamBroken(UpstreamError):
    """The connection closed or sent garbage mid-exchange."""


class _Conn(asyncio.Protocol):
    """One keep-alive connection; one exchange at a time."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.forgotten = False  # its pool slot was freed
        self.idle_since = 0.0
        self.busy = False
        # Exchange state.
        self.stream = False
        self.waiter: asyncio.Future[None] | None = None
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body_parts: list[bytes] = []
        self.complete = False
        self.keep_alive = False
        self.error: UpstreamError | None = None
        self.chunk_waiter: asyncio.Future[None] | None = None
        self.buffered = 0
        self.reading_paused = False
        self.last_activity = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.read_timeout_s = 0.0

    # --- asyncio.Protocol -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        if not self.busy:
            # Bytes while idle: the runner is not speaking HTTP to us; drop the connection.
            self._close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamBroken(f"invalid HTTP response from runner: {exc}"))
            self._close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._cancel_timer()
        if self.busy and not self.complete:
            if self.headers_done and self._reads_until_eof():
                self.on_message_complete()  # the close delimits the body (HTTP/1.0 style)
            else:
                reason = f": {exc}" if exc else ""
                self._fail(UpstreamBroken(f"runner closed the connection mid-response{reason}"))
        self.pool.forget(self)

    # --- httptools callbacks ------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        # After the headers, a chunked body's trailer fields: not headers, and never relayed as such.
        if not self.headers_done:
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        if self.stream:
            self._wake_waiter()

    def on_body(self, body: bytes) -> None:
        self.body_parts.append(body)
        if self.stream:
            self.buffered += len(body)
            if self.buffered > _STREAM_HIGH_WATER and not self.reading_paused and self.transport is not None:
                self.transport.pause_reading()
                self.reading_paused = True
            self._wake_chunk_waiter()

    def on_message_complete(self) -> None:
        self.complete = True
        # Only meaningful inside the parser's callbacks: llhttp resets its flags afterwards.
        self.keep_alive = self.parser.should_keep_alive()
        self._cancel_timer()
        if self.stream:
            self._wake_waiter()  # a body-less response completes without on_body
            self._wake_chunk_waiter()
        else:
            self._wake_waiter()

    # --- exchange -----------------------------------------------------------------------------

    def start(self, request: bytes, *, stream: bool, read_timeout_s: float) -> asyncio.Future[None]:
        assert self.transport is not None
        self.busy = True
        self.stream = stream
        self.status = 0
        self.headers = []
        self.headers_done = False
        self.body_parts = []
        self.complete = False
        self.keep_alive = False
        self.error = None
        self.buffered = 0
        self.read_timeout_s = read_timeout_s
        self.last_activity = self.loop.time()
        self.waiter = self.loop.create_future()
        self.timer = self.loop.call_at(self.last_activity + read_timeout_s, self._on_timer)
        self.transport.write(request)
        return self.waiter

    def take_chunks(self) -> list[bytes]:
        parts, self.body_parts = self.body_parts, []
        self.buffered = 0
        self.last_activity = self.loop.time()  # a slow reader downstream is not a silent runner
        if self.reading_paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self.reading_paused = False
        return parts

    async def wait_chunk(self) -> None:
        if self.body_parts or self.complete or self.error is not None:
            return
        self.chunk_waiter = self.loop.create_future()
        try:
            await self.chunk_waiter
        finally:
            self.chunk_waiter = None

    def finish(self) -> None:
        """The exchange is over: back to the pool if reusable, else closed."""
        self._cancel_timer()
        self.busy = False
        self.waiter = None
        if self.complete and self.keep_alive and self.error is None and not self.closed:
            self.pool.release(self)
        else:
            self._close()
            self.pool.forget(self)

    def abort(self) -> None:
        """Drop the connection mid-exchange; whoever waits on it gets UpstreamBroken."""
        self._cancel_timer()
        if self.busy and not self.complete:
            self._fail(UpstreamBroken("exchange abandoned"))
        self.busy = False
        self._close()
        self.pool.forget(self)

    # --- internals ----------------------------------------------------------------------------

    def _reads_until_eof(self) -> bool:
        names = {name for name, _ in self.headers}
        return b"content-length" not in names and b"transfer-encoding" not in names

    def _wake_waiter(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_chunk_waiter(self) -> None:
        waiter = self.chunk_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: UpstreamError) -> None:
        if self.error is not None or self.complete:
            return
        self.error = error
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)
        self._wake_chunk_waiter()

    def _on_timer(self) -> None:
        # Idle timer: re-armed lazily, so a busy stream costs no timer churn per chunk.
        self.timer = None
        if not self.busy or self.complete:
            return
        deadline = self.last_activity + self.read_timeout_s
        now = self.loop.time()
        if now < deadline:
            self.timer = self.loop.call_at(deadline, self._on_timer)
            return
        self._fail(UpstreamTimeout(f"runner sent nothing for {self.read_timeout_s:g}s"))
        self._close()

    def _cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class _Pool:
    """Keep-alive connections to one runner (host, port)."""

    def __init__(self, client: UpstreamClient, host: str, port: int) -> None:
        self.client = client
        self.loop = client.loop
        self.host = host
        self.port = port
        self.authority = f"{host}:{port}".encode()
        self.idle: list[_Conn] = []  # LIFO: the most recently used connection is the warmest
        self.open = 0  # connections counted against max_connections (idle or busy or connecting)
        self.waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    async def acquire(self) -> _Conn:
        now = self.loop.time()
        expiry = self.client.keepalive_expiry_s
        while self.idle:
            conn = self.idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if _readable(conn):
                # An idle connection has nothing to say: readable means the runner closed it (it
                # stopped or died) and the loop has not seen it yet. Written to, the request would
                # fail in a way that cannot be retried (it may have reached the runner).
                conn._close()
                self.forget(conn)
                continue
            if now - conn.idle_since > expiry:
                # The runner (uvicorn: 5 s keep-alive) may be closing it right now; a request
                # written onto a closing connection fails in a way that cannot be retried.
                conn._close()
                self.forget(conn)
                continue
            return conn
        while self.open >= self.client.max_connections:
            # All connections busy: wait for one (as long as for a silent runner, then 504).
            waiter = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(self.client.read_timeout_s):  # (not wait_for: see _connect)
                    await waiter
            except TimeoutError:
                raise UpstreamConnectTimeout(
                    f"all {self.client.max_connections} connections to {self.host}:{self.port} stayed busy "
                    f"for {self.client.read_timeout_s:g}s"
                ) from None
            finally:
                if waiter in self.waiters:
                    self.waiters.remove(waiter)
            if self.idle:
                return await self.acquire()
        self.open += 1
        try:
            return await self._connect()
        except BaseException:
            self._drop()
            raise

    async def _connect(self) -> _Conn:
        conn = _Conn(self)
        try:
            # Not asyncio.wait_for: on 3.11 a cancel landing in the turn the connect ends is dropped
            # (the connect's outcome is returned), and a cancelled health poll polls on.
            async with asyncio.timeout(self.client.connect_timeout_s):
                await self.loop.create_connection(lambda: conn, self.host, self.port)
        except TimeoutError:
            raise UpstreamConnectTimeout(
                f"connecting to {self.host}:{self.port} took over {self.client.connect_timeout_s:g}s"
            ) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return conn

    def release(self, conn: _Conn) -> None:
        conn.idle_since = self.loop.time()
        self.idle.append(conn)
        self._wake_one()

    def forget(self, conn: _Conn) -> None:
        """A connection closed (by either side); free its slot once."""
        if conn.forgotten:
            return
        conn.forgotten = True
        self._drop()

    def _drop(self) -> None:
        self.open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def close(self) -> None:
        for conn in self.idle:
            conn._close()
        self.idle.clear()


class UpstreamResponse:
    """Status and headers of a runner's answer; the body buffered (`body`) or streamed (`chunks`)."""

    __slots__ = ("_conn", "body", "headers", "status")

    def __init__(self, conn: _Conn | None, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self.body = body

    def header(self, name: bytes, default: bytes | None = None) -> bytes | None:
        for key, value in self.headers:
            if key == name:
                return value
        return default

    def relayed_headers(self, *, stream: bool = False) -> list[tuple[bytes, bytes]]:
        """The runner's end-to-end headers, for the gateway's answer to its caller: all but the
        hop-by-hop ones (and those the upstream's Connection header names), those the gateway sets
        itself, and those acting on the gateway's whole origin (see _NOT_RELAYED). `stream`: the
        gateway also sets cache-control and x-accel-buffering itself."""
        memo = _RELAY_STREAM if stream else _RELAY
        named: set[bytes] | None = None
        relayed: list[tuple[bytes, bytes]] = []
        for name, value in self.headers:
            keep = memo.get(name)
            if keep is None:
                keep = not name.startswith(_NOT_RELAYED_PREFIXES)
                if len(memo) < _RELAY_MEMO_MAX:
                    memo[name] = keep
            if keep:
                relayed.append((name, value))
            elif name == b"connection" and value not in _PLAIN_CONNECTION:
                named = (named or set()) | {option.strip() for option in value.lower().split(b",")}
        if named:
            relayed = [(name, value) for name, value in relayed if name not in named]
        return relayed

    def stream_cache_control(self) -> bytes:
        """Cache-control for a relayed stream: the gateway's "no-cache", or the runner's own when it
        is at least as strict (no-store: a reply must not even be written to a cache)."""
        value = self.header(b"cache-control")
        if value is None or value == b"no-cache":
            return b"no-cache"
        if value == b"no-store":
            return value
        # Whole directives only: `no-cache="set-cookie"` is weaker than no-cache.
        directives = {directive.strip() for directive in value.lower().split(b",")}
        return value if directives & _NO_CACHE_DIRECTIVES else b"no-cache"

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body pieces as they arrive (streamed responses only). Raises UpstreamError on failure."""
        conn = self._conn
        if conn is None:
            if self.body:
                yield self.body
            return
        try:
            while True:
                await conn.wait_chunk()
                parts = conn.take_chunks()
                if parts:
                    yield parts[0] if len(parts) == 1 else b"".join(parts)
                if conn.error is not None:
                    raise conn.error
                if conn.complete and not conn.body_parts:
                    break
        except BaseException:
            self.close()
            raise
        self._conn = None
        conn.finish()

    def close(self) -> None:
        """Give the connection back (complete) or drop it (abandoned mid-body). Idempotent."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.complete and conn.error is None:
            conn.finish()
        else:
            conn.abort()


class UpstreamClient:
    """Pools of keep-alive connections, one per runner endpoint ("http://host:port")."""

    def __init__(
        self,
        *,
        read_timeout_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 256,
        keepalive_expiry_s: float = 2.0,
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.read_timeout_s = read_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.keepalive_expiry_s = keepalive_expiry_s
        self._pools: dict[str, _Pool] = {}

    def _pool(self, endpoint: str) -> _Pool:
        pool = self._pools.get(endpoint)
        if pool is None:
            parts = urlsplit(endpoint)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError(f"runner endpoint must be http://host:port, got {endpoint!r}")
            pool = self._pools[endpoint] = _Pool(self, parts.hostname, parts.port or 80)
        return pool

    async def request(
        self,
        endpoint: str,
        method: str,
        path: str,
        *,
        body: bytes = b"",
        headers: Iterable[tuple[str, str]] = (),
        stream: bool = False,
        read_timeout_s: float | None = None,
    ) -> UpstreamResponse:
        """Send one request. Buffered: returns with the whole body. Streamed: returns at the
        headers; iterate `chunks()` (or `close()` the response) to free the connection."""
        pool = self._pool(endpoint)
        head = [f"{method} {path} HTTP/1.1\r\nhost: ".encode(), pool.authority, b"\r\n"]
        for name, value in headers:
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        if body or method in ("POST", "PUT", "PATCH"):
            head.append(b"content-length: %d\r\n" % len(body))
        head.append(b"\r\n")
        head.append(body)
        conn = await pool.acquire()
        waiter = conn.start(b"".join(head), stream=stream, read_timeout_s=read_timeout_s or self.read_timeout_s)
        try:
            await waiter
        except BaseException:
            conn.abort()
            raise
        if stream:
            return UpstreamResponse(conn, conn.status, conn.headers, b"")
        body_out = conn.body_parts[0] if len(conn.body_parts) == 1 else b"".join(conn.body_parts)
        response = UpstreamResponse(None, conn.status, conn.headers, body_out)
        conn.finish()
        return response

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def _readable(conn: _Conn) -> bool:
    """Whether an idle connection's socket has something to read: its EOF (or reset) not yet seen by
    the loop, or stray bytes. One poll, no wait."""
    assert conn.transport is not None
    sock = conn.transport.get_extra_info("socket")
    if sock is None:
        return False
    try:
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)
