"""Routes each WorkflowRun to the driver of its backend: local runner processes for `type: local`,
Helm for `type: kubernetes` (one HelmDriver per backend).

The reconciler calls `assign(specs)` with every valid spec set before it plans: that is when
WorkflowRuns are mapped to backends and the Helm drivers learn the specs they render. The mapping
and the backends are kept in STATE/backends.json, so a WorkflowRun removed from the repository is
still uninstalled from the backend it ran on after a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from .driver import InstallRequest
from .errors import PlntError
from .helm_driver import HelmDriver, SpecCache, SpecLookup
from .loader import SpecSet
from .local_driver import LocalDriver
from .specs import PlntBackend, RunnerLimits, run_key, spec_fingerprint
from .state import LiveWorkflow, Release, StateDir, Track, atomic_write_json, read_json

log = logging.getLogger(__name__)

MakeHelmDriver = Callable[[PlntBackend, SpecLookup], HelmDriver]


class DriverSet:
    def __init__(self, local: LocalDriver, state: StateDir, make_helm: MakeHelmDriver) -> None:
        self.local = local
        self._make_helm = make_helm
        self._file = state.root / "backends.json"
        saved = read_json(self._file, default={}) or {}
        self._saved: dict[str, object] = saved
        self._assigned: dict[str, str] = saved.get("workflowRuns", {})  # namespace/name -> backend name
        self._backends = {name: PlntBackend.model_validate(doc) for name, doc in saved.get("backends", {}).items()}
        self._specs = SpecCache()
        self._helm: dict[str, tuple[str, HelmDriver]] = {}  # backend -> (its spec fingerprint, driver)

    def assign(self, specs: SpecSet) -> None:
        for run in specs.workflow_runs.values():
            self._specs.remember(run)
            self._assigned[run.key] = run.spec.backend.cluster
        self._backends.update(specs.backends)
        record = {
            "workflowRuns": dict(self._assigned),
            "backends": {name: b.model_dump(mode="json", by_alias=True) for name, b in self._backends.items()},
        }
        if record != self._saved:  # every poll assigns; write only what changed
            atomic_write_json(self._file, record)
            self._saved = record

    def driver_for(self, namespace: str, name: str) -> LocalDriver | HelmDriver:
        backend = self._backends.get(self._assigned.get(run_key(namespace, name), ""))
        if backend is None or backend.spec.type == "local":
            return self.local
        return self._helm_driver(backend)

    def runner_limits(self, namespace: str, name: str) -> RunnerLimits:
        """Limits of a local runner of this WorkflowRun: its backend's runnerLimits (the local
        driver's lookup, so limits come from the assigned backend, not from a saga's input)."""
        backend = self._backends.get(self._assigned.get(run_key(namespace, name), ""))
        return backend.spec.runner_limits if backend is not None else RunnerLimits()

    # --- the driver interface, dispatched ----------------------------------------------------

    async def install(self, request: InstallRequest) -> Release:
        return await self.driver_for(request.namespace, request.name).install(request)

    async def promote(self, namespace: str, name: str) -> Release:
        return await self.driver_for(namespace, name).promote(namespace, name)

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        await self.driver_for(namespace, name).remove(namespace, name, track)

    async def live(self) -> dict[str, LiveWorkflow]:
        live = dict(await self.local.live())
        for backend in self._kubernetes_backends():
            try:
                live.update(await self._helm_driver(backend).live())
            except PlntError as exc:  # an unreachable cluster must not stop reconciling the others
                log.warning("live-state-unavailable backend=%s error=%s", backend.metadata.name, exc)
        return live

    async def drift(self) -> dict[str, list[Release]]:
        # Helm is its own record: a release removed or changed by hand shows in live() and the
        # plan installs or upgrades it back. Runner processes are tracked by plnt, so only they drift.
        return await self.local.drift()

    async def repair(self, namespace: str, name: str) -> list[Release]:
        return await self.local.repair(namespace, name)

    # --- internals ---------------------------------------------------------------------------

    def _kubernetes_backends(self) -> list[PlntBackend]:
        used = set(self._assigned.values())
        return [b for name, b in sorted(self._backends.items()) if b.spec.type == "kubernetes" and name in used]

    def _helm_driver(self, backend: PlntBackend) -> HelmDriver:
        fingerprint = spec_fingerprint(backend.spec)
        known = self._helm.get(backend.metadata.name)
        if known is None or known[0] != fingerprint:  # a changed backend gets a driver for its new settings
            known = (fingerprint, self._make_helm(backend, self._specs))
            self._helm[backend.metadata.name] = known
        return known[1]
