"""Run an ASGI app with uvicorn inside the *current* asyncio loop.

`plnt up` runs the reconciler and the gateway on one loop, and owns SIGINT/SIGTERM itself.
uvicorn 0.54 has no `install_signal_handlers` flag: `Server.serve()` wraps everything in
`capture_signals()`, which (on the main thread) replaces the process's SIGINT/SIGTERM
handlers with `signal.signal` - clobbering handlers installed via `loop.add_signal_handler`
- and re-raises the captured signal once the server has stopped. `_InLoopServer` turns that
into a no-op; the caller stops the server with `should_exit` (see `GatewayServer.stop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Generator
from typing import Any

import uvicorn
from plnt.core.limits import HttpLimits, http_protocol

log = logging.getLogger("uvicorn.error")  # where uvicorn's own shutdown logs


class ServerStartError(RuntimeError):
    """uvicorn could not start (port in use, lifespan startup failed, ...)."""


class ClosingWhileDraining:
    """An ASGI app whose HTTP answers say `connection: close` while `draining()` (QuietServer's
    drain on stop): the client opens its next connection elsewhere, and none is cut under a request."""

    def __init__(self, app: Any, draining: Callable[[], bool]) -> None:
        self.app = app
        self._draining = draining

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def closing(message: Any) -> None:  # (also an answer begun before the stop signal came)
            if message["type"] == "http.response.start" and self._draining():
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


class QuietServer(uvicorn.Server):
    """uvicorn's Server with its housekeeping tick once a second instead of ten times.

    uvicorn wakes every 0.1 s to refresh the Date header (once a second anyway) and to look at
    `should_exit`: an idle runner cost 0.09 % of a core that way, so 1,000 idle runners almost a
    whole core (bench/reconcile_idle_up.py). Exit stays prompt: a signal (`handle_exit`) or
    `request_exit()` wakes the loop at once; setting `should_exit` alone is seen within a second."""

    TICK_S = 1.0

    def __init__(self, config: uvicorn.Config, *, drain_on_stop_s: float = 0.0) -> None:
        """`drain_on_stop_s`: a SIGTERM leaves the server serving this long (`draining`; with
        ClosingWhileDraining each answer closes its connection) before the shutdown. For a runner
        behind a Kubernetes Service: its clients hold keep-alive connections through the Service to
        this pod, and an idle one closed by the shutdown can meet a request already sent on it (lost:
        the gateway cannot tell it from one the runner was doing). Closed after an answer instead, each
        is let go of cleanly; after the client's keep-alive expiry none left open is reused."""
        super().__init__(config)
        self.drain_on_stop_s = drain_on_stop_s
        self.draining = False

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # on_tick refreshes the Date header when counter % 10 == 0
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.TICK_S):
                    await self._wake.wait()
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: Any) -> None:
        loop: asyncio.AbstractEventLoop | None = getattr(self, "_loop", None)
        if sig == signal.SIGTERM and self.drain_on_stop_s > 0 and not self.draining and loop is not None:
            self.draining = True  # (a second signal stops at once)
            loop.call_soon_threadsafe(loop.call_later, self.drain_on_stop_s, self.request_exit)
            return
        super().handle_exit(sig, frame)
        self._wake_up()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, except its fixed 0.1 s sleep after asking connections to close: that
        sleep is now a wait for them to go, at most 0.1 s. Idle keep-alive connections (the gateway's
        pool, plnt's health polls) close at once, so a runner stops in milliseconds instead of 0.1 s:
        every promote waits for the old runner to stop, and plnt stops 1,000 runners at exit. A
        connection still answering is waited for as before (`_wait_tasks_to_complete`)."""
        for server in self.servers:
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()
        deadline = asyncio.get_running_loop().time() + 0.1
        while self.server_state.connections and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        try:
            async with asyncio.timeout(self.config.timeout_graceful_shutdown):
                await self._wait_tasks_to_complete()
        except TimeoutError:
            log.error("Cancel %s running task(s), timeout graceful shutdown exceeded", len(self.server_state.tasks))
            for task in self.server_state.tasks:
                task.cancel(msg="Task cancelled, timeout graceful shutdown exceeded")
        if not self.force_exit:
            await self.lifespan.shutdown()

    def request_exit(self) -> None:
        self.should_exit = True
        self._wake_up()

    def _wake_up(self) -> None:
        loop: asyncio.AbstractEventLoop | None = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake.set)  # from a signal handler too: wakes the selector


class _InLoopServer(QuietServer):
    def __init__(self, config: uvicorn.Config, ready: asyncio.Event | None) -> None:
        super().__init__(config)
        self._ready = ready

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        # The caller owns SIGINT/SIGTERM; see the module docstring.
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # `started` is set only once the listening socket exists, so ready means connectable.
        if self.started and self._ready is not None:
            self._ready.set()


def uvicorn_config(app: Any, host: str, port: int, limits: HttpLimits | None = None, **options: Any) -> uvicorn.Config:
    """uvicorn's config with plnt's HTTP limits (head size and count, slow-client deadlines; see
    limits.py): the gateway and the runners are both served with it."""
    return uvicorn.Config(app, host=host, port=port, http=http_protocol(limits or HttpLimits()), **options)


def _build(
    app: Any, host: str, port: int, ready: asyncio.Event | None, graceful_timeout_s: float | None,
    limits: HttpLimits | None = None, lifespan: str = "on",
) -> _InLoopServer:
    config = uvicorn_config(
        app,
        host,
        port,
        limits,
        # "on", not "auto": with "auto" a failing lifespan startup is logged and ignored,
        # and the gateway would serve without its HTTP client.
        lifespan=lifespan,
        # Leave logging to the host process (plnt up configures it); uvicorn's default
        # dictConfig would otherwise reconfigure loggers process-wide.
        log_config=None,
        access_log=False,
        # Runners and the gateway use no client addresses; trusting X-Forwarded-For would only
        # let clients spoof them, and the middleware costs ~3% of the gateway's CPU per request.
        proxy_headers=False,
        timeout_graceful_shutdown=graceful_timeout_s,  # type: ignore[arg-type]  # float works
    )
    return _InLoopServer(config, ready)


def reuse_port_socket(host: str, port: int, *, listen: bool = True) -> socket.socket:
    """A listening TCP socket with SO_REUSEPORT: several processes (gateway workers) bind the same
    host:port and the kernel spreads new connections over their accept queues. Linux lets only
    processes of the same user join a port this way. `listen=False`: only hold the port (and learn
    its number when `port` is 0) for workers that will listen on it; the kernel gives a socket that
    does not listen no connections."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(2048)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def check_free(host: str, port: int) -> None:
    """OSError if anything listens on host:port (a plain bind: SO_REUSEPORT listeners refuse it too)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))


async def _run(server: _InLoopServer, sock: socket.socket | None = None) -> None:
    host, port = server.config.host, server.config.port
    try:
        await server.serve([sock] if sock is not None else None)
    except SystemExit as exc:
        # uvicorn calls sys.exit() when binding or lifespan startup fails. Inside a task,
        # SystemExit would escape the event loop and take the reconciler down with it.
        raise ServerStartError(f"could not start server on {host}:{port} (exit code {exc.code})") from None
    finally:
        # If we were cancelled rather than stopped, at least release the port.
        for listener in getattr(server, "servers", ()):
            listener.close()


async def serve(
    app: Any,
    host: str,
    port: int,
    *,
    ready: asyncio.Event | None = None,
    graceful_timeout_s: float | None = 30.0,
    limits: HttpLimits | None = None,
) -> None:
    """Serve `app` on host:port in the running loop until cancelled; set `ready` once listening.

    Prefer `GatewayServer` when you need to stop gracefully: cancelling this coroutine closes
    the listener but drops in-flight requests and skips the app's lifespan shutdown.
    """
    await _run(_build(app, host, port, ready, graceful_timeout_s, limits))


class GatewayServer:
    """Start/stop helper around `serve`, for `plnt up` and tests.

    `port=0` picks a free port; read the actual one from `.port` / `.url` after `start()`.
    """

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, graceful_timeout_s: float | None = 30.0,
        limits: HttpLimits | None = None, reuse_port: bool = False, joining: bool = False, lifespan: bool = True,
    ) -> None:
        """`reuse_port`: listen with SO_REUSEPORT so gateway worker processes can share the port.
        `joining`: the port is already served by our own first process (else it must be free: two
        plnt instances of one user must not share a port by accident).
        `lifespan=False`: a second listener for an app whose lifespan another server runs."""
        self.app = app
        self.reuse_port = reuse_port
        self.joining = joining
        self._lifespan = "on" if lifespan else "off"
        self.limits = limits
        self.host = host
        self._requested_port = port
        self._graceful_timeout_s = graceful_timeout_s
        self._server: _InLoopServer | None = None
        self._task: asyncio.Task[None] | None = None
        self._port: int | None = None

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("server already started")
        ready = asyncio.Event()
        self._server = _build(self.app, self.host, self._requested_port, ready, self._graceful_timeout_s, self.limits,
                              self._lifespan)
        sock = None
        if self.reuse_port:
            try:
                if not self.joining and self._requested_port:
                    check_free(self.host, self._requested_port)
                sock = reuse_port_socket(self.host, self._requested_port)
            except OSError as exc:
                raise ServerStartError(f"could not listen on {self.host}:{self._requested_port}: {exc.strerror}; "
                                       "is another program on that port? choose one with --port") from None
        self._task = asyncio.create_task(_run(self._server, sock), name=f"uvicorn {self.host}:{self._requested_port}")
        ready_wait = asyncio.create_task(ready.wait())
        # Whichever comes first: listening, or the server task ending (startup failure).
        await asyncio.wait({self._task, ready_wait}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.is_set():
            ready_wait.cancel()
            task, self._task = self._task, None
            await task  # re-raises ServerStartError
            raise ServerStartError(f"server on {self.host}:{self._requested_port} exited during startup")
        # Remembered so `url` still names the server after stop (e.g. to show it is gone).
        self._port = int(self._server.servers[0].sockets[0].getsockname()[1])

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("server not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Graceful: stop accepting, let in-flight requests finish, run lifespan shutdown."""
        if self._task is None or self._server is None:
            return
        # Endless responses (GET /workflows/events) end on this, or uvicorn would wait out its
        # graceful timeout for them; wrappers (TrustForwarded, the gateway role) share the app's state.
        state = getattr(self.app, "state", None)
        if state is not None:
            state.stopping = True
        self._server.request_exit()
        task, self._task = self._task, None
        await task

    async def __aenter__(self) -> GatewayServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
