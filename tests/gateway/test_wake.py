"""The gateway's side of scale to zero: a refused connect to a parked runner asks `wake` once, and
every request waiting for that release is sent on when it serves again.

`wake` here is a recording stand-in for plnt's (LocalDriver.wake, tested with real runners in
tests/reconciler/drivers/test_scale_to_zero.py and through plnt up in tests/e2e/test_scale_to_zero.py): it
starts a STAND-IN runner (tests/gateway/fakes.py) on the parked port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from plnt.core.routes import Backend, RouteTable
from plnt.core.server import GatewayServer
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, route
from tests.gateway.fakes import FakeRunner

pytestmark = pytest.mark.integration


@contextmanager
def refusing_port() -> Iterator[tuple[int, socket.socket]]:
    """A loopback port bound but not listening: connects are refused, and no other test's server can
    take it meanwhile (as one could a port merely found free)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    try:
        yield sock.getsockname()[1], sock
    finally:
        sock.close()


async def test_requests_to_a_parked_runner_share_one_wake_and_are_answered(start_gateway: StartGateway) -> None:
    with refusing_port() as (port, reserved):
        await wake_shared(start_gateway, port, reserved)


async def wake_shared(start_gateway: StartGateway, port: int, reserved: socket.socket) -> None:
    parked = Backend(endpoint=f"http://127.0.0.1:{port}", version="1.0.0", release_id="rel-parked")
    asked: list[tuple[str, str, str]] = []
    servers: list[GatewayServer] = []

    async def wake(namespace: str, name: str, release_id: str) -> str | None:
        asked.append((namespace, name, release_id))
        await asyncio.sleep(0.2)  # a runner's start: every request meanwhile waits for this one
        reserved.close()
        server = GatewayServer(FakeRunner("1.0.0").app(), "127.0.0.1", port)
        await server.start()
        servers.append(server)
        return server.url

    router = Router()
    router.replace(RouteTable([route("assistant", parked)]))
    gateway = await start_gateway(router, wake=wake)
    try:
        answers = await asyncio.gather(*(gateway.client.post("/workflows/assistant/invoke", json={})
                                         for _ in range(8)))
        assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
        assert asked == [("default", "assistant", "rel-parked")], "one wake for all of them"
        metrics = (await gateway.client.get("/metrics")).text
        assert 'plnt_gateway_runner_wakes_total{namespace="default",workflow="assistant"} 1.0' in metrics
    finally:
        for server in servers:
            await server.stop()


async def test_a_release_that_did_not_park_is_a_502_and_a_failed_wake_too(start_gateway: StartGateway) -> None:
    with refusing_port() as (one, _), refusing_port() as (other, _):
        await not_woken(start_gateway, one, other)


async def not_woken(start_gateway: StartGateway, one: int, other: int) -> None:
    dead = Backend(endpoint=f"http://127.0.0.1:{one}", version="1.0.0", release_id="rel-dead")
    broken = Backend(endpoint=f"http://127.0.0.1:{other}", version="1.0.0", release_id="rel-broken")

    async def wake(namespace: str, name: str, release_id: str) -> str | None:
        if release_id == "rel-broken":
            raise RuntimeError("runner did not start")
        return None

    router = Router()
    router.replace(RouteTable([route("dead", dead), route("broken", broken)]))
    gateway = await start_gateway(router, wake=wake)
    for name in ("dead", "broken"):
        answer = await gateway.client.post(f"/workflows/{name}/invoke", json={})
        assert answer.status_code == 502 and answer.json()["error"]["type"] == "upstream_unavailable", answer.text
