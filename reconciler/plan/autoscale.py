"""Autoscaling, the decision: how many replicas a release should run for the load it carries. Pure
(no I/O, no clock): the loop that polls the replicas and applies it is reconciler/control/autoscaler.py.

The load is each replica's in-flight requests (being served plus waiting, as GET /load reports them:
`inFlight`). With `target` in flight per replica:

- up at once: when the total needs more replicas, ceil(total / target), bounded by replicas.max;
- down one at a time: only once the total has fit in one replica fewer for `scaleDownAfterSeconds`
  since it went low and since the last change, then the window starts again for the next step;
- never below replicas.min, nor below 1: with min 0 the idle timer parks the last replica (scale to
  zero), not the autoscaler, and a parked release (no replica) is left to be woken by a request;
- a replica whose load could not be read blocks a scale down (fail closed), never a scale up.

Which replicas a scale down stops (`replicas_to_stop`): the idlest, never the first.

No flapping: a step down is taken only when the load fits one replica fewer at or below the target,
so the next pass does not want it back, and every change restarts the window.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from plnt.core.specs.models import Deployable


@dataclass(frozen=True)
class ScalePolicy:
    """What a spec asks of the autoscaler: replicas.min/max and autoscaling.targetInFlight and
    scaleDownAfterSeconds."""

    target_in_flight: float
    min: int
    max: int
    scale_down_after_s: float

    @property
    def floor(self) -> int:
        return max(self.min, 1)

    @classmethod
    def of(cls, run: Deployable) -> ScalePolicy | None:
        """The policy of a spec that autoscales on in-flight requests; None for one that does not."""
        scaling, replicas = run.spec.autoscaling, run.spec.replicas
        if scaling is None or scaling.target_in_flight is None or replicas.max is None:
            return None
        return cls(scaling.target_in_flight, replicas.min, replicas.max, scaling.scale_down_after_seconds)


@dataclass(frozen=True)
class ScaleMemory:
    """What the decision remembers between passes (per release): when it last changed the count, and
    since when the load has fit in one replica fewer (None: it does not)."""

    last_change_at: float | None = None
    low_since: float | None = None


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str
    memory: ScaleMemory
    in_flight: int  # the total load the decision saw (known replicas)


def decide(current: int, loads: Sequence[int | None], policy: ScalePolicy, memory: ScaleMemory,
           now: float) -> ScaleDecision:
    """Desired replicas for `current` running ones whose loads (in flight each; None: not read) are
    `loads`, at time `now` (seconds, any monotonic clock)."""
    known = [load for load in loads if load is not None]
    total = sum(known)
    target = policy.target_in_flight

    def hold(reason: str, low_since: float | None = None) -> ScaleDecision:
        return ScaleDecision(current, reason, ScaleMemory(memory.last_change_at, low_since), total)

    def change(desired: int, reason: str) -> ScaleDecision:
        return ScaleDecision(desired, reason, ScaleMemory(now, None), total)

    if current == 0:
        return hold("no replica runs (parked: a request wakes it)" if policy.min == 0 else "no replica runs")
    if current < policy.floor:
        return change(policy.floor, f"{current} replica(s) below the floor of {policy.floor}")
    if current > policy.max:
        return change(policy.max, f"{current} replicas above replicas.max {policy.max}")
    need = min(policy.max, max(policy.floor, math.ceil(total / target)))
    if need > current:
        return change(need, f"{total} in flight over {current} replica(s), target {target:g} each: {need} needed"
                      + (f" (replicas.max {policy.max})" if need == policy.max and total > target * need else ""))
    if need == current:
        return hold(f"{total} in flight fits {current} replica(s) at {target:g} each")
    if len(known) < len(loads):
        return hold(f"the load of {len(loads) - len(known)} replica(s) is unknown: no scale down")
    low_since = memory.low_since if memory.low_since is not None else now
    since = max(low_since, memory.last_change_at if memory.last_change_at is not None else low_since)
    if now - since >= policy.scale_down_after_s:
        return change(current - 1, f"{total} in flight fit {current - 1} replica(s) at {target:g} each for "
                      f"{policy.scale_down_after_s:g}s")
    return hold(f"{total} in flight would fit {need} replica(s): down in "
                f"{policy.scale_down_after_s - (now - since):.0f}s if it stays so", low_since)


def replicas_to_stop(loads: Sequence[int | None], keep: int) -> list[int]:
    """Which of the running replicas (their in-flight loads, in order; None: not read) to stop so that
    `keep` of them run: the idlest first, one whose load is unknown last (it may be serving: fail
    closed), the newest first among equals. Never the first (index 0): it is the release's own port,
    the one its scale to zero parks and wakes. Indices in order."""
    surplus = len(loads) - max(keep, 1)
    if surplus <= 0:
        return []
    idlest = sorted(range(1, len(loads)), key=lambda i: (loads[i] is None, loads[i] or 0, -i))
    return sorted(idlest[:surplus])
