"""FakeDriver: the declared FAKE of the release driver protocol (plnt.reconciler.drivers.protocol),
for unit tests of what sits above a driver (routes, activities, the loop). Release records live in a
dict; nothing runs, endpoints are `http://fake.invalid/<release id>` unless a test gives one.

It records every call (`calls`), counts route snapshots (`snapshots`), can make snapshots cost time
(`snapshot_cost_s`, as 1,000 records might) and can make the next calls of one method fail
(`fail_next`). tests/test_fake_driver.py keeps it in step with the protocol: a method the protocol
adds or changes fails there, not in some test that happens to call it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from plnt.core.specs.loader import SpecSet
from plnt.reconciler.drivers.protocol import InstallRequest
from plnt.reconciler.errors import PlntError
from plnt.reconciler.state import LiveWorkflow, Release, Track


@dataclass
class Call:
    method: str
    args: tuple[Any, ...]


@dataclass
class FakeDriver:
    records: dict[str, LiveWorkflow] = field(default_factory=dict)  # by "namespace/name"
    endpoint: str | None = None  # every install's endpoint; None: one per release id
    snapshot_cost_s: float = 0.0
    drifted: dict[str, list[Release]] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    snapshots: int = 0
    assigned: SpecSet | None = None
    _failures: dict[str, list[BaseException]] = field(default_factory=dict)

    # --- what a test arranges and reads --------------------------------------------------------

    def fail_next(self, method: str, error: BaseException | None = None) -> None:
        """The next call of `method` raises `error` (a PlntError by default), once."""
        self._failures.setdefault(method, []).append(error or PlntError(f"fake {method} failure"))

    def called(self, method: str) -> list[tuple[Any, ...]]:
        return [call.args for call in self.calls if call.method == method]

    def put(self, release: Release) -> None:
        """Record a release as if installed (and promoted, for track stable)."""
        key = f"{release.namespace}/{release.name}"
        live = self.records.get(key) or LiveWorkflow(namespace=release.namespace, name=release.name)
        self.records[key] = live.model_copy(update={release.track: release})

    def _enter(self, method: str, *args: Any) -> None:
        self.calls.append(Call(method, args))
        pending = self._failures.get(method)
        if pending:
            raise pending.pop(0)

    # --- the protocol ---------------------------------------------------------------------------

    def assign(self, specs: SpecSet) -> None:
        self._enter("assign", specs)
        self.assigned = specs

    async def install(self, request: InstallRequest) -> Release:
        self._enter("install", request)
        release = request.release(self.endpoint or f"http://fake.invalid/{request.release_id}")
        self.put(release)
        return release

    async def promote(self, namespace: str, name: str) -> Release:
        self._enter("promote", namespace, name)
        live = self.records.get(f"{namespace}/{name}")
        if live is None or live.canary is None:
            if live is not None and live.stable is not None:
                return live.stable  # promoted already: idempotent, like the real drivers
            raise PlntError(f"{namespace}/{name}: no canary to promote")
        stable = live.canary.model_copy(update={"track": "stable", "traffic_percent": 0})
        self.records[live.key] = LiveWorkflow(namespace=namespace, name=name, stable=stable)
        return stable

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        self._enter("set_traffic", namespace, name, percent)
        live = self.records.get(f"{namespace}/{name}")
        if live is None or live.canary is None:
            raise PlntError(f"{namespace}/{name}: no canary to give {percent}% of the traffic")
        canary = live.canary.model_copy(update={"traffic_percent": percent, "canary_header": canary_header})
        self.records[live.key] = live.model_copy(update={"canary": canary})
        return canary

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        self._enter("remove", namespace, name, track)
        key = f"{namespace}/{name}"
        live = self.records.get(key)
        if live is None:
            return
        live = live.model_copy(update={track: None})
        if live.empty:
            del self.records[key]
        else:
            self.records[key] = live

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        self._enter("set_replicas", namespace, name, replicas)
        live = self.records.get(f"{namespace}/{name}")
        if live is None or live.stable is None:
            raise PlntError(f"{namespace}/{name}: no stable release to scale")
        stable = live.stable.model_copy(update={"replicas": replicas})
        self.records[live.key] = live.model_copy(update={"stable": stable})
        return stable

    async def live(self) -> dict[str, LiveWorkflow]:
        self._enter("live")
        return dict(self.records)

    async def drift(self) -> dict[str, list[Release]]:
        self._enter("drift")
        return {key: list(releases) for key, releases in self.drifted.items()}

    async def repair(self, namespace: str, name: str) -> list[Release]:
        self._enter("repair", namespace, name)
        return self.drifted.pop(f"{namespace}/{name}", [])

    # --- what plnt's route table reads (DriverSet and the local driver have it too) ------------

    def snapshot(self) -> dict[str, LiveWorkflow]:
        self.snapshots += 1
        if self.snapshot_cost_s:
            time.sleep(self.snapshot_cost_s)
        return dict(self.records)
