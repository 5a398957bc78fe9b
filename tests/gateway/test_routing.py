"""Weighted canary routing, session stickiness, several stable replicas and the retry.

The runners are fake runners (FakeRunner, tests/gateway/fakes.py), standing in for plnt.runner."""

from __future__ import annotations

import asyncio
import hashlib
import math
import random

import httpx
import pytest
from plnt.core.routes import Backend, Route, RouteTable, session_bucket
from plnt.core.upstream import UpstreamClient
from plnt.gateway.router import Router
from plnt.reconciler.drivers.processes import free_port

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

# No module-wide mark: tests that request a server fixture are marked integration by tests/hygiene.py.


async def post_many(url: str, path: str, n: int, concurrency: int, headers: list[tuple[str, str]] | None = None,
                    session_of=None) -> list[tuple[int, str, str]]:  # type: ignore[no-untyped-def]
    """(status, x-plnt-track, x-plnt-version) of n POSTs. Uses the gateway's own lean HTTP client
    as the load generator: 2,000 requests through httpx would take ~5 s of this suite."""
    client = UpstreamClient(read_timeout_s=30)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[int, str, str]:
        extra = list(headers or [])
        if session_of is not None:
            extra.append(("x-session-id", session_of(i)))
        async with sem:
            resp = await client.request(url, "POST", path, body=b'{"i": %d}' % i,
                                        headers=[("content-type", "application/json"), *extra])
        return resp.status, (resp.header(b"x-plnt-track") or b"").decode(), (resp.header(b"x-plnt-version") or b"").decode()

    try:
        return await asyncio.gather(*(one(i) for i in range(n)))
    finally:
        await client.aclose()


async def test_weighted_routing_five_percent(start_server: StartServer, start_gateway: StartGateway) -> None:
    """Two fake runners (tests/gateway/fakes.py) stand in for runner releases v1 and v2."""
    v1, v2 = await start_server(FakeRunner("v1").app()), await start_server(FakeRunner("v2").app())
    # Seeded (the production RNG class, random.Random, with a fixed seed): reproducible; the bound
    # below is still what any correct 5% split must meet.
    router = Router(RouteTable([route("assistant", backend(v1, "v1"), backend(v2, "v2"), percent=5)]),
                    rng=random.Random(20251130))
    gw = await start_gateway(router)

    n, p = 2000, 0.05
    results = await post_many(gw.url, "/workflows/assistant/invoke", n, concurrency=32)

    assert {status for status, _, _ in results} == {200}
    assert all(version == {"stable": "v1", "canary": "v2"}[track] for _, track, version in results)
    canary = sum(track == "canary" for _, track, _ in results)
    # Each request is an independent Bernoulli(0.05) draw, so the canary count is
    # Binomial(2000, 0.05): mean 100, sigma = sqrt(2000 * 0.05 * 0.95) = 9.75. Accept the
    # mean +- 3 sigma (71..129): a correct split falls outside 0.27% of the time (the normal
    # approximation is good here: n*p = 100). A 4% or 6% split (mean 80 or 120) would pass
    # sometimes, but 2.5% or 10% (mean 50 or 200) never.
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(canary - n * p) <= 3 * sigma, canary


async def test_session_sticks_to_one_version(start_server: StartServer, start_gateway: StartGateway) -> None:
    v1, v2 = await start_server(FakeRunner("v1").app()), await start_server(FakeRunner("v2").app())
    router = Router(RouteTable([route("assistant", backend(v1, "v1"), backend(v2, "v2"), percent=30)]))
    gw = await start_gateway(router)

    sessions, repeats = 200, 5
    results = await post_many(gw.url, "/workflows/assistant/invoke", sessions * repeats, concurrency=32,
                              session_of=lambda i: f"conversation-{i % sessions}")
    by_session: dict[int, set[str]] = {}
    for i, (status, _, version) in enumerate(results):
        assert status == 200
        by_session.setdefault(i % sessions, set()).add(version)
    assert all(len(versions) == 1 for versions in by_session.values())  # sticky

    # The documented hash decides: sha256("namespace/name\nsession") -> first 8 bytes, mod 10000.
    def documented(session: str) -> str:
        digest = hashlib.sha256(f"default/assistant\n{session}".encode()).digest()
        return "v2" if int.from_bytes(digest[:8], "big") % 10_000 < 30 * 100 else "v1"

    assert all(by_session[s] == {documented(f"conversation-{s}")} for s in by_session)
    # ... and still splits sessions by the percentage: Binomial(200, 0.3), mean 60, sigma 6.5.
    on_canary = sum(by_session[s] == {"v2"} for s in by_session)
    assert abs(on_canary - 60) <= 3 * math.sqrt(200 * 0.3 * 0.7), on_canary


def test_session_bucket_growing_canary_keeps_its_sessions() -> None:
    v1, v2 = Backend("http://127.0.0.1:1", "v1", "r1"), Backend("http://127.0.0.1:2", "v2", "r2")
    router = Router()
    sessions = [f"s{i}" for i in range(2000)]
    on_canary = {}
    for percent in (5, 20, 50, 100):
        r = Route("default", "assistant", stable=v1, canary=v2, traffic_percent=percent)
        now = {s for s in sessions if router.choose(r, session=s)[1] == "canary"}
        assert all(s in now for s in on_canary.get("prev", set()))  # nobody leaves the canary as it grows
        on_canary["prev"] = now
    assert len(on_canary["prev"]) == 2000
    # The bucket depends on the workflow too: one session is not on every canary at once.
    other = Route("default", "other", stable=v1, canary=v2, traffic_percent=50)
    same = Route("default", "assistant", stable=v1, canary=v2, traffic_percent=50)
    assert [session_bucket(other, s) for s in sessions[:50]] != [session_bucket(same, s) for s in sessions[:50]]


async def test_refused_connect_retried_on_another_stable_replica(start_server: StartServer,
                                                                 start_gateway: StartGateway) -> None:
    a_runner, b_runner = FakeRunner("v1"), FakeRunner("v1")
    a, b = await start_server(a_runner.app()), await start_server(b_runner.app())
    replicas = (backend(a, "v1"), backend(b, "v1"))
    router = Router(RouteTable([route("assistant", None, replicas=replicas)]))
    gw = await start_gateway(router)

    # Both replicas serve, in turn.
    results = await post_many(gw.url, "/workflows/assistant/invoke", 20, concurrency=1)
    assert {r[0] for r in results} == {200}
    assert len(a_runner.requests) == 10 and len(b_runner.requests) == 10

    # Replica a goes away (its port now refuses): every request still succeeds, on b.
    await a.stop()
    results = await post_many(gw.url, "/workflows/assistant/invoke", 20, concurrency=4)
    assert {r[0] for r in results} == {200}
    assert len(a_runner.requests) == 10 and len(b_runner.requests) == 30
    metrics = (await gw.client.get("/metrics")).text
    assert 'plnt_gateway_retries_total{namespace="default",reason="connect_refused",workflow="assistant"}' in metrics

    # Streams and chat completions are retried the same way (nothing was sent before the refusal).
    for _ in range(2):
        resp = await gw.client.post("/workflows/assistant/invoke", json={}, headers={"accept": "text/event-stream"})
        assert resp.status_code == 200 and b"event: result" in resp.content
        resp = await gw.client.post("/v1/chat/completions",
                                    json={"model": "assistant", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 200


async def test_all_replicas_refusing_is_502(start_gateway: StartGateway) -> None:
    dead = tuple(Backend(f"http://127.0.0.1:{free_port()}", "v1", "rel-v1") for _ in range(2))
    gw = await start_gateway(Router(RouteTable([route("assistant", None, replicas=dead)])))
    resp = await gw.client.post("/workflows/assistant/invoke", json={})
    assert resp.status_code == 502
    assert resp.json()["error"]["type"] == "upstream_unavailable"


async def test_dead_canary_falls_back_to_stable(start_server: StartServer, start_gateway: StartGateway) -> None:
    v1 = await start_server(FakeRunner("v1").app())
    dead_canary = Backend(f"http://127.0.0.1:{free_port()}", "v2", "rel-v2")
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(v1, "v1"), dead_canary, percent=100)])))
    resp = await gw.client.post("/workflows/assistant/invoke", json={})
    assert resp.status_code == 200
    assert resp.headers["x-plnt-track"] == "stable" and resp.json()["version"] == "v1"


def test_route_stable_and_replicas_agree() -> None:
    a, b = Backend("http://127.0.0.1:1", "v1", "r"), Backend("http://127.0.0.1:2", "v1", "r")
    assert Route("ns", "wf", stable=a).stable_replicas == (a,)
    assert Route("ns", "wf", stable=None, stable_replicas=(a, b)).stable == a
    assert Route("ns", "wf", stable=None).stable_replicas == ()
    with pytest.raises(ValueError):
        Route("ns", "wf", stable=b, stable_replicas=(a, b))
    with pytest.raises(ValueError):
        Route("ns", "wf", stable=None, stable_replicas=(a, a))


async def test_health_of_gateway_needs_no_runner(start_gateway: StartGateway) -> None:
    gw = await start_gateway(Router())
    assert (await gw.client.get("/healthz")).json() == {"status": "ok"}
    async with httpx.AsyncClient(trust_env=False) as client:
        assert (await client.get(f"{gw.url}/workflows/x/invoke")).status_code in (404, 405)


async def test_a_header_cohort_goes_to_the_canary_whatever_its_share(start_server: StartServer,
                                                                     start_gateway: StartGateway) -> None:
    """canary.headerRoute: with 0% of the traffic, only requests of the cohort reach the canary (v2);
    another value, no header, or X-Plnt-Track: stable do not. Fake runners stand in for releases."""
    v1, v2 = await start_server(FakeRunner("v1").app()), await start_server(FakeRunner("v2").app())
    cohort = Route(namespace="default", name="assistant", stable=backend(v1, "v1"), canary=backend(v2, "v2"),
                   traffic_percent=0, canary_header=("x-cohort", "testers"))
    gw = await start_gateway(Router(RouteTable([cohort])))
    testers = await post_many(gw.url, "/workflows/assistant/invoke", 50, 8, headers=[("X-Cohort", "testers")])
    others = await post_many(gw.url, "/workflows/assistant/invoke", 50, 8, headers=[("X-Cohort", "everyone")])
    plain = await post_many(gw.url, "/workflows/assistant/invoke", 50, 8)
    pinned = await post_many(gw.url, "/workflows/assistant/invoke", 10, 4,
                             headers=[("X-Cohort", "testers"), ("X-Plnt-Track", "stable")])
    assert {(s, t, v) for s, t, v in testers} == {(200, "canary", "v2")}
    assert {(s, t, v) for s, t, v in others + plain + pinned} == {(200, "stable", "v1")}



async def test_a_shadow_share_is_mirrored_to_the_canary_and_its_answers_discarded(
        start_server: StartServer, start_gateway: StartGateway) -> None:
    """canary.shadowPercent 100 with 0% of the traffic: every invocation is answered by the stable
    (v1) and also sent to the canary (v2), marked X-Plnt-Shadow, recorded as track "shadow". A
    client's own X-Plnt-Shadow never reaches a runner. Fake runners stand in for releases."""
    stable, canary = FakeRunner("v1"), FakeRunner("v2", delay_s=0.05)
    v1, v2 = await start_server(stable.app()), await start_server(canary.app())
    mirrored = Route(namespace="default", name="assistant", stable=backend(v1, "v1"), canary=backend(v2, "v2"),
                     traffic_percent=0, shadow_percent=100)
    gw = await start_gateway(Router(RouteTable([mirrored])))
    answers = await post_many(gw.url, "/workflows/assistant/invoke", 20, 4, headers=[("X-Plnt-Shadow", "0")])
    assert {(s, t, v) for s, t, v in answers} == {(200, "stable", "v1")}
    for _ in range(100):
        if len(canary.requests) == 20:
            break
        await asyncio.sleep(0.05)
    assert len(canary.requests) == 20 and {r["headers"].get("x-plnt-shadow") for r in canary.requests} == {"1"}
    assert "x-plnt-shadow" not in stable.requests[0]["headers"], "a client's header is not passed on"
    assert [r["body"] for r in canary.requests] == [r["body"] for r in stable.requests]
    # A mirror is recorded once the canary's answer came back (after the canary saw the request).
    for _ in range(100):
        calls = (await gw.client.get("/calls", params={"limit": 100})).json()
        if sum(1 for c in calls if c["track"] == "shadow") == 20:
            break
        await asyncio.sleep(0.05)
    assert sorted({c["track"] for c in calls}) == ["shadow", "stable"]
    assert {c["version"] for c in calls if c["track"] == "shadow"} == {"v2"}
    metrics = (await gw.client.get("/metrics")).text
    assert 'track="shadow"' in metrics and 'version="v2"' in metrics
