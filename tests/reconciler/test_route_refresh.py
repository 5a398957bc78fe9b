"""Route rebuilds are batched per event-loop turn (Plnt.refresh_routes), and a drain flushes a pending
rebuild first. Unit tests of that scheduling: the driver is the declared FAKE (tests/fake_driver.py,
counting snapshots), the router and status store are plnt's own."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from plnt.core.status import Phase
from plnt.gateway.router import Router
from plnt.reconciler.app import Plnt, _drain_after_flush, build_route_table
from plnt.reconciler.state import LiveWorkflow, Release
from plnt.reconciler.status_store import StatusStore

from tests.fake_driver import FakeDriver


def _plnt(tmp_path: Path) -> tuple[Plnt, FakeDriver]:
    driver = FakeDriver()
    statuses = StatusStore(tmp_path / "status.json")
    none: Any = None
    plnt = Plnt(settings=none, state=none, client=none, statuses=statuses, driver=driver,  # type: ignore[arg-type]
                router=Router(), reconciler=none, gateway=none, stop_event=asyncio.Event())
    statuses.on_change = plnt.refresh_routes
    return plnt, driver


def _release(track: str) -> Release:
    return Release(namespace="default", name="a", track=track, version="1.0.0", spec_fingerprint="f",
                   recipe_digest="sha256:" + "0" * 64, recipe_dir="/r", endpoint="http://127.0.0.1:1", release_id="a-1",
                   pid=1, port=1)


async def test_many_changes_in_one_turn_rebuild_once(tmp_path: Path) -> None:
    plnt, driver = _plnt(tmp_path)
    for phase in (Phase.PENDING, Phase.VERIFYING, Phase.DEPLOYING):
        plnt.statuses.update("default", "a", phase=phase)
    assert driver.snapshots == 0  # nothing rebuilt yet: the turn is not over
    await asyncio.sleep(0)
    assert driver.snapshots == 1
    assert plnt.router.table.lookup("a", "default") is not None  # the status's route (no backend yet: 503)
    plnt.statuses.update("default", "a", phase=Phase.CANARY)
    await asyncio.sleep(0.05)  # a cheap rebuild waits ten times its own cost after the last: well under this
    assert driver.snapshots == 2


async def test_a_costly_rebuild_is_not_repeated_on_the_next_turn(tmp_path: Path) -> None:
    plnt, _ = _plnt(tmp_path)
    driver = FakeDriver(snapshot_cost_s=0.03)  # as 1,000 release records and statuses might cost
    plnt.driver = driver  # type: ignore[assignment]
    plnt.statuses.update("default", "a", phase=Phase.PENDING)
    await asyncio.sleep(0)
    assert driver.snapshots == 1
    plnt.statuses.update("default", "a", phase=Phase.VERIFYING)
    for _ in range(5):
        await asyncio.sleep(0)
    assert driver.snapshots == 1, "rebuilt again at once: a costly rebuild must leave the loop time"
    plnt.statuses.update("default", "a", phase=Phase.DEPLOYING)  # joins the pending one
    await asyncio.sleep(0.6)  # at most MAX_WAIT_S (0.5 s) after the last
    assert driver.snapshots == 2
    plnt.statuses.update("default", "a", phase=Phase.CANARY)
    plnt.flush_routes()  # a flush (before a drain) never waits
    assert driver.snapshots == 3


def test_without_a_loop_the_rebuild_is_immediate(tmp_path: Path) -> None:
    plnt, driver = _plnt(tmp_path)
    plnt.statuses.update("default", "a", phase=Phase.PENDING)
    assert driver.snapshots == 1


async def test_drain_flushes_a_pending_rebuild_first(tmp_path: Path) -> None:
    plnt, driver = _plnt(tmp_path)
    old = _release("stable")
    driver.records["default/a"] = LiveWorkflow(namespace="default", name="a", stable=old)
    plnt.flush_routes()
    plnt.refresh_routes()
    await asyncio.sleep(0)
    route = plnt.router.table.lookup("a", "default")
    assert route is not None and route.stable is not None
    driver.records.clear()  # the release record is gone (promoted away) ...
    plnt.refresh_routes()  # ... and its rebuild is pending when the driver drains the old runner
    assert await _drain_after_flush({"plnt": plnt}, plnt.router, old, 1.0)
    route = plnt.router.table.lookup("a", "default")
    assert route is None or route.stable is None


def _live(name: str, port: int, traffic_percent: int | None = None) -> LiveWorkflow:
    def release(track: str, port: int) -> Release:
        return Release(release_id=f"{name}-{track}-{port}", namespace="default", name=name, track=track,
                       version=f"1.0.{port}", spec_fingerprint="sha256:" + "a" * 64,
                       recipe_digest="sha256:" + "0" * 64, recipe_dir="/tmp", endpoint=f"http://127.0.0.1:{port}",
                       traffic_percent=traffic_percent or 0)
    canary = release("canary", port + 1) if traffic_percent is not None else None
    return LiveWorkflow(namespace="default", name=name, stable=release("stable", port), canary=canary)


def test_a_rebuild_reuses_the_routes_of_unchanged_records_and_equals_a_build_from_scratch(tmp_path: Path) -> None:
    statuses = StatusStore(tmp_path / "status.json")
    statuses.update("default", "pending-only", phase=Phase.PENDING)
    built: dict[str, Any] = {}
    first = {"default/a": _live("a", 20000), "default/b": _live("b", 20010, traffic_percent=20)}
    table = build_route_table(first, statuses, built)
    assert _routes(table) == _routes(build_route_table(first, statuses))
    before = {route.name: route for route in table}
    assert before["pending-only"].stable is None and before["b"].traffic_percent == 20

    # b changed (a new record object), c appeared, a is the same object: only a's route is reused.
    second = {"default/a": first["default/a"], "default/b": _live("b", 20010, traffic_percent=50),
              "default/c": _live("c", 20020)}
    table = build_route_table(second, statuses, built)
    after = {route.name: route for route in table}
    assert after["a"] is before["a"]
    assert after["b"] is not before["b"] and after["b"].traffic_percent == 50
    assert _routes(table) == _routes(build_route_table(second, statuses))
    # a gone: its route and its cached entry too.
    table = build_route_table({"default/b": second["default/b"]}, statuses, built)
    assert sorted(r.name for r in table) == ["b", "pending-only"] and set(built) == {"default/b"}


def _routes(table: Any) -> list[Any]:
    return sorted(table, key=lambda route: (route.namespace, route.name))
