"""The live comparison gate's verdict (pure: reconciler/gates/compare.judge_compare) and the ledger it
reads (core/traffic.py), as tables."""

from __future__ import annotations

import asyncio

import pytest
from plnt.core.specs.models import CompareGate
from plnt.core.traffic import Served, TrafficLedger
from plnt.reconciler.gates.compare import compare_gate, judge_compare, p95_ms


def served(ms: list[float], errors: int = 0) -> Served:
    return Served([m / 1000 for m in ms], errors)


GATE = CompareGate.model_validate({"minRequests": 20, "p95Ratio": 1.2, "p95SlackMs": 10, "errorRatePoints": 1})
FAST = [10.0] * 19 + [20.0] * 1  # p95 10 ms (nearest rank: the 19th of 20)


@pytest.mark.parametrize(("canary", "stable", "passed", "why"), [
    (served(FAST), served(FAST), True,
     "p95 10.0 ms vs stable 10.0 ms (allowed 22.0), errors 0.0% vs stable 0.0% (over 20 canary / 20 stable requests)"),
    (served([21.0] * 20), served(FAST), True, "p95 21.0 ms vs stable 10.0 ms (allowed 22.0)"),
    (served([600.0] * 20), served(FAST), False,
     "p95 600.0 ms over 1.2 x stable 10.0 ms + 10 ms = 22.0 ms (over 20 canary / 20 stable requests)"),
    (served(FAST, errors=2), served(FAST), False, "error rate 10.0% over stable 0.0% + 1 points"),
    (served(FAST, errors=2), served(FAST, errors=2), True, "errors 10.0% vs stable 10.0%"),
    (served(FAST[:5]), served(FAST), False,
     "not enough traffic to compare within 3s: canary 5, stable 20 requests (minRequests 20 each)"),
])
def test_judge(canary: Served, stable: Served, passed: bool, why: str) -> None:
    verdict = judge_compare(GATE, canary, stable, waited_s=3.0)
    assert verdict[0] is passed and why in verdict[1], verdict


def test_only_the_rules_given_hold() -> None:
    gate = CompareGate.model_validate({"minRequests": 1, "p95Ratio": None, "errorRatePoints": None})
    assert judge_compare(gate, served([900.0], errors=1), served([1.0]), 0) == (
        True, " (over 1 canary / 1 stable requests)")


def test_p95_is_the_nearest_rank() -> None:
    assert p95_ms([]) == 0.0
    assert p95_ms([0.001 * i for i in range(1, 101)]) == pytest.approx(95.0)


def test_the_ledger_keeps_each_release_apart_and_reads_since_a_time() -> None:
    ledger = TrafficLedger(per_release=3, releases=2)
    for at, code in ((1.0, 200), (2.0, 500), (3.0, 200), (4.0, 200)):
        ledger.add("default", "rr", "1.3.0", "canary", at, code, at / 100)
    ledger.add("default", "rr", "1.2.0", "stable", 1.0, 404, 0.001)  # a client's 4xx is not an error
    ledger.add("default", "rr", "", "", 1.0, 404, 0.001)  # no release: not kept
    canary = ledger.served("default", "rr", "1.3.0", "canary", since=2.5)
    assert (canary.count, canary.errors) == (2, 0)
    assert ledger.served("default", "rr", "1.3.0", "canary", since=0).count == 3  # the last 3 kept
    assert ledger.served("default", "rr", "1.2.0", "stable", since=0) == Served([0.001], 0)
    ledger.add("default", "other", "1.0.0", "stable", 1.0, 200, 0.001)  # a third release: the least recent goes
    assert ledger.served("default", "rr", "1.3.0", "canary", since=0).count == 0


async def test_it_waits_for_enough_traffic_then_judges() -> None:
    gate = CompareGate.model_validate({"minRequests": 3, "window": "5s"})
    ledger = TrafficLedger()

    async def traffic() -> None:
        for i in range(3):
            await asyncio.sleep(0.2)
            ledger.add("d", "w", "2", "canary", float(i + 1), 200, 0.01)
            ledger.add("d", "w", "1", "stable", float(i + 1), 200, 0.01)

    feeding = asyncio.create_task(traffic())
    versions = {"canary": "2", "stable": "1"}
    passed, why = await compare_gate(gate, lambda track: ledger.served("d", "w", versions[track], track, 0))
    await feeding
    assert passed and "over 3 canary / 3 stable requests" in why, why
