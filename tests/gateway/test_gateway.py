"""Gateway end to end: real uvicorn servers on 127.0.0.1, in the test's event loop.

The "runners" here are small FastAPI apps written for these tests (`make_test_runner` and
friends), not `plnt.runner`: they only mimic its HTTP contract (`POST /invoke`, `GET /healthz`)
so the gateway can be tested without recipes, models or Temporal. They are STAND-INS for runner
processes; so are the plain functions given as the reconciler's `list_workflows` and `on_git_hook`,
and `PromoteAfterChoose`, a Router that swaps its table at a chosen moment.
"""

from __future__ import annotations

import asyncio
import math
import random
import signal
import socket
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from plnt.core.routes import Backend, Route, RouteTable, Track
from plnt.core.server import GatewayServer, ServerStartError
from plnt.gateway.router import Router
from plnt.reconciler.drivers.processes import free_port

from tests.gateway.conftest import MakeGateway, StartServer, backend, route

pytestmark = pytest.mark.integration


# --- test runners ---------------------------------------------------------------------------


def make_test_runner(version: str, *, delay_s: float = 0.0) -> FastAPI:
    """Test runner: answers /invoke with its version and echoes the input, after `delay_s`."""
    app = FastAPI()

    @app.post("/invoke")
    async def invoke(request: Request) -> dict[str, Any]:
        body = await request.json()
        if delay_s:
            await asyncio.sleep(delay_s)
        return {"version": version, "echo": body}

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def make_failing_test_runner() -> FastAPI:
    """Test runner whose workflow always fails with a 500 and a JSON error body."""
    app = FastAPI()

    @app.post("/invoke")
    async def invoke() -> JSONResponse:
        return JSONResponse({"error": {"type": "step_failed", "message": "tool exploded"}}, status_code=500)

    return app


# --- routing --------------------------------------------------------------------------------


async def test_routes_to_stable_and_passes_body(start_server: StartServer, make_gateway: MakeGateway) -> None:
    v1 = await start_server(make_test_runner("v1"))
    client = await make_gateway(Router(RouteTable([route("summarize", backend(v1, "v1"))])))

    payload = {"input": {"text": "héllo", "n": [1, 2.5, None]}}
    resp = await client.post("/workflows/summarize/invoke", json=payload)

    assert resp.status_code == 200
    assert resp.json() == {"version": "v1", "echo": payload}
    assert resp.headers["x-plnt-version"] == "v1"
    assert resp.headers["x-plnt-track"] == "stable"


async def _invoke_many(client: httpx.AsyncClient, path: str, n: int, concurrency: int) -> list[httpx.Response]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> httpx.Response:
        async with sem:
            return await client.post(path, json={"i": i})

    return await asyncio.gather(*(one(i) for i in range(n)))


async def test_canary_gets_its_share(start_server: StartServer, make_gateway: MakeGateway) -> None:
    v1 = await start_server(make_test_runner("v1"))
    v2 = await start_server(make_test_runner("v2"))
    table = RouteTable([route("summarize", backend(v1, "v1"), backend(v2, "v2"), percent=20)])
    # Seeded: reproducible; the bound below is still what any correct 20% split must meet.
    client = await make_gateway(Router(table, rng=random.Random(20240601)))

    n, p = 1000, 0.20
    responses = await _invoke_many(client, "/workflows/summarize/invoke", n, concurrency=20)

    assert all(r.status_code == 200 for r in responses)
    tracks: list[Track] = [r.headers["x-plnt-track"] for r in responses]  # type: ignore[misc]
    for r in responses:  # header and the runner that actually answered agree
        assert r.json()["version"] == {"stable": "v1", "canary": "v2"}[r.headers["x-plnt-track"]]
    canary = tracks.count("canary")
    # Each request is a Bernoulli(p) draw, so the canary count is Binomial(1000, 0.2):
    # mean 200, sigma = sqrt(1000 * 0.2 * 0.8) ~ 12.6. Accept mean +- 3 sigma, i.e. about
    # 162..238, which a correct split misses only 0.3% of the time for an arbitrary seed.
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(canary - n * p) <= 3 * sigma, canary


async def test_canary_zero_percent_gets_nothing(start_server: StartServer, make_gateway: MakeGateway) -> None:
    v1 = await start_server(make_test_runner("v1"))
    v2 = await start_server(make_test_runner("v2"))
    table = RouteTable([route("summarize", backend(v1, "v1"), backend(v2, "v2"), percent=0)])
    client = await make_gateway(Router(table))

    responses = await _invoke_many(client, "/workflows/summarize/invoke", 200, concurrency=20)

    assert {(r.status_code, r.headers["x-plnt-track"], r.json()["version"]) for r in responses} == {
        (200, "stable", "v1")
    }


async def test_namespace_disambiguates(start_server: StartServer, make_gateway: MakeGateway) -> None:
    a = await start_server(make_test_runner("a-1"))
    b = await start_server(make_test_runner("b-1"))
    table = RouteTable(
        [route("translate", backend(a, "a-1"), ns="team-a"), route("translate", backend(b, "b-1"), ns="team-b")]
    )
    client = await make_gateway(Router(table))

    resp = await client.post("/workflows/translate/invoke", json={})
    assert resp.status_code == 409
    assert resp.json()["error"]["type"] == "ambiguous"
    assert "?namespace=" in resp.json()["error"]["message"]
    assert "team-a" in resp.json()["error"]["message"] and "team-b" in resp.json()["error"]["message"]

    resp = await client.post("/workflows/translate/invoke", params={"namespace": "team-b"}, json={})
    assert resp.status_code == 200
    assert resp.json()["version"] == "b-1"

    resp = await client.post("/workflows/translate/invoke", params={"namespace": "team-c"}, json={})
    assert resp.status_code == 404


# --- errors ---------------------------------------------------------------------------------


async def test_unknown_workflow_is_404(make_gateway: MakeGateway) -> None:
    client = await make_gateway(Router())
    resp = await client.post("/workflows/nope/invoke", json={})
    assert resp.status_code == 404
    assert resp.json() == {
        "error": {"type": "not_found", "message": "no workflow named nope; GET /workflows lists them"}
    }


async def test_nothing_promoted_is_503(start_server: StartServer, make_gateway: MakeGateway) -> None:
    canary = await start_server(make_test_runner("v1"))
    table = RouteTable(
        [
            route("fresh", stable=None),
            # A canary alone never takes the traffic, even at 100%.
            route("canary-only", stable=None, canary=backend(canary, "v1"), percent=100),
        ]
    )
    client = await make_gateway(Router(table))

    for name in ("fresh", "canary-only"):
        resp = await client.post(f"/workflows/{name}/invoke", json={})
        assert resp.status_code == 503
        assert resp.json()["error"]["type"] == "not_ready"
        assert resp.headers["retry-after"] == "5"


async def test_unreachable_runner_is_502(make_gateway: MakeGateway) -> None:
    dead = Backend(endpoint=f"http://127.0.0.1:{free_port()}", version="v1", release_id="rel-v1")
    client = await make_gateway(Router(RouteTable([route("summarize", dead)])))

    resp = await client.post("/workflows/summarize/invoke", json={})

    assert resp.status_code == 502
    assert resp.json()["error"]["type"] == "upstream_unavailable"


async def test_slow_runner_is_504(start_server: StartServer, make_gateway: MakeGateway) -> None:
    # Short graceful timeout: the runner's abandoned request would otherwise hold teardown.
    slow = await start_server(make_test_runner("v1", delay_s=2.0), graceful_timeout_s=0.5)
    client = await make_gateway(Router(RouteTable([route("summarize", backend(slow, "v1"))])), request_timeout_s=0.3)

    resp = await client.post("/workflows/summarize/invoke", json={})

    assert resp.status_code == 504
    assert resp.json()["error"]["type"] == "upstream_timeout"


async def test_runner_error_passes_through(start_server: StartServer, make_gateway: MakeGateway) -> None:
    failing = await start_server(make_failing_test_runner())
    client = await make_gateway(Router(RouteTable([route("summarize", backend(failing, "v3"))])))

    resp = await client.post("/workflows/summarize/invoke", json={"x": 1})

    assert resp.status_code == 500
    assert resp.json() == {"error": {"type": "step_failed", "message": "tool exploded"}}
    assert resp.headers["x-plnt-version"] == "v3"


# --- other endpoints ------------------------------------------------------------------------


async def test_list_workflows_and_healthz(make_gateway: MakeGateway) -> None:
    listing = [
        {
            "name": "summarize",
            "namespace": "default",
            "phase": "Canary",
            "version": "1.2.0",
            "canaryPercent": 20,
            "endpoint": "http://127.0.0.1:9001",
            "observedCommit": "abc123",
            "message": "canary 1.3.0 under test",
        }
    ]
    client = await make_gateway(Router(), list_workflows=lambda: listing)

    resp = await client.get("/workflows")
    assert resp.status_code == 200
    assert resp.json() == listing

    resp = await client.get("/healthz")
    assert resp.json() == {"status": "ok"}


async def test_git_hook_calls_reconciler(make_gateway: MakeGateway) -> None:
    calls: list[str] = []

    async def on_git_hook() -> None:
        calls.append("fetch")

    client = await make_gateway(Router(), on_git_hook=on_git_hook)
    resp = await client.post("/hooks/git", json={"ref": "refs/heads/main"})
    assert resp.status_code == 202
    assert resp.json() == {"accepted": True}
    assert calls == ["fetch"]

    without_hook = await make_gateway(Router())
    resp = await without_hook.post("/hooks/git")
    assert resp.status_code == 404


# --- live route changes ---------------------------------------------------------------------


async def test_route_swap_under_load_loses_nothing(start_server: StartServer, make_gateway: MakeGateway) -> None:
    # A little latency keeps requests in flight on v1 while it is being replaced.
    v1 = await start_server(make_test_runner("v1", delay_s=0.02))
    v2 = await start_server(make_test_runner("v2", delay_s=0.02))
    router = Router(RouteTable([route("summarize", backend(v1, "v1"))]))
    client = await make_gateway(router)

    n, concurrency = 200, 20
    sem = asyncio.Semaphore(concurrency)
    swapped = False
    completed = 0
    drained_while_busy: list[bool] = []
    results: list[tuple[bool, int, Any]] = []  # (sent after swap, status, version or error body)

    async def one(i: int) -> None:
        nonlocal completed
        async with sem:
            after_swap = swapped
            resp = await client.post("/workflows/summarize/invoke", json={"i": i})
            body = resp.json()
            results.append((after_swap, resp.status_code, body.get("version") if resp.status_code == 200 else body))
            completed += 1

    async def promote() -> None:
        nonlocal swapped
        while completed < 50:
            await asyncio.sleep(0.005)
        # What the reconciler does on promotion: new table first; wait until requests that
        # already picked v1 are done; then retire v1 gracefully. Without the drain, a request
        # that picked v1 just before the swap can be written onto a keep-alive connection
        # v1 is closing, and fails with ReadError (about 1 run in 10 here).
        old = backend(v1, "v1")
        router.replace(RouteTable([route("summarize", backend(v2, "v2"))]))
        swapped = True
        drained_while_busy.append(router.in_flight_count(old) > 0)
        assert await router.drain(old, timeout_s=10)
        await v1.stop()

    await asyncio.gather(promote(), *(one(i) for i in range(n)))

    assert len(results) == n
    assert [r for r in results if r[1] != 200] == []
    versions_before = {v for after, _, v in results if not after}
    versions_after = {v for after, _, v in results if after}
    assert "v1" in versions_before  # the swap really happened mid-load
    assert drained_while_busy == [True]  # ... with requests to v1 still in flight
    assert versions_after == {"v2"}

    # v1 is gone, and only v2 answers from now on.
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(trust_env=False) as direct:
            await direct.post(f"{backend(v1, 'v1').endpoint}/invoke", json={})
    later = await _invoke_many(client, "/workflows/summarize/invoke", 50, concurrency=10)
    assert {(r.status_code, r.json()["version"]) for r in later} == {(200, "v2")}


class PromoteAfterChoose(Router):
    """Router that swaps in `then` right after its first choice: a promotion landing between
    the gateway picking a runner and connecting to it (the old runner already stopped)."""

    def __init__(self, table: RouteTable, then: RouteTable) -> None:
        super().__init__(table)
        self._then: RouteTable | None = then

    def choose(self, route: Route, rng: random.Random | None = None, *, session: str | None = None,
               conversation: bytes | None = None) -> tuple[Backend, Track]:
        chosen = super().choose(route, rng, session=session, conversation=conversation)
        if self._then is not None:
            self.replace(self._then)
            self._then = None
        return chosen


async def test_refused_connect_retries_on_new_table(start_server: StartServer, make_gateway: MakeGateway) -> None:
    gone = Backend(endpoint=f"http://127.0.0.1:{free_port()}", version="v1", release_id="rel-v1")
    v2 = await start_server(make_test_runner("v2"))
    router = PromoteAfterChoose(
        RouteTable([route("summarize", gone)]), then=RouteTable([route("summarize", backend(v2, "v2"))])
    )
    client = await make_gateway(router)

    resp = await client.post("/workflows/summarize/invoke", json={"x": 1})

    assert resp.status_code == 200
    assert resp.json() == {"version": "v2", "echo": {"x": 1}}
    assert resp.headers["x-plnt-version"] == "v2"


# --- server helper --------------------------------------------------------------------------


async def test_server_leaves_signal_handlers_alone() -> None:
    # uvicorn's Server.serve() would install its own SIGINT/SIGTERM handlers on the main
    # thread (where pytest runs us); plnt up owns them, so serving must not touch them.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    async with GatewayServer(make_test_runner("v1")) as server:
        during = {sig: signal.getsignal(sig) for sig in before}
        async with httpx.AsyncClient(trust_env=False) as client:
            assert (await client.get(f"{server.url}/healthz")).json() == {"status": "ok"}
    assert during == before
    assert {sig: signal.getsignal(sig) for sig in before} == before


async def test_port_in_use_raises_instead_of_exiting() -> None:
    # uvicorn calls sys.exit() when it cannot bind; that must not escape into the shared loop.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ServerStartError):
            await GatewayServer(make_test_runner("v1"), port=port).start()
