"""Unit tests of the route table and the stable/canary choice (no servers)."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from plnt.core.routes import AmbiguousRoute, Backend, Route, RouteNotReady, RouteTable
from plnt.gateway.router import Router

V1 = Backend(endpoint="http://127.0.0.1:9001", version="v1", release_id="r1")
V2 = Backend(endpoint="http://127.0.0.1:9002", version="v2", release_id="r2")


def test_lookup_by_name_and_namespace() -> None:
    summarize = Route("team-a", "summarize", stable=V1)
    translate_a = Route("team-a", "translate", stable=V1)
    translate_b = Route("team-b", "translate", stable=V2)
    table = RouteTable([summarize, translate_a, translate_b])

    assert table.lookup("summarize") is summarize
    assert table.lookup("summarize", "team-a") is summarize
    assert table.lookup("summarize", "team-b") is None
    assert table.lookup("missing") is None
    assert table.lookup("translate", "team-b") is translate_b
    assert len(table) == 3
    assert set(table) == {summarize, translate_a, translate_b}


def test_lookup_ambiguous_name_lists_namespaces() -> None:
    table = RouteTable([Route("team-b", "translate", stable=V2), Route("team-a", "translate", stable=V1)])
    with pytest.raises(AmbiguousRoute) as info:
        table.lookup("translate")
    assert info.value.namespaces == ["team-a", "team-b"]


def test_duplicate_route_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        RouteTable([Route("ns", "wf", stable=V1), Route("ns", "wf", stable=V2)])


@pytest.mark.parametrize("percent", [-1, 101])
def test_traffic_percent_out_of_range_rejected(percent: int) -> None:
    with pytest.raises(ValueError):
        Route("ns", "wf", stable=V1, canary=V2, traffic_percent=percent)


def test_choose_stable_only() -> None:
    router = Router()
    route = Route("ns", "wf", stable=V1)
    assert all(router.choose(route, random.Random(i)) == (V1, "stable") for i in range(100))


def test_choose_canary_zero_percent_never_canary() -> None:
    rng = random.Random(7)
    route = Route("ns", "wf", stable=V1, canary=V2, traffic_percent=0)
    assert {Router().choose(route, rng)[1] for _ in range(10_000)} == {"stable"}


def test_choose_canary_hundred_percent_always_canary() -> None:
    rng = random.Random(7)
    route = Route("ns", "wf", stable=V1, canary=V2, traffic_percent=100)
    assert {Router().choose(route, rng) for _ in range(10_000)} == {(V2, "canary")}


def test_choose_percent_without_canary_goes_stable() -> None:
    route = Route("ns", "wf", stable=V1, canary=None, traffic_percent=50)
    assert {Router().choose(route, random.Random(1))[1] for _ in range(100)} == {"stable"}


def test_choose_canary_share_seeded() -> None:
    route = Route("ns", "wf", stable=V1, canary=V2, traffic_percent=20)
    n, p = 10_000, 0.2
    rng = random.Random(1234)
    tracks = [Router().choose(route, rng)[1] for _ in range(n)]
    canary = tracks.count("canary")
    # Binomial(n, p): mean n*p, sigma sqrt(n*p*(1-p)) = 40; 3 sigma = 120. Seeded, so this
    # never flakes, but the bound is what a correct 20% split has to satisfy for any seed.
    assert abs(canary - n * p) <= 3 * math.sqrt(n * p * (1 - p))
    # Same seed, same sequence: the split is reproducible.
    rng = random.Random(1234)
    again = [Router().choose(route, rng)[1] for _ in range(n)]
    assert again == tracks


def test_router_default_rng_is_injectable() -> None:
    route = Route("ns", "wf", stable=V1, canary=V2, traffic_percent=50)
    a = Router(rng=random.Random(99))
    b = Router(rng=random.Random(99))
    assert [a.choose(route) for _ in range(200)] == [b.choose(route) for _ in range(200)]


def test_choose_not_ready_even_with_canary() -> None:
    router = Router()
    with pytest.raises(RouteNotReady):
        router.choose(Route("ns", "wf", stable=None))
    # A canary alone never takes all the traffic.
    with pytest.raises(RouteNotReady):
        router.choose(Route("ns", "wf", stable=None, canary=V2, traffic_percent=100))


def test_replace_swaps_snapshot_atomically() -> None:
    old = RouteTable([Route("ns", "wf", stable=V1)])
    new = RouteTable([Route("ns", "wf", stable=V2)])
    router = Router(old)
    held = router.table  # what an in-flight request looked at
    router.replace(new)
    assert router.table is new
    # The held snapshot is unchanged: in-flight requests keep a consistent view.
    assert held.lookup("wf") == Route("ns", "wf", stable=V1)
    assert router.table.lookup("wf") == Route("ns", "wf", stable=V2)


def test_empty_router() -> None:
    router = Router()
    assert len(router.table) == 0
    assert router.table.lookup("anything") is None


async def test_drain_waits_for_in_flight_requests() -> None:
    router = Router(RouteTable([Route("ns", "wf", stable=V1)]))
    assert await router.drain(V1)  # nothing in flight: immediate

    release = asyncio.Event()

    async def request() -> None:
        with router.in_flight(V1):
            await release.wait()

    tasks = [asyncio.create_task(request()) for _ in range(3)]
    await asyncio.sleep(0)
    assert router.in_flight_count(V1) == 3
    assert router.in_flight_count(V2) == 0
    assert not await router.drain(V1, timeout_s=0.05)

    drain = asyncio.create_task(router.drain(V1, timeout_s=5))
    await asyncio.sleep(0)
    assert not drain.done()
    release.set()
    await asyncio.gather(*tasks)
    assert await drain
    assert router.in_flight_count(V1) == 0


def test_in_flight_released_on_error() -> None:
    router = Router()
    with pytest.raises(RuntimeError), router.in_flight(V1):
        raise RuntimeError("upstream broke")
    assert router.in_flight_count(V1) == 0
