"""The live comparison gate's verdict (pure: reconciler/gates/compare.judge_compare), the ledger it
reads (core/traffic.py) and the hub that fills it from every gateway process (gateway/calls.py), as
tables. The worker's read over HTTP is tested against a real control app in test_compare_traffic_read."""

from __future__ import annotations

import asyncio

import pytest
from plnt.core.specs.models import CompareGate
from plnt.core.traffic import TrafficLedger, TrafficReading, TrafficSummary, p95_ms, summarize
from plnt.gateway import calls as calls_module
from plnt.gateway.calls import CallLog, CallsHub
from plnt.reconciler.gates.compare import compare_gate, in_process, judge_compare


def served(ms: list[float], errors: int = 0, *, ttft: list[float] = (), tpot: list[float] = (),
           tokens: list[int] = ()) -> TrafficSummary:
    """A release's summary from latencies (ms) and, per call where given, TTFT/TPOT (ms) and tokens."""
    entries = [(0.0, m / 1000, i >= errors, ttft[i] / 1000 if i < len(ttft) else None,
                tpot[i] / 1000 if i < len(tpot) else None, tokens[i] if i < len(tokens) else None)
               for i, m in enumerate(ms)]
    return summarize(entries)


def reading(canary: TrafficSummary, stable: TrafficSummary, silent: tuple[str, ...] = ()) -> TrafficReading:
    return TrafficReading(canary=canary, stable=stable, gateways=2, silent=silent)


GATE = CompareGate.model_validate({"minRequests": 20, "p95Ratio": 1.2, "p95SlackMs": 10, "errorRatePoints": 1})
STREAMS = CompareGate.model_validate({"minRequests": 20, "p95Ratio": None, "errorRatePoints": None,
                                      "ttftRatio": 1.5, "ttftSlackMs": 50, "tpotRatio": 1.5, "tpotSlackMs": 5,
                                      "tokensRatio": 1.5})
FAST = [10.0] * 19 + [20.0] * 1  # p95 10 ms (nearest rank: the 19th of 20)
TTFT = [200.0] * 20
TPOT = [30.0] * 20
TOKENS = [12] * 20


@pytest.mark.parametrize(("gate", "canary", "stable", "passed", "why"), [
    (GATE, served(FAST), served(FAST), True,
     "p95 10.0 ms vs stable 10.0 ms (allowed 22.0), errors 0.0% vs stable 0.0% (over 20 canary / 20 stable requests)"),
    (GATE, served([21.0] * 20), served(FAST), True, "p95 21.0 ms vs stable 10.0 ms (allowed 22.0)"),
    (GATE, served([600.0] * 20), served(FAST), False,
     "p95 600.0 ms over 1.2 x stable 10.0 ms + 10 ms (p95SlackMs) = 22.0 ms (over 20 canary / 20 stable requests)"),
    (GATE, served(FAST, errors=2), served(FAST), False, "error rate 10.0% over stable 0.0% + 1 points"),
    (GATE, served(FAST, errors=2), served(FAST, errors=2), True, "errors 10.0% vs stable 10.0%"),
    (GATE, served(FAST[:5]), served(FAST), False,
     "not enough traffic to compare within 3s: requests: canary 5, stable 20 (minRequests 20 each)"),
    # Streamed chat: TTFT and TPOT p95 like latency, tokens within a band around the stable's mean.
    (STREAMS, served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS), True,
     "TTFT p95 200.0 ms vs stable 200.0 ms (allowed 350.0), TPOT p95 30.0 ms vs stable 30.0 ms (allowed 50.0), "
     "mean tokens 12.0 vs stable 12.0 (allowed 8.0 to 18.0)"),
    (STREAMS, served(FAST, ttft=[400.0] * 20, tpot=TPOT, tokens=TOKENS), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS),
     False, "TTFT p95 400.0 ms over 1.5 x stable 200.0 ms + 50 ms (ttftSlackMs) = 350.0 ms (over 20"),
    (STREAMS, served(FAST, ttft=TTFT, tpot=[60.0] * 20, tokens=TOKENS), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS),
     False, "TPOT p95 60.0 ms over 1.5 x stable 30.0 ms + 5 ms (tpotSlackMs) = 50.0 ms"),
    (STREAMS, served(FAST, ttft=TTFT, tpot=TPOT, tokens=[40] * 20), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS),
     False, "mean tokens 40.0 per call over stable 12.0 x 1.5 (tokensRatio) = 18.0"),
    (STREAMS, served(FAST, ttft=TTFT, tpot=TPOT, tokens=[2] * 20), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS),
     False, "mean tokens 2.0 per call under stable 12.0 / 1.5 (tokensRatio) = 8.0"),
    # Only calls that have the figure count, minRequests of them on each side.
    (STREAMS, served(FAST, ttft=TTFT[:4], tpot=TPOT, tokens=TOKENS), served(FAST, ttft=TTFT, tpot=TPOT, tokens=TOKENS),
     False, "not enough traffic to compare within 3s: calls with a TTFT: canary 4, stable 20 (minRequests 20 each)"),
    (STREAMS, served(FAST), served(FAST), False,
     "calls with a TTFT: canary 0, stable 0; calls with a TPOT: canary 0, stable 0; calls with a token count: "
     "canary 0, stable 0"),
])
def test_judge(gate: CompareGate, canary: TrafficSummary, stable: TrafficSummary, passed: bool, why: str) -> None:
    verdict = judge_compare(gate, reading(canary, stable), waited_s=3.0)
    assert verdict[0] is passed and why in verdict[1], verdict


def test_a_silent_gateway_is_named_whatever_the_verdict() -> None:
    passed = judge_compare(GATE, reading(served(FAST), served(FAST), silent=("gw-b-12",)), 3.0)
    assert passed[0] and passed[1].endswith(
        "(over 20 canary / 20 stable requests; not heard from lately, so not counted since: gateway gw-b-12)"), passed
    short = judge_compare(GATE, reading(served([]), served([]), silent=("a", "b")), 3.0)
    assert not short[0] and short[1].endswith("(not heard from lately, so not counted since: gateways a, b)"), short
    nobody = judge_compare(GATE, TrafficReading(canary=served([]), stable=served([])), 3.0)
    assert "no gateway reported calls since the step began" in nobody[1], nobody


def test_only_the_rules_given_hold() -> None:
    gate = CompareGate.model_validate({"minRequests": 1, "p95Ratio": None, "errorRatePoints": None})
    assert judge_compare(gate, reading(served([900.0], errors=1), served([1.0])), 0) == (
        True, " (over 1 canary / 1 stable requests)")


def test_the_gate_fields_are_checked() -> None:
    with pytest.raises(ValueError, match="tokensRatio"):
        CompareGate.model_validate({"tokensRatio": 0.5})
    with pytest.raises(ValueError, match="ttftRatio"):
        CompareGate.model_validate({"ttftRatio": 0})


def test_p95_is_the_nearest_rank() -> None:
    assert p95_ms([]) == 0.0
    assert p95_ms([0.001 * i for i in range(1, 101)]) == pytest.approx(95.0)


def test_the_ledger_keeps_each_release_apart_and_reads_since_a_time() -> None:
    ledger = TrafficLedger(per_release=3, releases=3)
    for at, code in ((1.0, 200), (2.0, 500), (3.0, 200), (4.0, 200)):
        ledger.add("default", "rr", "1.3.0", "canary", at, code, at / 100, (at / 10, None, 10))
    ledger.add("default", "rr", "1.2.0", "stable", 1.0, 404, 0.001)  # a client's 4xx is not an error
    ledger.add("default", "rr", "", "", 1.0, 404, 0.001)  # no release: not kept
    canary = ledger.served("default", "rr", "1.3.0", ("canary",), since=2.5)
    assert (canary.count, canary.errors, canary.ttft_count, canary.tpot_count, canary.tokens_mean) == (2, 0, 2, 0, 10)
    assert canary.ttft_p95_ms == pytest.approx(400.0)
    assert ledger.served("default", "rr", "1.3.0", ("canary",), since=0).count == 3  # the last 3 kept
    assert ledger.served("default", "rr", "1.2.0", ("stable",), since=0) == TrafficSummary(count=1, p95_ms=1.0)
    ledger.add("default", "rr", "1.3.0", "shadow", 5.0, 200, 0.002)  # mirrored requests count for the canary
    assert ledger.reading("default", "rr", "1.3.0", "1.2.0", since=0).canary.count == 4
    ledger.add("default", "other", "1.0.0", "stable", 1.0, 200, 0.001)  # a fourth release: the least recent goes
    assert ledger.served("default", "rr", "1.3.0", ("canary",), since=0).count == 0


def test_the_hub_sums_every_gateway_and_names_the_silent_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    own = CallLog()
    own.ledger = TrafficLedger()
    hub = CallsHub(own)
    own.add("chat", ("d", "m", "2", "canary"), 200, 0.5, None, 0.1, 0.02, 12)
    a, b = CallLog(), CallLog()
    for log, code in ((a, 200), (b, 503)):
        log.add("chat", ("d", "m", "2", "canary"), code, 0.4, None, 0.2, 0.03, 10)
        log.add("chat", ("d", "m", "1", "stable"), 200, 0.3, None)
    assert hub.take("gw-a", [list(c) for c in a.calls]) == 2
    assert hub.take("gw-b", [list(c) for c in b.calls] + [["bogus"], [*list(b.calls[0])[:11], -1]]) == 2
    got = hub.reading("d", "m", "2", "1", since=0)
    assert (got.canary.count, got.canary.errors, got.canary.ttft_count, got.stable.count) == (3, 1, 3, 2)
    assert got.canary.tokens_mean == pytest.approx(32 / 3) and (got.gateways, got.silent) == (3, ())
    assert got.model_dump(by_alias=True)["canary"]["ttftP95Ms"] == pytest.approx(200.0)
    # gw-b stops pushing (cut off): named once SILENT_S passed; gw-a said it stops: not missed.
    hub.take("gw-a", [], last=True)
    monkeypatch.setattr(calls_module, "SILENT_S", -1.0)
    later = hub.reading("d", "m", "2", "1", since=0)
    assert (later.gateways, later.silent, later.canary.count) == (1, ("gw-b",), 3)


def test_a_gateway_of_the_version_before_is_still_counted() -> None:
    own = CallLog()
    own.ledger = TrafficLedger()
    hub = CallsHub(own)
    assert hub.take("old", [[1.0, "invoke", "d", "w", "1", "stable", 200, 0.01, None]]) == 1
    assert hub.reading("d", "w", "2", "1", since=0).stable.count == 1


async def test_it_waits_for_enough_traffic_then_judges() -> None:
    gate = CompareGate.model_validate({"minRequests": 3, "window": "5s"})
    ledger = TrafficLedger()

    async def traffic() -> None:
        for i in range(3):
            await asyncio.sleep(0.2)
            ledger.add("d", "w", "2", "canary", float(i + 1), 200, 0.01)
            ledger.add("d", "w", "1", "stable", float(i + 1), 200, 0.01)

    feeding = asyncio.create_task(traffic())
    passed, why = await compare_gate(gate, in_process(ledger.reading)("d", "w", "2", "1", 0.0))
    await feeding
    assert passed and "over 3 canary / 3 stable requests" in why, why
