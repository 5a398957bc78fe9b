"""QuietServer: uvicorn's housekeeping tick once a second, and still a prompt exit.

The tick counts are bounds on how often an idle server wakes (a busy machine only lowers them);
the exit tests give the server a 60 s tick, so an exit that waited for its tick would fail them."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

pytestmark = pytest.mark.integration  # real listening servers and processes
from plnt.core.server import QuietServer, uvicorn_config
from plnt.reconciler.drivers.processes import free_port


async def hello(scope, receive, send):  # noqa: ANN001 - a bare ASGI app
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hi"})


class CountingServer(QuietServer):
    def __init__(self, config, tick_s: float) -> None:  # noqa: ANN001
        super().__init__(config)
        self.TICK_S = tick_s
        self.ticks = 0

    async def on_tick(self, counter: int) -> bool:
        self.ticks += 1
        return await super().on_tick(counter)

    def capture_signals(self):  # noqa: ANN201 - the test's loop owns the signals
        return contextlib.nullcontext()


async def serving(server: CountingServer) -> asyncio.Task[None]:
    task = asyncio.create_task(server.serve())
    while not server.started:
        assert not task.done(), "the server did not start"
        await asyncio.sleep(0.01)
    return task


async def test_an_idle_server_wakes_once_a_second_and_keeps_its_date_header() -> None:
    port = free_port()
    server = CountingServer(uvicorn_config(hello, "127.0.0.1", port, log_config=None, lifespan="off"), tick_s=1.0)
    task = await serving(server)
    try:
        await asyncio.sleep(3.0)
        # uvicorn's own loop ticks every 0.1 s: about 30 here.
        assert server.ticks <= 5, f"{server.ticks} ticks in 3 s"
        async with httpx.AsyncClient(trust_env=False) as client:
            response = await client.get(f"http://127.0.0.1:{port}/")
        assert response.text == "hi" and "date" in response.headers
    finally:
        server.request_exit()
        await asyncio.wait_for(task, 20)


async def test_request_exit_wakes_the_server_at_once() -> None:
    port = free_port()
    server = CountingServer(uvicorn_config(hello, "127.0.0.1", port, log_config=None, lifespan="off"), tick_s=60.0)
    task = await serving(server)
    server.request_exit()
    await asyncio.wait_for(task, 20)  # a missed wake-up would wait for the 60 s tick


def test_sigterm_wakes_a_runner_style_server_at_once() -> None:
    """A process serving with QuietServer.run() (as a runner does) exits on SIGTERM without
    waiting for its tick."""
    port = free_port()
    script = textwrap.dedent(f"""
        import sys
        from plnt.core.server import QuietServer, uvicorn_config
        from tests.gateway.test_quiet_server import hello
        server = QuietServer(uvicorn_config(hello, "127.0.0.1", {port}, log_config=None, lifespan="off"))
        server.TICK_S = 60.0
        server.run()  # re-raises the SIGTERM it caught once it has stopped: the process ends -15
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(400):
            try:
                httpx.get(f"http://127.0.0.1:{port}/", trust_env=False, timeout=1)
                break
            except httpx.HTTPError:
                assert child.poll() is None, "the server process died"
                time.sleep(0.05)
        child.send_signal(signal.SIGTERM)
        child.communicate(timeout=20)  # a missed wake-up would wait for the 60 s tick
        assert child.returncode == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()


async def slow(scope, receive, send):  # noqa: ANN001 - answers after 0.5 s
    if scope["type"] != "http":
        return
    await asyncio.sleep(0.5)
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"late"})


async def test_exit_with_idle_keep_alive_connections_does_not_sleep_a_tenth_of_a_second() -> None:
    """uvicorn slept 0.1 s after asking connections to close, whatever they were doing: every runner
    stop (so every promote) paid it. Idle keep-alive connections close at once now. The best of five
    is compared, so one slow moment of a busy machine does not decide."""
    best = float("inf")
    for _ in range(5):
        port = free_port()
        server = CountingServer(uvicorn_config(hello, "127.0.0.1", port, log_config=None, lifespan="off"), tick_s=60.0)
        task = await serving(server)
        async with httpx.AsyncClient(trust_env=False) as client:  # its pooled connection stays open
            assert (await client.get(f"http://127.0.0.1:{port}/")).text == "hi"
            began = time.monotonic()
            server.request_exit()
            await asyncio.wait_for(task, 20)
            best = min(best, time.monotonic() - began)
    assert best < 0.1, f"exit took {best * 1000:.0f} ms at best with an idle keep-alive connection"


async def test_exit_still_waits_for_a_response_in_flight() -> None:
    port = free_port()
    server = CountingServer(uvicorn_config(slow, "127.0.0.1", port, log_config=None, lifespan="off"), tick_s=60.0)
    task = await serving(server)
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        request = asyncio.create_task(client.get(f"http://127.0.0.1:{port}/"))
        while not server.server_state.tasks:
            await asyncio.sleep(0.005)
        server.request_exit()
        assert (await request).text == "late", "the answer in flight was given before the server stopped"
    await asyncio.wait_for(task, 20)
