"""A pool's Helm releases, the pure parts, table-tested: the replica count and placement each backend's
release is rendered with (`pool_replicas`), and how the releases of several backends become the one
Release the plan and the gateway see (`merged`, `merged_live`, `Release.replicas_by_backend`); and,
over FAKE Helm drivers, the order the DriverSet keeps when a backend leaves (routes, drain, uninstall)
and a live read racing a re-placement. The helm calls themselves run against a real cluster in
tests/k8s/test_pool_on_cluster.py and, through `plnt up`, tests/k8s/test_pool_through_plnt_up.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.models import PlntBackend, WorkflowRun
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.helm import chart_replicas, pool_replicas
from plnt.reconciler.drivers.helm_pool import merged, merged_live
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import LiveWorkflow, Release, StateDir

from tests.reconciler.drivers.test_helm_driver import request


def kube(name: str) -> PlntBackend:
    return PlntBackend.model_validate({"apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": name},
                                       "spec": {"type": "kubernetes", "kubernetes": {"namespace": f"agents-{name}"}}})


def helm_release(backend: str, pods: int, release_id: str = "team-a.rr.1.2.0.aaaa", track: str = "stable") -> Release:
    """A release as HelmDriver reads one backend's back: its Service, its pods, the pool's placement."""
    return Release(release_id=release_id, namespace="team-a", name="rr", track=track, version="1.2.0",
                   spec_fingerprint="sha256:" + "1" * 64, recipe_digest="sha256:" + "2" * 64, recipe_dir="/r",
                   endpoint=f"http://rr.agents-{backend}.svc.cluster.local", replicas=pods,
                   placement={"east": 1, "west": 1}, backend=backend)


@pytest.mark.parametrize(("track", "placement", "backend", "shape", "expected"), [
    ("stable", None, "east", {"min": 3, "max": 5}, {"replicas": {"min": 3, "max": 5}}),  # one backend: the spec's
    ("canary", {"east": 2, "west": 1}, "east", {"min": 3, "max": 3},
     {"replicas": {"min": 1, "max": 1}, "placement": {"east": 2, "west": 1}}),  # a pool's canary: one pod
    ("stable", {"east": 2, "west": 1}, "east", {"min": 3, "max": 3},
     {"replicas": {"min": 2, "max": 2}, "placement": {"east": 2, "west": 1}}),
    ("stable", {"east": 2, "west": 1}, "west", 3, {"replicas": 1, "placement": {"east": 2, "west": 1}}),  # a model's
])
def test_a_pools_release_on_a_backend_runs_that_backends_count(track: str, placement: dict[str, int] | None,
                                                                backend: str, shape: Any, expected: Any) -> None:
    wanted = request(track=track).model_copy(update={"placement": placement})
    assert pool_replicas(wanted, kube(backend), shape) == expected


def test_a_backend_the_placement_leaves_out_gets_no_stable_release() -> None:
    wanted = request(track="stable").model_copy(update={"placement": {"east": 2}})
    with pytest.raises(DriverError, match="puts no stable replica on backend 'west'"):
        pool_replicas(wanted, kube("west"), {"min": 2, "max": 2})
    assert chart_replicas({"min": 1, "max": 9}, 4) == {"min": 4, "max": 4} and chart_replicas(1, 4) == 4


@pytest.mark.parametrize(("releases", "endpoints", "placement"), [
    ([helm_release("east", 1), helm_release("west", 1)],
     ("http://rr.agents-east.svc.cluster.local", "http://rr.agents-west.svc.cluster.local"), {"east": 1, "west": 1}),
    ([helm_release("east", 3)], ("http://rr.agents-east.svc.cluster.local",), {"east": 3}),
    # A promotion half done: west still runs the old release; the routes send to the one with more pods.
    ([helm_release("east", 2), helm_release("west", 1, release_id="team-a.rr.1.1.0.bbbb")],
     ("http://rr.agents-east.svc.cluster.local",), {"east": 2}),
])
def test_a_pools_releases_merge_into_one_with_an_endpoint_per_backend(
        releases: list[Release], endpoints: tuple[str, ...], placement: dict[str, int]) -> None:
    pool = merged(releases)
    assert pool.endpoints == endpoints
    assert pool.placement == placement and pool.replicas == sum(placement.values())
    assert pool.replicas_by_backend() == placement  # the pods per backend, not one per Service


def test_a_pools_live_state_is_its_members_views_merged() -> None:
    canary = helm_release("east", 1, release_id="team-a.rr.1.3.0.cccc", track="canary")
    views = [LiveWorkflow(namespace="team-a", name="rr", stable=helm_release("east", 1), canary=canary),
             LiveWorkflow(namespace="team-a", name="rr", stable=helm_release("west", 2))]
    live = merged_live(views)
    assert live is not None and live.canary == canary
    assert live.stable is not None and live.stable.replicas_by_backend() == {"east": 1, "west": 2}
    assert merged_live([]) is None


def test_a_local_pools_processes_are_counted_one_by_one() -> None:
    """A local pool's release names a pid: each process counts, whatever the placement says."""
    local = helm_release("east", 2).model_copy(update={"pid": 42, "placement": {"east": 2}})
    assert local.replicas_by_backend() == {"east": 1}  # one process recorded so far


# --- the DriverSet's pool over FAKE Helm drivers: the order of routes, drain and uninstall ----------

KEY = "team-a/rr"
EAST, WEST = "http://rr.agents-east.svc.cluster.local", "http://rr.agents-west.svc.cluster.local"


class FakeMember:
    """FAKE HelmDriver of one pool member (no helm, no cluster): its stable release in memory, each call
    logged in `events`; with `gate` set, `live()` reads the release first and answers once the gate opens
    (a `helm list` under way while plnt changes the backend); with `upgrading` set, `place()` holds the
    release pending until it opens (a helm upgrade --wait)."""

    def __init__(self, name: str, events: list[tuple[Any, ...]]) -> None:
        self.name, self.events = name, events
        self.stable: Release | None = helm_release(name, 1)
        self.gate: asyncio.Event | None = None
        self.upgrading: asyncio.Event | None = None  # set: `place` waits for it, its release pending meanwhile
        self.pending = False

    async def live(self) -> dict[str, LiveWorkflow]:
        # (a read that misses a release mid-change: HelmDriver.live leaves out one pending-install, and read
        # a pending-upgrade one so before it took the revision before)
        view = {KEY: LiveWorkflow(namespace="team-a", name="rr", stable=self.stable)} \
            if self.stable and not self.pending else {}
        if self.gate is not None:
            self.events.append(("reading", self.name))
            await self.gate.wait()
        return view

    async def track_values(self, namespace: str, name: str, track: str) -> dict[str, Any] | None:
        return {"placement": self.stable.placement} if track == "stable" and self.stable is not None else None

    def release_of(self, namespace: str, name: str, track: str, values: dict[str, Any]) -> Release:
        return helm_release(self.name, 1, track=track)

    async def place(self, values: dict[str, Any], placement: dict[str, int]) -> Release:
        if self.upgrading is not None:  # helm upgrade --wait under way: helm lists it pending-upgrade
            self.pending = True
            await self.upgrading.wait()
            self.pending = False
        self.stable = helm_release(self.name, placement[self.name]).model_copy(update={"placement": placement})
        return self.stable

    async def remove(self, namespace: str, name: str, track: str) -> None:
        self.events.append(("uninstall", self.name, track))
        self.stable = None


def pool_of_fakes(tmp_path: Path, events: list[tuple[Any, ...]], *, drain: bool) -> tuple[DriverSet, dict[str, FakeMember]]:
    """A DriverSet whose WorkflowRun team-a/rr runs on a pool of two FAKE members, one pod on each;
    `events` gets each route change (the endpoints routed) and, with `drain`, each drain."""
    members = {name: FakeMember(name, events) for name in ("east", "west")}
    state = StateDir(tmp_path / "state").ensure()

    def routed() -> tuple[str, ...]:
        live = drivers.snapshot().get(KEY)
        return live.stable.endpoints if live is not None and live.stable is not None else ()

    async def drained(release: Release) -> None:
        events.append(("drain", release.endpoint, routed()))

    drivers = DriverSet(LocalDriver(state), state, lambda backend, _: members[backend.metadata.name],  # type: ignore[arg-type, return-value]
                        on_change=lambda: events.append(("routes", routed())), drain=drained if drain else None)
    run = WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "rr", "namespace": "team-a"},
        "spec": {"workflow": {"ref": "rr@1.2.0", "registry": "oci://registry.example/recipes"},
                 "backend": {"refs": ["east", "west"]}, "replicas": {"min": 2, "max": 2}}})
    drivers.remember(run, kube("east"), [kube("east"), kube("west")])
    return drivers, members


async def test_a_backend_placed_at_0_leaves_the_routes_is_drained_and_only_then_uninstalled(tmp_path: Path) -> None:
    """With FAKE Helm drivers: the order helm_pool keeps. Before, west was uninstalled right after it
    left the routes, and requests the gateways had sent it were cut (502) in the pool's e2e test."""
    events: list[tuple[Any, ...]] = []
    drivers, _ = pool_of_fakes(tmp_path, events, drain=True)
    assert (await drivers.live())[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]
    events.clear()
    moved = await drivers.place_replicas("team-a", "rr", {"east": 2, "west": 0})
    assert moved.endpoints == (EAST,) and moved.placement == {"east": 2}
    drains = [e for e in events if e[0] == "drain"]
    assert drains == [("drain", WEST, (EAST,))], events  # drained once out of the routes
    assert events.index(drains[0]) < events.index(("uninstall", "west", "stable")), events


async def test_a_live_read_begun_before_plnt_took_a_release_out_does_not_put_it_back(tmp_path: Path) -> None:
    """With FAKE Helm drivers: a pass's `helm list` of west, under way while the plan's re-placement
    takes west out of the routes and uninstalls it, answers what west ran before; that answer must not
    route to west again (it did, for a pass, and the gateways sent requests to pods being deleted)."""
    events: list[tuple[Any, ...]] = []
    drivers, members = pool_of_fakes(tmp_path, events, drain=False)
    await drivers.live()
    members["west"].gate = asyncio.Event()
    reading = asyncio.create_task(drivers.live())
    while ("reading", "west") not in events:
        await asyncio.sleep(0)
    await drivers.place_replicas("team-a", "rr", {"east": 2, "west": 0})
    assert ("uninstall", "west", "stable") in events
    members["west"].gate.set()
    stale = (await reading)[KEY].stable
    assert stale is not None and stale.endpoints == (EAST,), stale
    assert drivers.snapshot()[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]
    assert [e for e in events if e[0] == "routes"][-1] == ("routes", (EAST,)), events
    members["west"].gate = None
    assert (await drivers.live())[KEY].stable.replicas_by_backend() == {"east": 2}  # type: ignore[union-attr]


async def test_a_pools_removed_release_leaves_the_routes_on_every_backend_before_each_is_drained_and_uninstalled(
        tmp_path: Path) -> None:
    """With FAKE Helm drivers: a pool's release removed (the run gone from git) leaves the routes on both
    backends first; each is drained, then uninstalled."""
    events: list[tuple[Any, ...]] = []
    drivers, _ = pool_of_fakes(tmp_path, events, drain=True)
    await drivers.live()
    events.clear()
    await drivers.remove("team-a", "rr", "stable")
    assert [e for e in events if e[0] != "routes"] == [
        ("drain", EAST, ()), ("uninstall", "east", "stable"), ("drain", WEST, ()), ("uninstall", "west", "stable")]
    assert KEY not in drivers.snapshot()


async def test_a_live_read_while_plnt_upgrades_a_release_does_not_find_it_gone(tmp_path: Path) -> None:
    """With FAKE Helm drivers: a pass's live read while the re-placement's helm upgrade of east is under
    way finds east's release pending (the read misses it, as HelmDriver.live did). That is not gone: the
    release plnt knows stands, and the routes keep it. (It read as gone, and the reconciler started a
    self-heal saga in the middle of the move.)"""
    events: list[tuple[Any, ...]] = []
    drivers, members = pool_of_fakes(tmp_path, events, drain=False)
    await drivers.live()
    members["east"].upgrading = asyncio.Event()
    moving = asyncio.create_task(drivers.place_replicas("team-a", "rr", {"east": 2, "west": 0}))
    while not members["east"].pending:
        await asyncio.sleep(0)
    during = (await drivers.live())[KEY].stable
    assert during is not None and during.endpoints == (EAST, WEST), during
    members["east"].upgrading.set()
    moved = await moving
    assert moved.replicas_by_backend() == {"east": 2}
    assert (await drivers.live())[KEY].stable.replicas_by_backend() == {"east": 2}  # type: ignore[union-attr]


async def test_a_release_a_worker_uninstalls_leaves_the_routes_and_stays_out_until_a_read_finds_it_gone(
        tmp_path: Path) -> None:
    """The control plane's side of a worker's drain (the roles apart), over FAKE Helm drivers: west's
    release a worker is about to uninstall leaves the routes at once (`leaving`, asked by POST
    /internal/drain), and a live read that still finds it (the worker's uninstall not done yet, or a
    read begun before) does not route to it again. Once a read finds it gone the mark ends, and a
    release placed there later is routed."""
    events: list[tuple[Any, ...]] = []
    drivers, members = pool_of_fakes(tmp_path, events, drain=False)
    assert (await drivers.live())[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]
    assert drivers.leaving("http://elsewhere.svc.cluster.local") == []
    events.clear()
    [left] = drivers.leaving(WEST)
    assert left.endpoint == WEST and events == [("routes", (EAST,))]
    assert (await drivers.live())[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]  # still there
    assert drivers.snapshot()[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]
    members["west"].stable = None  # the worker uninstalled it
    await drivers.live()
    members["west"].stable = helm_release("west", 1)  # placed there again later
    assert (await drivers.live())[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]
    assert drivers.snapshot()[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]


async def test_a_release_a_worker_uninstalls_before_plnt_read_it_is_not_routed_by_a_read_under_way(
        tmp_path: Path) -> None:
    """Over FAKE Helm drivers: a worker's release plnt has not read yet (a canary that failed its smoke
    test within a second of its install) leaves by its release id: a read under way when the worker
    asks, which finds it, does not route to it. (With the endpoint alone the mark only covered the
    release plnt knew there, and such a read put the new one in the routes while helm uninstalled it.)"""
    events: list[tuple[Any, ...]] = []
    drivers, members = pool_of_fakes(tmp_path, events, drain=False)
    await drivers.live()
    unseen = "team-a.rr.1.3.0.dddd"
    members["west"].stable = helm_release("west", 1, release_id=unseen)  # installed by a worker
    members["west"].gate = asyncio.Event()
    reading = asyncio.create_task(drivers.live())
    while ("reading", "west") not in events:
        await asyncio.sleep(0)
    drivers.leaving(WEST, unseen)
    members["west"].gate.set()
    assert (await reading)[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]
    assert drivers.snapshot()[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]
    members["west"].gate = None
    assert (await drivers.live())[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]  # not uninstalled yet
    members["west"].stable = None  # the worker uninstalled it
    await drivers.live()
    members["west"].stable = helm_release("west", 1)  # the pool's release placed there again later: routed
    assert (await drivers.live())[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]


async def test_a_release_a_worker_failed_to_uninstall_is_routed_again_after_the_hold(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Over FAKE Helm drivers: a release still there LEAVING_HOLD_S after a worker said it uninstalls it
    (its uninstall failed) serves again, with a warning, rather than staying unrouted for good."""
    import plnt.reconciler.drivers.driver_set as driver_set

    events: list[tuple[Any, ...]] = []
    drivers, _ = pool_of_fakes(tmp_path, events, drain=False)
    await drivers.live()
    drivers.leaving(WEST)
    assert (await drivers.live())[KEY].stable.endpoints == (EAST,)  # type: ignore[union-attr]
    monkeypatch.setattr(driver_set, "LEAVING_HOLD_S", 0.0)
    assert (await drivers.live())[KEY].stable.endpoints == (EAST, WEST)  # type: ignore[union-attr]
    assert "release-still-there" in caplog.text
