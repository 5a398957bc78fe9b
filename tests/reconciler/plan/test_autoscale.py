"""The autoscaling decision (reconciler/plan/autoscale.py), as a table: replicas, their loads, the
policy and what the last passes remembered, in; desired replicas and the memory for the next pass, out."""

from __future__ import annotations

import pytest
import yaml
from plnt.core.specs.models import WorkflowRun
from plnt.reconciler.plan.autoscale import ScaleDecision, ScaleMemory, ScalePolicy, decide, replicas_to_stop

P = ScalePolicy(target_in_flight=4, min=1, max=3, scale_down_after_s=60)
ZERO = ScalePolicy(target_in_flight=4, min=0, max=3, scale_down_after_s=60)
TWO = ScalePolicy(target_in_flight=2, min=2, max=5, scale_down_after_s=10)
FRESH = ScaleMemory()
M = ScaleMemory  # (last_change_at, low_since)

# name, current, loads, policy, memory, now -> desired, memory after
TABLE = [
    ("idle at the floor holds", 1, [0], P, FRESH, 100, 1, M(None, None)),
    ("at the target holds", 1, [4], P, FRESH, 100, 1, M(None, None)),
    ("one over the target adds one", 1, [5], P, FRESH, 100, 2, M(100, None)),
    ("a step of 8 goes to 2 at once", 1, [8], P, FRESH, 100, 2, M(100, None)),
    ("a step of 12 goes to 3 at once", 1, [12], P, FRESH, 100, 3, M(100, None)),
    ("bounded by max", 1, [40], P, FRESH, 100, 3, M(100, None)),
    ("at max under more load holds", 3, [20, 20, 20], P, M(50, None), 100, 3, M(50, None)),
    ("the sum over replicas counts", 2, [5, 4], P, FRESH, 100, 3, M(100, None)),
    ("load low starts the window", 3, [1, 0, 0], P, M(10, None), 100, 3, M(10, 100)),
    ("low within the window holds", 3, [1, 0, 0], P, M(10, 100), 150, 3, M(10, 100)),
    ("low for the window: one step down", 3, [1, 0, 0], P, M(10, 100), 160, 2, M(160, None)),
    ("next step waits a window from the last change", 2, [0, 0], P, M(160, 161), 200, 2, M(160, 161)),
    ("and then steps again", 2, [0, 0], P, M(160, 161), 221, 1, M(221, None)),
    ("low right after a scale up waits from the change", 3, [0, 0, 0], P, M(90, 60), 130, 3, M(90, 60)),
    ("load back up ends the low window", 3, [4, 4, 4], P, M(10, 100), 150, 3, M(10, None)),
    ("a load that still needs current-1+ holds (no flapping)", 3, [3, 3, 3], P, M(10, 100), 500, 3, M(10, None)),
    ("8 on 3 needs 2: down after the window", 3, [3, 3, 2], P, M(10, 100), 160, 2, M(160, None)),
    ("an unknown load blocks a scale down", 3, [0, None, 0], P, M(10, 100), 500, 3, M(10, None)),
    ("an unknown load does not block a scale up", 2, [9, None], P, FRESH, 100, 3, M(100, None)),
    ("min 0 never goes below 1", 1, [0], ZERO, M(0, 0), 1000, 1, M(0, None)),
    ("min 0 parked: nothing to do", 0, [], ZERO, FRESH, 100, 0, M(None, None)),
    ("below the floor (a replica gone): back to it", 1, [0], TWO, FRESH, 100, 2, M(100, None)),
    ("above max (max lowered): down to it at once", 5, [0] * 5, P, FRESH, 100, 3, M(100, None)),
    ("min 2 never steps below 2", 2, [0, 0], TWO, M(0, 0), 1000, 2, M(0, None)),
    ("fractional target: ceil", 2, [3, 3], ScalePolicy(2.5, 1, 4, 5), FRESH, 1, 3, M(1, None)),
]


@pytest.mark.parametrize(("current", "loads", "policy", "memory", "now", "desired", "after"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decide(current: int, loads: list[int | None], policy: ScalePolicy, memory: ScaleMemory, now: float,
                desired: int, after: ScaleMemory) -> None:
    decision = decide(current, loads, policy, memory, now)
    assert (decision.desired, decision.memory) == (desired, after), decision.reason
    assert decision.reason


def test_a_load_step_up_and_back_down_follows_the_load_without_flapping() -> None:
    """Concurrency 1 -> 8 -> 1 at target 2, window 5 s, one pass a second: up at once, down one step per window."""
    policy = ScalePolicy(target_in_flight=2, min=1, max=4, scale_down_after_s=5)
    memory, current, seen = FRESH, 1, []
    for second in range(40):
        total = 8 if 5 <= second < 15 else 1
        loads = [total // current + (1 if i < total % current else 0) for i in range(current)]
        decision: ScaleDecision = decide(current, loads, policy, memory, float(second))
        memory, current = decision.memory, decision.desired
        seen.append(current)
    assert seen[:5] == [1] * 5 and seen[5] == 4  # up in one pass
    assert set(seen[5:15]) == {4}
    changes = [i for i in range(1, 40) if seen[i] != seen[i - 1]]
    assert [seen[i] for i in changes] == [4, 3, 2, 1]  # then down, one replica at a time
    assert all(b - a >= 5 for a, b in zip(changes[1:], changes[2:], strict=False))  # a window between steps
    assert seen[-1] == 1


def test_the_policy_comes_from_the_spec_and_only_for_in_flight_targets() -> None:
    text = ("apiVersion: plnt.work/v1\nkind: WorkflowRun\nmetadata: {name: a}\nspec:\n"
            "  workflow: {ref: a@1.0.0, registry: 'file:registry'}\n  backend: {cluster: local}\n"
            "  replicas: {min: 1, max: 3}\n")
    plain = WorkflowRun.model_validate(yaml.safe_load(text))
    scaled = WorkflowRun.model_validate(yaml.safe_load(text + "  autoscaling: {targetInFlight: 4, scaleDownAfterSeconds: 9}\n"))
    rate = WorkflowRun.model_validate(yaml.safe_load(text + "  autoscaling: {targetInvocationsPerSecond: 4}\n"))
    assert ScalePolicy.of(plain) is None and ScalePolicy.of(rate) is None
    assert ScalePolicy.of(scaled) == ScalePolicy(target_in_flight=4, min=1, max=3, scale_down_after_s=9)


@pytest.mark.parametrize(("loads", "keep", "stopped"), [
    ([0, 0, 0], 3, []),                 # nothing to stop
    ([0, 0, 0], 1, [1, 2]),             # all idle: the newest go
    ([0, 0, 0], 2, [2]),
    ([0, 0, 5], 2, [1]),                # the busy last replica stays, the idle one goes
    ([0, 4, 1, 0], 2, [2, 3]),          # the two idlest
    ([0, None, 0], 2, [2]),             # an unread load counts as the busiest (fail closed)
    ([0, None, None], 2, [2]),          # both unknown: the newest
    ([9, 0, 0], 2, [2]),                # the first is never stopped, however busy
    ([9, 3], 1, [1]),                   # not even when it is the busiest of two
    ([0, 0], 0, [1]),                   # at least one runs
    ([], 1, []),
])
def test_replicas_to_stop(loads: list[int | None], keep: int, stopped: list[int]) -> None:
    assert replicas_to_stop(loads, keep) == stopped
