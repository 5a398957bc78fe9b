"""Autoscaling, the loop: every `interval_s` it reads the load of each autoscaled release's replicas
(GET /load on each, bounded in time and size), asks the pure decision (reconciler/plan/autoscale.py)
how many replicas it should run, and applies a change through the driver's replica count.

Runs where plnt drives local runners itself (`plnt up`, the reconciler role with local backends);
Kubernetes releases scale by the charts' HPA on the same signal (docs/kubernetes.md).

Series on the control plane's `GET /metrics`:
- `plnt_replicas{namespace,name,state}`: state = running (replicas that run now) | desired (what
  the last decision asked for), for every autoscaled release;
- `plnt_replicas_in_flight{namespace,name}`: the in-flight requests the last decision saw (all replicas);
- `plnt_autoscale_changes_total{namespace,name,direction}`: direction = up | down.
Each change is logged (`autoscale namespace/name 1 -> 3: reason`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx
from plnt.reconciler.drivers.processes import read_load
from plnt.reconciler.plan.autoscale import ScaleDecision, ScaleMemory, ScalePolicy, decide
from plnt.reconciler.state import LiveWorkflow
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 1.0
DEFAULT_READ_TIMEOUT_S = 0.5


@dataclass(frozen=True)
class ScaleTarget:
    """One autoscaled release as the driver runs it now: its policy and its running replicas' endpoints."""

    namespace: str
    name: str
    release_id: str
    policy: ScalePolicy
    endpoints: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class ScaleView:
    """The autoscaler's last decision on one release, as GET /workflows (`autoscale`) and plnt status show it."""

    running: int
    desired: int
    in_flight: int
    reason: str

    def public(self) -> dict[str, Any]:
        return {"running": self.running, "desired": self.desired, "inFlight": self.in_flight, "reason": self.reason}


def local_targets(live: dict[str, LiveWorkflow],
                  policy_of: Callable[[str, str], ScalePolicy | None]) -> list[ScaleTarget]:
    """The autoscaled releases among local records: each promoted release that runs (not parked, not a
    Kubernetes one: those have no process of plnt's) and whose spec autoscales on in-flight requests."""
    targets = []
    for item in live.values():
        stable = item.stable
        if stable is None or stable.parked or stable.pid is None:
            continue
        policy = policy_of(item.namespace, item.name)
        if policy is not None:
            targets.append(ScaleTarget(item.namespace, item.name, stable.release_id, policy, tuple(stable.endpoints)))
    return targets


@dataclass
class Autoscaler:
    """`targets()`: the autoscaled releases now (read from the driver's records, no I/O);
    `set_count(namespace, name, n)`: the driver's operation that makes a release run n replicas."""

    targets: Callable[[], Iterable[ScaleTarget]]
    set_count: Callable[[str, str, int], Awaitable[object]]
    interval_s: float = DEFAULT_INTERVAL_S
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    _memory: dict[tuple[str, str], ScaleMemory] = field(default_factory=dict)  # (key, release_id) -> memory
    _views: dict[str, ScaleView] = field(default_factory=dict)
    _changes: Counter | None = None

    def register(self, registry: CollectorRegistry) -> None:
        """Export plnt_replicas, plnt_replicas_in_flight and plnt_autoscale_changes_total in `registry`."""
        self._changes = Counter("plnt_autoscale_changes_total", "Replica count changes made by the autoscaler.",
                                ("namespace", "name", "direction"), registry=registry)
        registry.register(_Gauges(self))

    def view(self, key: str) -> ScaleView | None:
        return self._views.get(key)

    async def run(self, stop: asyncio.Event) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=self.read_timeout_s) as http:
            while not stop.is_set():
                try:
                    await self.pass_once(http)
                except Exception:  # noqa: BLE001 - one bad pass must not end autoscaling
                    log.exception("autoscale-pass-failed")
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.interval_s):
                        await stop.wait()

    async def pass_once(self, http: httpx.AsyncClient) -> list[tuple[ScaleTarget, ScaleDecision]]:
        """Read every target's loads at once, decide, and apply the changes; returns the decisions."""
        targets = list(self.targets())
        loads = await asyncio.gather(*(asyncio.gather(*(read_load(http, e) for e in t.endpoints)) for t in targets))
        now = self.clock()
        decisions = []
        seen = set()
        for target, replica_loads in zip(targets, loads, strict=True):
            memory_key = (target.key, target.release_id)  # a new release starts with a fresh memory
            seen.add(memory_key)
            current = len(target.endpoints)
            decision = decide(current, replica_loads, target.policy, self._memory.get(memory_key, ScaleMemory()), now)
            self._memory[memory_key] = decision.memory
            self._views[target.key] = ScaleView(current, decision.desired, decision.in_flight, decision.reason)
            decisions.append((target, decision))
            if decision.desired != current and await self._apply(target, current, decision):
                # set_count returns once they run (or are stopped): what runs now
                self._views[target.key] = ScaleView(decision.desired, decision.desired, decision.in_flight,
                                                    decision.reason)
        for gone in set(self._memory) - seen:
            del self._memory[gone]
        for key in set(self._views) - {key for key, _ in seen}:
            del self._views[key]
        return decisions

    async def _apply(self, target: ScaleTarget, current: int, decision: ScaleDecision) -> bool:
        direction = "up" if decision.desired > current else "down"
        log.info("autoscale %s %d -> %d: %s", target.key, current, decision.desired, decision.reason)
        try:
            await self.set_count(target.namespace, target.name, decision.desired)
        except Exception as exc:  # noqa: BLE001 - the next pass decides again from what runs then
            log.warning("autoscale-failed %s %d -> %d: %s", target.key, current, decision.desired, exc)
            return False
        if self._changes is not None:
            self._changes.labels(target.namespace, target.name, direction).inc()
        return True

class _Gauges:
    """plnt_replicas and plnt_replicas_in_flight, read from the last decisions at scrape time."""

    def __init__(self, autoscaler: Autoscaler) -> None:
        self._autoscaler = autoscaler

    def collect(self) -> Iterable[GaugeMetricFamily]:
        replicas = GaugeMetricFamily("plnt_replicas", "Replicas of an autoscaled release: running now, and desired.",
                                     labels=("namespace", "name", "state"))
        in_flight = GaugeMetricFamily("plnt_replicas_in_flight",
                                      "In-flight requests over an autoscaled release's replicas, as last read.",
                                      labels=("namespace", "name"))
        for key, view in sorted(self._autoscaler._views.items()):
            namespace, name = key.split("/", 1)
            replicas.add_metric((namespace, name, "running"), view.running)
            replicas.add_metric((namespace, name, "desired"), view.desired)
            in_flight.add_metric((namespace, name), view.in_flight)
        yield replicas
        yield in_flight
