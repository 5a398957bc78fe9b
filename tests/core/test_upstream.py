"""The gateway's HTTP/1.1 client to runners, against raw asyncio servers that misbehave on cue
(`RawServer`: STAND-INS for runners, answering with hand-written HTTP bytes)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from plnt.core.upstream import UpstreamBroken, UpstreamClient, UpstreamConnectError, UpstreamTimeout
from plnt.reconciler.drivers.processes import free_port

pytestmark = pytest.mark.integration

Responder = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # -> keep the connection open?


class RawServer:
    def __init__(self, respond: Responder) -> None:
        self.respond = respond
        self.connections = 0
        self.open_now = 0
        self.max_open = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open_now += 1
        self.max_open = max(self.max_open, self.open_now)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                if not await self.respond(body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open_now -= 1
            writer.close()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Responder], Awaitable[RawServer]]]:
    servers: list[RawServer] = []

    async def start(respond: Responder) -> RawServer:
        raw = RawServer(respond)
        raw.server = await asyncio.start_server(raw.handle, "127.0.0.1", 0)
        servers.append(raw)
        return raw

    yield start
    for raw in servers:
        assert raw.server is not None
        raw.server.close()


def ok(body: bytes = b'{"ok":true}', extra: bytes = b"") -> Responder:
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%s\r\n%s"
                     % (len(body), extra, body))
        await writer.drain()
        return b"connection: close" not in extra
    return respond


async def test_keep_alive_connection_is_reused(raw_server) -> None:  # type: ignore[no-untyped-def]
    server = await raw_server(ok())
    client = UpstreamClient()
    for _ in range(20):
        response = await client.request(server.url, "POST", "/invoke", body=b"{}")
        assert (response.status, response.body) == (200, b'{"ok":true}')
        assert response.header(b"content-type") == b"application/json"
    assert server.connections == 1
    await client.aclose()


async def test_connection_close_is_honoured(raw_server) -> None:  # type: ignore[no-untyped-def]
    server = await raw_server(ok(extra=b"connection: close\r\n"))
    client = UpstreamClient()
    for _ in range(3):
        assert (await client.request(server.url, "POST", "/invoke", body=b"{}")).status == 200
    assert server.connections == 3
    await client.aclose()


async def test_chunked_stream_and_read_until_close(raw_server) -> None:  # type: ignore[no-untyped-def]
    async def chunked(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for piece in (b"event: token\n\n", b"event: result\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.02)
        writer.write(b"0\r\n\r\n")
        return True

    server = await raw_server(chunked)
    client = UpstreamClient()
    response = await client.request(server.url, "POST", "/invoke", body=b"{}", stream=True)
    pieces = [piece async for piece in response.chunks()]
    assert pieces == [b"event: token\n\n", b"event: result\n\n"]  # as they came, not joined
    # The connection went back to the pool after the last chunk.
    assert (await client.request(server.url, "POST", "/invoke", body=b"{}", stream=True)).status == 200
    assert server.connections == 1

    async def until_close(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        return False

    server2 = await raw_server(until_close)
    assert (await client.request(server2.url, "GET", "/stats")).body == b"all of it"
    await client.aclose()


async def test_pool_limit_queues_requests(raw_server) -> None:  # type: ignore[no-untyped-def]
    async def slow(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(0.05)
        return await ok()(_request, writer)

    server = await raw_server(slow)
    client = UpstreamClient(max_connections=2)
    responses = await asyncio.gather(*(client.request(server.url, "POST", "/invoke", body=b"{}") for _ in range(6)))
    assert [r.status for r in responses] == [200] * 6
    assert server.max_open <= 2
    await client.aclose()

    # Waiting for a free connection is bounded too.
    client = UpstreamClient(max_connections=1, read_timeout_s=0.06)
    results = await asyncio.gather(*(client.request(server.url, "POST", "/invoke", body=b"{}") for _ in range(3)),
                                   return_exceptions=True)
    assert any(isinstance(r, UpstreamTimeout) for r in results)
    await client.aclose()


async def test_failures_are_classified(raw_server) -> None:  # type: ignore[no-untyped-def]
    client = UpstreamClient(read_timeout_s=0.1)
    with pytest.raises(UpstreamConnectError):
        await client.request(f"http://127.0.0.1:{free_port()}", "POST", "/invoke", body=b"{}")

    async def silent(_request: bytes, _writer: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(1)
        return False

    with pytest.raises(UpstreamTimeout):
        await client.request((await raw_server(silent)).url, "POST", "/invoke", body=b"{}")

    async def garbage(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"NOT HTTP AT ALL\r\n\r\n")
        return True

    with pytest.raises(UpstreamBroken):
        await client.request((await raw_server(garbage)).url, "POST", "/invoke", body=b"{}")

    async def hang_up(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        return False

    with pytest.raises(UpstreamBroken):
        await client.request((await raw_server(hang_up)).url, "POST", "/invoke", body=b"{}")
    await client.aclose()


@pytest.mark.parametrize("listening", [False, True], ids=["refused", "answered"])
async def test_a_cancelled_request_is_cancelled_whenever_the_cancel_lands(raw_server, listening: bool) -> None:  # type: ignore[no-untyped-def]
    """A cancel that lands in the same loop turn as the connect's outcome must not be lost (Python
    3.11's asyncio.wait_for returned the outcome then). A lost cancel kept a cancelled install polling
    a starting runner's health for its whole start timeout. Stepped one loop turn at a time, so one
    step is that turn."""
    client = UpstreamClient(read_timeout_s=1.0, connect_timeout_s=1.0)
    endpoint = (await raw_server(ok())).url if listening else f"http://127.0.0.1:{free_port()}"
    outcomes: dict[str, int] = {}
    for turns in range(40):
        task = asyncio.create_task(client.request(endpoint, "GET", "/healthz"))
        for _ in range(turns):
            await asyncio.sleep(0)
        cancelled_before_done = not task.done()
        task.cancel()
        try:
            await task
            outcome = "answered"
        except asyncio.CancelledError:
            outcome = "cancelled"
        except UpstreamConnectError:
            outcome = "refused"
        if cancelled_before_done:
            assert outcome == "cancelled", f"cancelled after {turns} loop turns, the request ended {outcome}"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert outcomes.get("cancelled", 0) >= 1, outcomes
    await client.aclose()


async def test_an_idle_connection_the_runner_closed_is_not_reused_even_before_the_loop_saw_it() -> None:
    """A runner (here a STAND-IN: a blocking socket server in a thread) that closes a kept-alive connection
    while the gateway's loop is busy: the next request must not be written onto it (it would fail as
    'closed mid-response', which is never retried), but go on a new connection."""
    import socket
    import threading
    import time

    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    first_closed = threading.Event()

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            accepted.append(conn)
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n" + str(n).encode())
            if n == 0:
                time.sleep(0.05)
                conn.close()  # keep-alive given, then closed: the runner stopped
                first_closed.set()
        listener.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = UpstreamClient()
    try:
        assert (await client.request(f"http://127.0.0.1:{port}", "POST", "/invoke", body=b"{}")).body == b"0"
        assert first_closed.wait(5)
        time.sleep(0.05)  # blocks the loop: the FIN has arrived, connection_lost has not run
        answer = await client.request(f"http://127.0.0.1:{port}", "POST", "/invoke", body=b"{}")
        assert answer.body == b"1" and len(accepted) == 2
    finally:
        await client.aclose()
        thread.join(5)
        for conn in accepted:
            conn.close()
