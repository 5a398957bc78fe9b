"""Routes each WorkflowRun and ModelDeployment to the driver of its backend: local processes for
`type: local`, Helm for `type: kubernetes` (one HelmDriver per backend: runner releases of
charts/workflow-runner, model-server releases of charts/model-server).

The reconciler calls `assign(specs)` with every valid spec set before it plans: that is when
WorkflowRuns are mapped to backends and the Helm drivers learn the specs they render. The mapping
and the backends are kept in STATE/backends.json, so a WorkflowRun removed from the repository is
still uninstalled from the backend it ran on after a restart.

Unknown is never "gone": when a cluster's live state cannot be read (unreachable, RBAC), `live()`
answers the last state read from it, updated by plnt's own installs, promotions and removals and
kept in STATE/helm-live.json, so the plan neither restores nor uninstalls anything there on the
strength of a failed read.

Routes: `snapshot()` is the local records plus that last known Helm state, so the gateway routes to
Kubernetes releases (their Services) as to local runners; `on_change` fires whenever it changes.

Pools over Kubernetes backends (helm_pool.py): a WorkflowRun whose pool has type: kubernetes members
gets one Helm release per placed backend. Its members (every backend it was ever a member of, so a
backend that left the pool is still cleaned up) are kept in STATE/backends.json as `pools`; its live
state is each member's view merged into one Release (one endpoint per backend's Service).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping

from plnt.core.specs.loader import SpecSet
from plnt.core.specs.models import Deployable, PlntBackend, RunnerLimits, run_key, spec_fingerprint
from plnt.reconciler.drivers.helm import HelmConfigError, HelmDriver, SpecCache, SpecLookup
from plnt.reconciler.drivers.helm_pool import Drain, HelmPool, merged_live
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.drivers.reported import ReportedRunners
from plnt.reconciler.errors import DriverError, PlntError
from plnt.reconciler.plan.autoscale import ScalePolicy
from plnt.reconciler.state import LiveWorkflow, Release, StateDir, Track, atomic_write_json, read_json

log = logging.getLogger(__name__)

MakeHelmDriver = Callable[[PlntBackend, SpecLookup], HelmDriver]

# How long a release a worker said it uninstalls stays out of the routes while live reads still find
# it (`leaving`): an uninstall that failed leaves the release, which is then routed again.
LEAVING_HOLD_S = 300.0


class DriverSet:
    def __init__(self, local: LocalDriver | ReportedRunners, state: StateDir, make_helm: MakeHelmDriver, *,
                 on_change: Callable[[], None] | None = None, drain: Drain | None = None) -> None:
        """`local`: the runner processes themselves (`plnt up`, `plnt worker`), or on a reconciler of
        split roles what the workers report of theirs (ReportedRunners). `drain`: waits until the
        gateways let go of a pool's Helm release that left the routes, before helm uninstalls it."""
        self.local = local
        self._make_helm = make_helm
        self._on_change = on_change  # called when a Helm backend's known releases change (routes follow)
        self._file = state.root / "backends.json"
        saved = read_json(self._file, default={}) or {}
        self._saved: dict[str, object] = saved
        self._assigned: dict[str, str] = saved.get("workflowRuns", {})  # namespace/name -> backend name
        self._backends = {name: PlntBackend.model_validate(doc) for name, doc in saved.get("backends", {}).items()}
        self._pools: dict[str, list[str]] = saved.get("pools", {})  # namespace/name -> its Kubernetes pool's members
        self._pool = HelmPool(lambda backend: self._helm_driver(self._backends[backend]), self._note_at, drain)
        self._drain = drain
        self._specs = SpecCache()
        self._remembered: SpecSet | None = None  # the spec set assign() last remembered
        self._assigned_by: SpecSet | None = None  # the spec set the assignments are those of (None: changed since)
        self._helm: dict[str, tuple[str, HelmDriver]] = {}  # backend -> (its spec fingerprint, driver)
        # backend -> the live state last read from it (or changed by plnt since), for when it cannot be read
        self._known_file = state.root / "helm-live.json"
        known = read_json(self._known_file, default={}) or {}
        self._known: dict[str, dict[str, LiveWorkflow]] = {
            backend: {key: LiveWorkflow.model_validate(item) for key, item in items.items()}
            for backend, items in known.items()
        }
        self._unknown: dict[str, str] = {}  # backend -> why its live state could not be read (logged once)
        # backend -> key -> when plnt last changed it there (_note_at, a count): a live read begun before
        # may predate the change (a release plnt just took out of the routes and uninstalls), so for
        # that WorkflowRun the noted state stands over the read until a read begun after it.
        self._changes = 0
        self._changed_at: dict[str, dict[str, int]] = {}
        # (backend, key) -> helm operations of plnt's under way there (_changing): a read meanwhile sees
        # a release mid-change as not deployed (pending-install; HelmDriver.live reads a pending-upgrade as its
        # revision before), which is not "gone": the noted state stands.
        self._in_progress: Counter[tuple[str, str]] = Counter()
        # (endpoint, release id) -> (change count, when): Helm releases a worker is uninstalling (the roles
        # apart: `leaving`), kept out of what live reads find until a live() whose reads all began after
        # finds them nowhere.
        self._leaving: dict[tuple[str, str], tuple[int, float]] = {}

    def assign(self, specs: SpecSet) -> None:
        # The reconciler passes the same SpecSet on every poll of one commit: its runs are remembered
        # already (SpecCache only adds; a fingerprint is a JSON dump, 1,000 of them per poll otherwise),
        # and unless remember() moved a WorkflowRun since (a saga of another commit), assigned too.
        if specs is self._remembered and self._assigned_by is specs:
            return
        remember = specs is not self._remembered
        self._remembered = specs
        self._assigned_by = specs
        for run in specs.deployables().values():
            if remember:
                self._specs.remember(run)
            if run.spec.backend.cluster is not None:  # (a pool is placed by the plan, not deployed yet)
                self._assigned[run.key] = run.spec.backend.cluster
        self._backends.update(specs.backends)
        for run in specs.deployables().values():
            self._remember_pool(run, specs.backends)
        self._save()

    def _remember_pool(self, run: Deployable, backends: Mapping[str, PlntBackend]) -> None:
        """A pool of Kubernetes backends: its members now, after those it had (each may hold a release)."""
        if not run.spec.backend.pooled:
            return
        members = run.spec.backend.members(backends)
        if not any(backends[name].spec.type == "kubernetes" for name in members):
            return
        before = self._pools.get(run.key, [])
        self._pools[run.key] = [*members, *(name for name in before if name not in members)]

    def _save(self) -> None:
        record = {
            "workflowRuns": dict(self._assigned),
            "backends": {name: b.model_dump(mode="json", by_alias=True) for name, b in self._backends.items()},
            **({"pools": {key: list(members) for key, members in self._pools.items()}} if self._pools else {}),
        }
        if record != self._saved:  # every poll assigns; write only what changed
            atomic_write_json(self._file, record)
            self._saved = record

    def remember(self, run: Deployable, backend: PlntBackend, backends: Iterable[PlntBackend] = ()) -> None:
        """One WorkflowRun or ModelDeployment and its backend (a pool's first member), as a saga's
        commit gives them, with the commit's `backends` (a pool's members are among them): how a
        worker, which never sees the reconciler's spec sets, knows where each release goes (and where
        to remove it from)."""
        self._specs.remember(run)
        pooled = run.spec.backend.pooled
        if pooled:
            by_name = {b.metadata.name: b for b in backends}
            members = [by_name[name] for name in run.spec.backend.members(by_name)]
            pool_before = list(self._pools.get(run.key, []))
            self._remember_pool(run, by_name)
        if self._assigned.get(run.key) == backend.metadata.name and self._backends.get(backend.metadata.name) == backend \
                and (not pooled or (self._pools.get(run.key, []) == pool_before
                                    and all(self._backends.get(b.metadata.name) == b for b in members))):
            return
        self._assigned[run.key] = backend.metadata.name
        self._backends[backend.metadata.name] = backend
        if pooled:
            self._backends.update({b.metadata.name: b for b in members})
        self._assigned_by = None  # the next assign() sets the reconciler's spec set's assignments again
        self._save()

    def _pool_of(self, namespace: str, name: str) -> list[str] | None:
        """The members of a WorkflowRun's pool of Kubernetes backends (None: not such a pool)."""
        return self._pools.get(run_key(namespace, name))

    def driver_for(self, namespace: str, name: str) -> LocalDriver | HelmDriver:
        """The driver of the WorkflowRun's backend (a Kubernetes pool's: its first member's)."""
        key = run_key(namespace, name)
        backend = self._backends.get(self._pools[key][0] if key in self._pools else self._assigned.get(key, ""))
        if backend is None or backend.spec.type == "local":
            return self.local
        return self._helm_driver(backend)

    def runner_limits(self, namespace: str, name: str) -> RunnerLimits:
        """Limits of a local runner of this WorkflowRun: its backend's runnerLimits (the local
        driver's lookup, so limits come from the assigned backend, not from a saga's input)."""
        backend = self._backends.get(self._assigned.get(run_key(namespace, name), ""))
        return backend.spec.runner_limits if backend is not None else RunnerLimits()

    def park_after(self, namespace: str, name: str, fingerprint: str) -> float | None:
        """Idle seconds after which this release's local runner parks: its backend's
        scaleToZeroAfterSeconds when the spec it was made from says `replicas.min: 0`, else None."""
        spec = self._specs(namespace, name, fingerprint)
        backend = self._backends.get(self._assigned.get(run_key(namespace, name), ""))
        if spec is None or backend is None or spec.replicas.min != 0 or backend.spec.type != "local":
            return None
        return backend.spec.scale_to_zero_after_seconds

    def scale_policy(self, namespace: str, name: str) -> ScalePolicy | None:
        """How plnt's autoscaler scales this WorkflowRun's or ModelDeployment's local replicas: its spec's
        (the newest valid commit's) autoscaling on in-flight requests; None when it has none, or runs on
        Kubernetes (the charts' HPA scales it there)."""
        run = self._remembered.deployable(run_key(namespace, name)) if self._remembered is not None else None
        if run is None or self.driver_for(namespace, name) is not self.local:
            return None
        return ScalePolicy.of(run)

    async def wake(self, namespace: str, name: str, release_id: str) -> Release | None:
        """Start a parked local runner again (LocalDriver.wake); None for anything else."""
        if self.driver_for(namespace, name) is not self.local:
            return None
        wake = getattr(self.local, "wake", None)  # ReportedRunners (the reconcile role) cannot
        return await wake(namespace, name, release_id) if wake is not None else None

    # --- the driver interface, dispatched ----------------------------------------------------

    async def install(self, request: InstallRequest) -> Release:
        with self._changing(request.namespace, request.name):
            if request.placement is not None and self._pool_of(request.namespace, request.name) is not None:
                return await self._pool.install(request)
            release = await self.driver_for(request.namespace, request.name).install(request)
            self._note(request.namespace, request.name, {request.track: release})
            return release

    async def promote(self, namespace: str, name: str) -> Release:
        with self._changing(namespace, name):
            if (members := self._pool_of(namespace, name)) is not None:
                return await self._pool.promote(namespace, name, members)
            driver = self.driver_for(namespace, name)
            if isinstance(driver, HelmDriver):
                async def canary_leaving(stable: Release, canary: Release) -> None:
                    self._note(namespace, name, {"stable": stable, "canary": None})  # the routes: stable only
                    await self._drained(canary)

                release = await driver.promote(namespace, name, canary_leaving=canary_leaving)
            else:  # (the local driver drains the runners it stops itself)
                release = await driver.promote(namespace, name)
            self._note(namespace, name, {"stable": release, "canary": None})
            return release

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        with self._changing(namespace, name):
            if (members := self._pool_of(namespace, name)) is not None:
                return await self._pool.set_traffic(namespace, name, percent, canary_header, members)
            release = await self.driver_for(namespace, name).set_traffic(namespace, name, percent,
                                                                         canary_header=canary_header)
            self._note(namespace, name, {"canary": release})
            return release

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        with self._changing(namespace, name):
            if (members := self._pool_of(namespace, name)) is not None:
                await self._pool.remove(namespace, name, track, members)
                return
            driver = self.driver_for(namespace, name)
            if isinstance(driver, HelmDriver) and (leaving := await self._deployed(driver, namespace, name, track)):
                self._note(namespace, name, {track: None})  # out of the routes, let go of, then uninstalled
                await self._drained(leaving)
            await driver.remove(namespace, name, track)
            self._note(namespace, name, {track: None})

    async def _deployed(self, driver: HelmDriver, namespace: str, name: str, track: Track) -> Release | None:
        """The release of `track` on the WorkflowRun's Kubernetes backend: as plnt last knew it, else as
        helm has it (a worker that did not make it, e.g. a rollback's canary another worker installed)."""
        live = self._known.get(self._assigned.get(run_key(namespace, name), ""), {}).get(run_key(namespace, name))
        if (known := getattr(live, track) if live is not None else None) is not None:
            return known
        if self._drain is None:
            return None
        try:
            values = await driver.track_values(namespace, name, track)
        except PlntError as exc:  # (the cluster away: the removal itself waits it out, undrained)
            log.warning("drain-skipped workflowrun=%s/%s track=%s: its release cannot be read: %s",
                        namespace, name, track, exc)
            return None
        return driver.release_of(namespace, name, track, values) if values is not None else None

    def leaving(self, endpoint: str, release_id: str | None = None) -> list[Release]:
        """The Helm releases at `endpoint`, which a worker is about to uninstall (the roles apart: the
        saga's promote or rollback runs there): out of the routes now, and kept out of what live reads
        find until one begun after this no longer finds them (at most LEAVING_HOLD_S). `release_id`, the
        release the worker names, is kept out even when plnt has not read it yet: a canary that failed
        its smoke test before the next pass, which a read under way could still route after its
        uninstall. Empty: plnt knows no release there (nothing routes to it)."""
        found: list[Release] = []
        for backend, items in list(self._known.items()):
            for item in list(items.values()):
                for track in ("stable", "canary"):
                    release: Release | None = getattr(item, track)
                    if release is not None and release.endpoint == endpoint:
                        self._note_at(backend, item.namespace, item.name, {track: None})
                        found.append(release)
        self._changes += 1  # a read begun before this mark is older than it
        now = time.monotonic()
        for leaving_id in {release.release_id for release in found} | ({release_id} if release_id else set()):
            self._leaving[endpoint, leaving_id] = (self._changes, now)
        return found

    async def _drained(self, release: Release) -> None:
        """Wait until the gateways let go of a Helm release that left the routes (see `drain`)."""
        if self._drain is not None:
            await self._drain(release)

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        with self._changing(namespace, name):
            if self._pool_of(namespace, name) is not None:
                raise DriverError(f"{namespace}/{name}: a pool's release is scaled by placing its replicas "
                                  "(place_replicas), not by a count")
            release = await self.driver_for(namespace, name).set_replicas(namespace, name, replicas)
            self._note(namespace, name, {"stable": release})
            return release

    async def place_replicas(self, namespace: str, name: str, placement: dict[str, int]) -> Release:
        """A pool's stable release run as `placement` (replicas per backend): a helm upgrade per
        Kubernetes backend with its count and an uninstall where it went to 0 (helm_pool.py), or the
        local driver's processes moved, started and stopped (with the roles apart, ReportedRunners: the
        worker that runs them applies it). (A pool mixing local and Kubernetes backends is refused at
        the saga's validate step.)"""
        with self._changing(namespace, name):
            if (members := self._pool_of(namespace, name)) is not None:
                return await self._pool.place(namespace, name, placement, members)
            release: Release = await self.local.place_replicas(namespace, name, placement)
            return release

    def knows(self, namespace: str, name: str) -> bool:
        """Whether this DriverSet knows the WorkflowRun's backend (it assigned or remembered it)."""
        return run_key(namespace, name) in self._assigned

    async def remove_anywhere(self, namespace: str, name: str, track: Track, backends: Iterable[PlntBackend]) -> None:
        """Remove one track's release wherever it is: the local runner and each Kubernetes backend
        given. For an uninstall on a worker that never saw the install (a new pod, an empty state
        dir). A Helm release of the same name that belongs to another WorkflowRun is left alone."""
        await self.local.remove(namespace, name, track)
        for backend in backends:
            if backend.spec.type != "kubernetes":
                continue
            try:
                await self._helm_driver(backend).remove(namespace, name, track)
            except HelmConfigError as exc:
                log.info("remove-skipped backend=%s workflowrun=%s/%s: %s", backend.metadata.name, namespace, name, exc)
                continue
            self._backends.setdefault(backend.metadata.name, backend)
            known = self._known.get(backend.metadata.name, {})
            if run_key(namespace, name) in known:
                self._assigned[run_key(namespace, name)] = backend.metadata.name
                self._assigned_by = None
                self._note(namespace, name, {track: None})

    async def live(self) -> dict[str, LiveWorkflow]:
        live = dict(await self.local.live())
        views: dict[str, dict[str, LiveWorkflow]] = {}  # backend -> its releases, as read (or last known)
        reads_began, still_leaving = self._changes, set[tuple[str, str]]()
        for backend in self._kubernetes_backends():
            name = backend.metadata.name
            began = self._changes
            try:
                found = await self._helm_driver(backend).live()
            except PlntError as exc:  # an unreachable cluster must not stop reconciling the others
                known = self._known.get(name, {})
                if self._unknown.get(name) != str(exc):
                    log.warning("live-state-unknown backend=%s releases_assumed=%d error=%s (the last state read "
                                "stands: nothing there is restored or uninstalled until it can be read)",
                                name, len(known), exc)
                self._unknown[name] = str(exc)
                views[name] = known
                continue
            if self._unknown.pop(name, None) is not None:
                log.info("live-state-readable backend=%s releases=%d", name, len(found))
            found = self._newer_notes(name, self._kept_out(name, found, still_leaving), began)
            self._remember(name, found)
            views[name] = found
        for mark, (at, _) in list(self._leaving.items()):  # gone from every read begun after its mark
            if at <= reads_began and mark not in still_leaving:
                del self._leaving[mark]
        return self._with_views(live, views)

    def _with_views(self, live: dict[str, LiveWorkflow], views: Mapping[str, Mapping[str, LiveWorkflow]]
                    ) -> dict[str, LiveWorkflow]:
        """`live` and each Kubernetes backend's releases; a pool's, from each of its members, merged."""
        pooled: dict[str, list[LiveWorkflow]] = {}
        for found in views.values():
            for key, item in found.items():
                if key in self._pools:
                    pooled.setdefault(key, []).append(item)
                else:
                    live[key] = item
        for key, items in pooled.items():
            merged = merged_live(items)
            if merged is not None and not merged.empty:
                live[key] = merged
        return live

    async def live_of(self, namespace: str, name: str) -> LiveWorkflow | None:
        """One WorkflowRun's releases, as `live()` has them. With only local runners in use (the
        embedded default) that is its one record file, not a look at every record (a saga step
        asks twice; with 1,000 WorkflowRuns reading all of them was 3 % of plnt's CPU)."""
        read_one = getattr(self.local, "record_of", None)  # a LocalDriver (ReportedRunners has none)
        if read_one is not None and not self._kubernetes_backends():
            found: LiveWorkflow | None = read_one(namespace, name)
            return found
        return (await self.live()).get(run_key(namespace, name))

    def snapshot(self) -> dict[str, LiveWorkflow]:
        """Every release plnt knows of, without I/O: the local driver's records and the last known
        state of each Kubernetes backend in use (Helm releases' endpoints are their Services). What
        the gateway's route table is built from."""
        result = dict(self.local.snapshot())
        return self._with_views(result, {b.metadata.name: self._known.get(b.metadata.name, {})
                                         for b in self._kubernetes_backends()})

    def any_live_unknown(self) -> bool:
        """Whether live_unknown may give a reason for some WorkflowRun (when not, it gives None for all)."""
        return bool(self._unknown) or getattr(self.local, "unknown_reason", lambda: None)() is not None

    def live_unknown(self, key: str) -> str | None:
        """Why plnt cannot tell what runs for this WorkflowRun, or None: its backend's live state
        could not be read at the last `live()` and no earlier read (STATE/helm-live.json) holds it.
        The reconciler then plans nothing for one it deployed: absent from an unread cluster is not "gone"."""
        backend = self._assigned.get(key, "")
        if self.driver_for(*key.split("/", 1)) is self.local:
            local_unknown = getattr(self.local, "unknown_reason", lambda: None)()
            if local_unknown is not None:
                return f"the local runners' state is not known yet ({local_unknown})"
            return None
        for member in self._pools.get(key, [backend]):
            why = self._unknown.get(member)
            if why is not None and key not in self._known.get(member, {}):
                return f"the live state of backend {member!r} cannot be read ({why})"
        return None

    async def drift(self) -> dict[str, list[Release]]:
        # Helm is its own record: a release removed or changed by hand shows in live() and the
        # plan installs or upgrades it back. Runner processes are tracked by plnt, so only they drift.
        return await self.local.drift()

    async def repair(self, namespace: str, name: str) -> list[Release]:
        return await self.local.repair(namespace, name)

    # --- internals ---------------------------------------------------------------------------

    def _note(self, namespace: str, name: str, change: dict[str, Release | None]) -> None:
        """Keep the last known live state of a Helm backend in step with what plnt itself changed."""
        backend = self._assigned.get(run_key(namespace, name), "")
        if self.driver_for(namespace, name) is self.local:
            return
        self._note_at(backend, namespace, name, change)

    def _note_at(self, backend: str, namespace: str, name: str, change: dict[str, Release | None]) -> None:
        """`_note` on one named Kubernetes backend (a pool's member)."""
        key = run_key(namespace, name)
        self._changes += 1
        self._changed_at.setdefault(backend, {})[key] = self._changes
        known = dict(self._known.get(backend, {}))
        item = (known.get(key) or LiveWorkflow(namespace=namespace, name=name)).model_copy(update=change)
        if item.empty:
            known.pop(key, None)
        else:
            known[key] = item
        self._remember(backend, known)

    @contextlib.contextmanager
    def _changing(self, namespace: str, name: str) -> Iterator[None]:
        """Around one of plnt's changes to a WorkflowRun's releases: a live read of its backends that
        overlaps any part of it keeps plnt's noted state for that WorkflowRun (_newer_notes)."""
        key = run_key(namespace, name)
        backends = self._pools.get(key) or [self._assigned.get(key, "")]
        for backend in backends:
            self._in_progress[backend, key] += 1
        try:
            yield
        finally:
            self._changes += 1
            for backend in backends:
                self._in_progress[backend, key] -= 1
                if not self._in_progress[backend, key]:
                    del self._in_progress[backend, key]
                self._changed_at.setdefault(backend, {})[key] = self._changes

    def _kept_out(self, backend: str, found: dict[str, LiveWorkflow], still_leaving: set[tuple[str, str]]
                  ) -> dict[str, LiveWorkflow]:
        """A read of `backend` less the releases a worker is uninstalling there (`leaving`), each of
        which it adds to `still_leaving`; one still there after LEAVING_HOLD_S is routed again."""
        if not self._leaving:
            return found
        kept: dict[str, LiveWorkflow] = {}
        now = time.monotonic()
        for key, item in found.items():
            for track in ("stable", "canary"):
                release: Release | None = getattr(item, track)
                mark = (release.endpoint, release.release_id) if release is not None else None
                if mark is None or mark not in self._leaving:
                    continue
                if now - self._leaving[mark][1] > LEAVING_HOLD_S:
                    log.warning("release-still-there release=%s backend=%s (a worker took it out of the routes "
                                "%.0fs ago to uninstall it; routed again)", mark[1], backend,
                                now - self._leaving[mark][1])
                    del self._leaving[mark]
                    continue
                still_leaving.add(mark)
                item = item.model_copy(update={track: None})
            if not item.empty:
                kept[key] = item
        return kept

    def _newer_notes(self, backend: str, found: dict[str, LiveWorkflow], began: int) -> dict[str, LiveWorkflow]:
        """A read of `backend` begun at change `began`, with what plnt changed there since, or is
        changing now (its known state), in place of what the read found for those WorkflowRuns."""
        newer = [key for key, at in self._changed_at.get(backend, {}).items() if at > began]
        newer += [key for (where, key) in self._in_progress if where == backend and key not in newer]
        if not newer:
            return found
        known = self._known.get(backend, {})
        found = {key: item for key, item in found.items() if key not in newer}
        found.update({key: known[key] for key in newer if key in known})
        return found

    def _remember(self, backend: str, live: dict[str, LiveWorkflow]) -> None:
        if self._known.get(backend) == live:
            return
        self._known[backend] = dict(live)
        atomic_write_json(self._known_file, {
            name: {key: item.model_dump(mode="json") for key, item in items.items()}
            for name, items in self._known.items()
        })
        if self._on_change is not None:
            self._on_change()

    def _kubernetes_backends(self) -> list[PlntBackend]:
        used = {*self._assigned.values(), *(name for members in self._pools.values() for name in members)}
        return [b for name, b in sorted(self._backends.items()) if b.spec.type == "kubernetes" and name in used]

    def _helm_driver(self, backend: PlntBackend) -> HelmDriver:
        fingerprint = spec_fingerprint(backend.spec)
        known = self._helm.get(backend.metadata.name)
        if known is None or known[0] != fingerprint:  # a changed backend gets a driver for its new settings
            known = (fingerprint, self._make_helm(backend, self._specs))
            self._helm[backend.metadata.name] = known
        return known[1]
