"""`POST /workflows/{name}/invoke` with `Accept: text/event-stream`: the runner's SSE, unbuffered.

The runners are fake runners (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from plnt.core.routes import RouteTable
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

pytestmark = pytest.mark.integration

SSE = {"accept": "text/event-stream"}


async def test_first_event_reaches_client_before_runner_finishes(start_server: StartServer, start_gateway: StartGateway) -> None:
    hold = asyncio.Event()
    runner = FakeRunner("1.0.0", tokens=("first", " second", " third"), hold=hold)
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))

    async with gw.client.stream("POST", "/workflows/assistant/invoke", json={"q": 1}, headers=SSE) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        assert resp.headers["x-accel-buffering"] == "no"
        assert resp.headers["x-plnt-version"] == "1.0.0"
        chunks = resp.aiter_raw()
        first = await asyncio.wait_for(anext(chunks), 5)
        # The runner is still holding the stream open (it has sent one token of three and
        # waits for `hold`), yet the client already has that token: nothing buffered it.
        assert b"event: token" in first and b'"first"' in first
        assert not hold.is_set() and runner.stream_finished == []
        hold.set()
        rest = b"".join([chunk async for chunk in chunks])
    body = first + rest
    assert body.count(b"event: token") == 3
    assert b"event: result" in body and body.endswith(b"\n\n")
    assert runner.stream_finished == [True]
    assert runner.requests[0]["headers"]["accept"] == "text/event-stream"


async def test_stream_bytes_pass_through_unchanged(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0", tokens=("a", "é", " c"), token_delay_s=0.01)
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))

    async with httpx.AsyncClient(trust_env=False) as direct:
        expected = (await direct.post(f"{server.url}/invoke", json={}, headers=SSE)).content
    via = await gw.client.post("/workflows/assistant/invoke", json={}, headers=SSE)
    assert via.content == expected


async def test_stream_error_event_passes_through(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0", tokens=("a", "b", "c"), fail_after_tokens=1)
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))
    resp = await gw.client.post("/workflows/assistant/invoke", json={}, headers=SSE)
    assert resp.status_code == 200
    assert resp.content.count(b"event: token") == 1
    assert b"event: error" in resp.content and b"tool exploded" in resp.content


async def test_runner_error_before_stream_is_plain_json(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0", fail_status=422)
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))
    resp = await gw.client.post("/workflows/assistant/invoke", json={}, headers=SSE)
    assert resp.status_code == 422
    assert resp.json()["error"]["type"] == "invalid_request"


async def test_client_hanging_up_stops_the_runner_stream(start_server: StartServer, start_gateway: StartGateway) -> None:
    hold = asyncio.Event()
    runner = FakeRunner("1.0.0", tokens=("a", "b"), hold=hold)
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))
    router = gw.app.gateway.router
    async with httpx.AsyncClient(base_url=gw.url, trust_env=False) as client:
        async with client.stream("POST", "/workflows/assistant/invoke", json={}, headers=SSE) as resp:
            await anext(resp.aiter_raw())
    # The client is gone: the gateway drops its runner connection, the runner's stream ends.
    for _ in range(200):
        if runner.stream_cancelled and router.in_flight_count(backend(server, "1.0.0")) == 0:
            break
        await asyncio.sleep(0.01)
    assert runner.stream_cancelled == [True]
    assert router.in_flight_count(backend(server, "1.0.0")) == 0
    hold.set()


async def test_slow_stream_times_out_with_error_event(start_server: StartServer, start_gateway: StartGateway) -> None:
    hold = asyncio.Event()  # never set: the runner goes silent after the first token
    runner = FakeRunner("1.0.0", tokens=("a", "b"), hold=hold)
    server = await start_server(runner.app(), graceful_timeout_s=0.2)
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])), request_timeout_s=0.3)
    resp = await gw.client.post("/workflows/assistant/invoke", json={}, headers=SSE)
    assert resp.status_code == 200  # the stream had started
    assert resp.content.count(b"event: token") == 1
    assert resp.content.endswith(b"\n\n")
    last = resp.content.rsplit(b"event: ", 1)[1]
    assert last.startswith(b"error\ndata: ") and b'"upstream_timeout"' in last
    hold.set()
