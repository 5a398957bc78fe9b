"""The live comparison gate: the canary's real traffic against the stable release's, over the same
time (since the canary's step began), from the gateway's ledger (core/traffic.py).

Waits until each release has served `minRequests` (at most `window`), then holds the canary's p95 to
`p95Ratio` x the stable's p95 + `p95SlackMs`, and its 5xx rate to the stable's + `errorRatePoints`.
Too little traffic within the window fails the gate: a verdict on three requests is noise either way.
`judge_compare` is pure (table-tested); `compare_gate` waits and reads."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable

from plnt.core.specs.models import CompareGate
from plnt.core.traffic import Served

POLL_S = 0.5


def p95_ms(latencies_s: list[float]) -> float:
    """Nearest-rank p95, in ms (0 for none)."""
    if not latencies_s:
        return 0.0
    ordered = sorted(latencies_s)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000


def judge_compare(gate: CompareGate, canary: Served, stable: Served, waited_s: float) -> tuple[bool, str]:
    """(passed, why) for what each release served."""
    counts = f"over {canary.count} canary / {stable.count} stable requests"
    if canary.count < gate.min_requests or stable.count < gate.min_requests:
        return False, (f"not enough traffic to compare within {waited_s:.0f}s: canary {canary.count}, stable "
                       f"{stable.count} requests (minRequests {gate.min_requests} each)")
    problems, said = [], []
    if gate.p95_ratio is not None:
        mine, theirs = p95_ms(canary.latencies_s), p95_ms(stable.latencies_s)
        allowed = gate.p95_ratio * theirs + gate.p95_slack_ms
        said.append(f"p95 {mine:.1f} ms vs stable {theirs:.1f} ms (allowed {allowed:.1f})")
        if mine > allowed:
            problems.append(f"p95 {mine:.1f} ms over {gate.p95_ratio:g} x stable {theirs:.1f} ms + "
                            f"{gate.p95_slack_ms:g} ms = {allowed:.1f} ms")
    if gate.error_rate_points is not None:
        mine_rate, their_rate = 100 * canary.errors / canary.count, 100 * stable.errors / stable.count
        said.append(f"errors {mine_rate:.1f}% vs stable {their_rate:.1f}%")
        if mine_rate > their_rate + gate.error_rate_points + 1e-9:
            problems.append(f"error rate {mine_rate:.1f}% over stable {their_rate:.1f}% + "
                            f"{gate.error_rate_points:g} points")
    if problems:
        return False, f"{'; '.join(problems)} ({counts})"
    return True, f"{', '.join(said)} ({counts})"


async def compare_gate(gate: CompareGate, served: Callable[[str], Served]) -> tuple[bool, str]:
    """Waits for enough traffic (at most the gate's window), then judges. `served(track)` reads the
    ledger for the canary's or the stable release's track."""
    started = time.monotonic()
    deadline = started + gate.window_s
    while True:
        canary, stable = served("canary"), served("stable")
        if (canary.count >= gate.min_requests and stable.count >= gate.min_requests) or time.monotonic() >= deadline:
            return judge_compare(gate, canary, stable, time.monotonic() - started)
        await asyncio.sleep(POLL_S)
