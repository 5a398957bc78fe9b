"""`GET /metrics` after some traffic: Prometheus text, one registry per gateway app.

The runners are fake runners (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner."""

from __future__ import annotations

import asyncio

import pytest
from plnt.core.routes import RouteTable
from plnt.gateway.router import Router
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

pytestmark = pytest.mark.integration


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(all_samples: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return all_samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_metrics_after_traffic(start_server: StartServer, start_gateway: StartGateway) -> None:
    v1, v2 = FakeRunner("v1"), FakeRunner("v2", fail_status=500)
    s1, s2 = await start_server(v1.app()), await start_server(v2.app())
    router = Router(RouteTable([route("assistant", backend(s1, "v1"), backend(s2, "v2"), percent=50)]))
    gw = await start_gateway(router)
    c = gw.client

    # Sessions pin the split so the counts are exact: find 3 sessions on each track.
    on: dict[str, list[str]] = {"stable": [], "canary": []}
    i = 0
    while min(len(v) for v in on.values()) < 3:
        track = router.choose(router.table.lookup("assistant"), session=f"s{i}")[1]  # type: ignore[arg-type]
        on[track].append(f"s{i}")
        i += 1
    for track in ("stable", "canary"):
        for session in on[track][:3]:
            await c.post("/workflows/assistant/invoke", json={}, headers={"x-session-id": session})
    await c.post("/workflows/assistant/invoke", json={}, headers={"x-session-id": on["stable"][0],
                                                                   "accept": "text/event-stream"})
    await c.post("/v1/chat/completions", headers={"x-session-id": on["stable"][0]},
                 json={"model": "assistant", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    await c.post("/workflows/missing/invoke", json={})

    # A request in flight while /metrics is read.
    hold = asyncio.Event()
    v1.hold = hold
    async with c.stream("POST", "/workflows/assistant/invoke", json={},
                        headers={"x-session-id": on["stable"][0], "accept": "text/event-stream"}) as held:
        chunks = held.aiter_raw()
        await anext(chunks)
        during = samples((await c.get("/metrics")).text)
        hold.set()
        async for _ in chunks:
            pass

    assert during[("plnt_gateway_in_flight_requests", (("api", "invoke"),))] == 1
    after = samples((await c.get("/metrics")).text)
    assert after[("plnt_gateway_in_flight_requests", (("api", "invoke"),))] == 0

    route_labels = {"api": "invoke", "namespace": "default", "workflow": "assistant"}
    stable = {**route_labels, "version": "v1", "track": "stable"}
    canary = {**route_labels, "version": "v2", "track": "canary"}
    assert value(after, "plnt_gateway_requests_total", **stable, code="200") == 5  # 3 JSON + 2 streams
    assert value(after, "plnt_gateway_requests_total", **canary, code="500") == 3
    assert value(after, "plnt_gateway_errors_total", **canary, type="step_failed") == 3
    assert value(after, "plnt_gateway_request_duration_seconds_count", **stable) == 5
    assert value(after, "plnt_gateway_request_duration_seconds_bucket", **stable, le="+Inf") == 5
    assert value(after, "plnt_gateway_ttft_seconds_count", **stable) == 2  # the two streams
    assert value(after, "plnt_gateway_ttft_seconds_count", **{**stable, "api": "chat"}) == 1
    assert value(after, "plnt_gateway_requests_total", **{**stable, "api": "chat"}, code="200") == 1
    # Unknown workflows do not create label values from what clients send.
    unrouted = {"api": "invoke", "namespace": "", "workflow": "", "version": "", "track": ""}
    assert value(after, "plnt_gateway_requests_total", **unrouted, code="404") == 1
    assert value(after, "plnt_gateway_errors_total", **unrouted, type="not_found") == 1


async def test_registries_are_per_app(start_gateway: StartGateway) -> None:
    a = await start_gateway(Router())
    b = await start_gateway(Router())
    await a.client.post("/workflows/x/invoke", json={})
    text_b = (await b.client.get("/metrics")).text
    assert 'code="404"' not in text_b
    assert 'code="404"' in (await a.client.get("/metrics")).text
    assert (await a.client.get("/metrics")).headers["content-type"].startswith("text/plain")
