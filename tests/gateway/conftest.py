"""Fixtures of the gateway tests: real uvicorn servers on 127.0.0.1, in the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from plnt.core.routes import Backend, Route
from plnt.core.server import GatewayServer
from plnt.gateway.app import GatewayApp, create_app
from plnt.gateway.router import Router

StartServer = Callable[..., Awaitable[GatewayServer]]


@pytest.fixture
async def start_server() -> AsyncIterator[StartServer]:
    """Start an ASGI app on a free loopback port; every server is stopped at teardown."""
    servers: list[GatewayServer] = []

    async def start(app: Any, *, graceful_timeout_s: float | None = 5.0) -> GatewayServer:
        server = GatewayServer(app, "127.0.0.1", 0, graceful_timeout_s=graceful_timeout_s)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in reversed(servers):
        await server.stop()  # no-op for servers a test already stopped


def backend(server: GatewayServer, version: str) -> Backend:
    return Backend(endpoint=server.url, version=version, release_id=f"rel-{version}")


def route(name: str, stable: Backend | None, canary: Backend | None = None, percent: int = 0, ns: str = "default",
          replicas: tuple[Backend, ...] = ()) -> Route:
    return Route(namespace=ns, name=name, stable=stable, canary=canary, traffic_percent=percent, stable_replicas=replicas)


@dataclass
class Gateway:
    url: str
    app: GatewayApp
    client: httpx.AsyncClient  # pointed at url, no auth header


StartGateway = Callable[..., Awaitable[Gateway]]


@pytest.fixture
async def start_gateway(start_server: StartServer) -> AsyncIterator[StartGateway]:
    """Serve a gateway for `router` (create_app's keyword arguments pass through)."""
    clients: list[httpx.AsyncClient] = []

    async def start(router: Router, *, list_workflows: Callable[[], list[dict[str, Any]]] = list, **kwargs: Any) -> Gateway:
        kwargs.setdefault("request_timeout_s", 30.0)
        app = create_app(router, list_workflows=list_workflows, **kwargs)
        server = await start_server(app)
        client = httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30.0)
        clients.append(client)
        return Gateway(server.url, app, client)

    yield start
    for client in clients:
        await client.aclose()


MakeGateway = Callable[..., Awaitable[httpx.AsyncClient]]


@pytest.fixture
async def make_gateway(start_gateway: StartGateway) -> MakeGateway:
    """Serve a gateway for `router` and return an httpx client pointed at it."""

    async def make(router: Router, **kwargs: Any) -> httpx.AsyncClient:
        return (await start_gateway(router, **kwargs)).client

    return make
