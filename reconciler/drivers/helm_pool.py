"""A pool over Kubernetes backends: one Helm release per placed backend.

A WorkflowRun or ModelDeployment whose `backend` names a pool (refs or a selector) of type:
kubernetes PlntBackends runs, on each backend its placement (reconciler/plan/placement.py) puts
replicas on, its own Helm release (the HelmDriver of that backend: its cluster, context, namespace)
with that backend's count of pods. The placement travels in each release's values (`placement`), so
the clusters stay the record: a promotion, a re-placement or a restarted plnt reads it back.

- install (the saga's canary): the canary release on the first placed backend, one pod.
- promote: the stable release on each placed backend with its count (installed or upgraded, each
  ready and serving), then the canary uninstalled; a backend that held the old stable but is no
  longer placed leaves the routes first, and only then is its release uninstalled.
- place (the plan's re-placement, `place_replicas`): a helm upgrade per backend with its new count
  (an install where it is new), then the routes leave the backends placed at 0, then those are
  uninstalled.
- a release leaving (the promoted canary, a backend no longer placed, a rolled back canary, a
  removed run) is drained before helm uninstalls it: `drain(release)` returns once every gateway process serves routes without its
  Service and has no request left on it (as the local driver drains a runner it stops). Without
  it, requests the gateways had sent it, or sent it still on routes a moment old, were cut.
- the route: `merged` makes the releases of every backend one Release (the first placed backend's,
  with `more_replicas` the other backends' Services), so the gateway lists one endpoint per backend.

`note(backend, namespace, name, change)` is how the DriverSet keeps its known live state (and so the
gateway's routes) in step, in the order above.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from plnt.reconciler.drivers.helm import HelmDriver
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.errors import DriverError
from plnt.reconciler.state import LiveWorkflow, Release, ReplicaProcess, Track

log = logging.getLogger(__name__)

Note = Callable[[str, str, str, dict[str, Release | None]], None]  # (backend, namespace, name, change)
Drain = Callable[[Release], Awaitable[object]]  # returns once no gateway routes to (or awaits) the release


class HelmPool:
    def __init__(self, driver_of: Callable[[str], HelmDriver], note: Note, drain: Drain | None = None) -> None:
        self._driver_of = driver_of
        self._note = note
        self._drain = drain

    async def install(self, request: InstallRequest) -> Release:
        if not request.placement:
            raise DriverError(f"{request.namespace}/{request.name}: a pool's install needs its placement")
        if request.track != "canary":
            raise DriverError(f"{request.namespace}/{request.name}: a pool's stable releases are made by promote")
        first = next(iter(request.placement))
        release = await self._driver_of(first).install(request)
        self._note(first, request.namespace, request.name, {"canary": release})
        return release

    async def promote(self, namespace: str, name: str, members: Iterable[str]) -> Release:
        members = list(members)
        found = await self._find(namespace, name, "canary", members)
        if found is None:
            stables = await self._stables(namespace, name, members)
            if stables:  # promoted already: a retried promote finds its own work
                return merged_stable(stables)
            raise DriverError(f"{namespace}/{name}: no canary to promote on {', '.join(members)}")
        canary_backend, values = found
        placement = _placement_of(values, f"{namespace}/{name} canary on {canary_backend}")
        leaving = await self._stables(namespace, name, [b for b in members if b not in placement])
        placed = await self._place_each(values, placement)
        self._note(canary_backend, namespace, name, {"canary": None})
        await self._drained(self._driver_of(canary_backend).release_of(namespace, name, "canary", values))
        await self._driver_of(canary_backend).remove(namespace, name, "canary")
        await self._retire(namespace, name, {b: leaving[b][0] if b in leaving else None
                                             for b in members if b not in placement})
        return merged_stable(placed)

    async def place(self, namespace: str, name: str, placement: dict[str, int], members: Iterable[str]) -> Release:
        members = list(members)
        wanted = {backend: count for backend, count in placement.items() if count > 0}
        if not wanted:
            raise DriverError(f"{namespace}/{name}: a placement runs at least one replica: {placement}")
        stables = await self._stables(namespace, name, [*members, *(b for b in wanted if b not in members)])
        if not stables:
            raise DriverError(f"{namespace}/{name}: no stable release to place as {placement}")
        values = stables[next(iter(stables))][1]  # (the same release's values on each backend)
        placed = await self._place_each(values, wanted)
        await self._retire(namespace, name, {b: release for b, (release, _) in stables.items() if b not in wanted})
        release = merged_stable(placed)
        log.info("release-placed release=%s placement=%s (was %s)", release.release_id,
                 ",".join(f"{b}:{n}" for b, n in wanted.items()),
                 ",".join(f"{b}:{r.replicas}" for b, (r, _) in stables.items()))
        return release

    async def set_traffic(self, namespace: str, name: str, percent: int, canary_header: tuple[str, str] | None,
                          members: Iterable[str]) -> Release:
        members = list(members)
        found = await self._find(namespace, name, "canary", members)
        if found is None:
            raise DriverError(f"{namespace}/{name}: no deployed canary to give {percent}% of the traffic")
        release = await self._driver_of(found[0]).set_traffic(namespace, name, percent, canary_header=canary_header)
        self._note(found[0], namespace, name, {"canary": release})
        return release

    async def remove(self, namespace: str, name: str, track: Track, members: Iterable[str]) -> None:
        """One track's release on every member (a rollback's canary, a removed run): out of the routes
        everywhere first, then each drained and uninstalled."""
        leaving: dict[str, Release | None] = {}
        for backend in members:
            driver = self._driver_of(backend)
            values = await driver.track_values(namespace, name, track)
            leaving[backend] = driver.release_of(namespace, name, track, values) if values is not None else None
        await self._retire(namespace, name, leaving, track)

    # --- internals ---------------------------------------------------------------------------

    async def _place_each(self, values: dict[str, Any], placement: dict[str, int]) -> dict[str, tuple[Release, Any]]:
        """The stable release on each placed backend, in order, each noted (routed) once it serves."""
        placed: dict[str, tuple[Release, Any]] = {}
        for backend in placement:
            release = await self._driver_of(backend).place(values, placement)
            self._note(backend, release.namespace, release.name, {"stable": release})
            placed[backend] = (release, values)
        return placed

    async def _retire(self, namespace: str, name: str, releases: Mapping[str, Release | None],
                      track: Track = "stable") -> None:
        """A track's release on each of these backends (None: not read, e.g. none there, or not a
        pool's): out of the routes first, then drained, then uninstalled."""
        for backend in releases:
            self._note(backend, namespace, name, {track: None})
        for backend, release in releases.items():
            if release is not None:
                await self._drained(release)
            await self._driver_of(backend).remove(namespace, name, track)

    async def _drained(self, release: Release) -> None:
        """Wait until the gateways let go of a release that left the routes (at most the drain's own
        timeout: a release uninstalled then still finishes, on SIGTERM, what its pods received)."""
        if self._drain is not None:
            await self._drain(release)

    async def _find(self, namespace: str, name: str, track: Track,
                    members: list[str]) -> tuple[str, dict[str, Any]] | None:
        for backend in members:
            values = await self._driver_of(backend).track_values(namespace, name, track)
            if values is not None:
                return backend, values
        return None

    async def _stables(self, namespace: str, name: str, members: list[str]) -> dict[str, tuple[Release, Any]]:
        found: dict[str, tuple[Release, Any]] = {}
        for backend in members:
            driver = self._driver_of(backend)
            values = await driver.track_values(namespace, name, "stable")
            if values is not None and values.get("placement"):
                found[backend] = (driver.release_of(namespace, name, "stable", values), values)
        return found


def _placement_of(values: dict[str, Any], what: str) -> dict[str, int]:
    placement = values.get("placement")
    if not isinstance(placement, dict) or not placement:
        raise DriverError(f"{what}: its Helm values carry no placement (not a pool's release)")
    return {str(backend): int(count) for backend, count in placement.items()}


def merged_stable(placed: Mapping[str, tuple[Release, Any]]) -> Release:
    return merged([release for release, _ in placed.values()])


def merged(releases: list[Release]) -> Release:
    """One Release of a pool's releases of one track, one per backend: the first one's, with each other
    backend's Service as a further endpoint (`more_replicas`, naming its backend); `placement` is the
    pods each backend runs and `replicas` their sum. Releases of another release id than the one
    running the most pods (a promotion half done) are left out: the routes send to one version."""
    by_id: dict[str, list[Release]] = {}
    for release in releases:
        by_id.setdefault(release.release_id, []).append(release)
    chosen = max(by_id.values(), key=lambda group: sum(r.replicas for r in group))
    first, *rest = chosen
    placement = {r.backend or "": r.replicas for r in chosen}
    if first.track == "canary":
        return first
    return first.model_copy(update={
        "placement": placement, "replicas": sum(placement.values()),
        "more_replicas": tuple(ReplicaProcess(endpoint=r.endpoint, backend=r.backend) for r in rest)})


def merged_live(views: Iterable[LiveWorkflow]) -> LiveWorkflow | None:
    """One WorkflowRun's (or ModelDeployment's) live state from each backend's view of it."""
    views = list(views)
    if not views:
        return None
    stables = [v.stable for v in views if v.stable is not None]
    canaries = [v.canary for v in views if v.canary is not None]
    return LiveWorkflow(namespace=views[0].namespace, name=views[0].name,
                        stable=merged(stables) if stables else None, canary=merged(canaries) if canaries else None)
