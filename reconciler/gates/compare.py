"""The live comparison gate: the canary's real traffic against the stable release's, over the same
time (since the canary's step began), from the control plane's traffic ledger (core/traffic.py).

Waits until each release has served `minRequests` (at most `window`), then holds the canary's p95 to
`p95Ratio` x the stable's p95 + `p95SlackMs`, and its 5xx rate to the stable's + `errorRatePoints`;
for streamed chat, its TTFT and TPOT p95 the same way (`ttftRatio`, `tpotRatio`) and its mean
completion tokens per call within a band around the stable's (`tokensRatio`), each over the calls
that have the figure (minRequests of them). Too little traffic within the window fails the gate: a
verdict on three requests is noise either way. `judge_compare` is pure (table-tested);
`compare_gate` waits and reads; `ControlTraffic` is how a `plnt worker` reads the reconciler's ledger.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import httpx
from plnt.core.specs.models import CompareGate
from plnt.core.traffic import TRAFFIC_PATH, TrafficReading, TrafficSummary
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from pydantic import ValidationError

POLL_S = 0.5
MAX_READING_BYTES = 64 * 1024  # a reading is a few hundred bytes


def _counts(gate: CompareGate, traffic: TrafficSummary) -> list[tuple[str, int]]:
    """(what, how many) for each sample the gate needs minRequests of."""
    wanted = [("requests", traffic.count)]
    if gate.ttft_ratio is not None:
        wanted.append(("calls with a TTFT", traffic.ttft_count))
    if gate.tpot_ratio is not None:
        wanted.append(("calls with a TPOT", traffic.tpot_count))
    if gate.tokens_ratio is not None:
        wanted.append(("calls with a token count", traffic.tokens_count))
    return wanted


def enough(gate: CompareGate, reading: TrafficReading) -> bool:
    return all(n >= gate.min_requests for side in (reading.canary, reading.stable) for _, n in _counts(gate, side))


def _ratio(figure: str, ratio: float | None, slack_ms: float, slack_name: str, mine: float, theirs: float,
           said: list[str], problems: list[str]) -> None:
    if ratio is None:
        return
    allowed = ratio * theirs + slack_ms
    said.append(f"{figure} {mine:.1f} ms vs stable {theirs:.1f} ms (allowed {allowed:.1f})")
    if mine > allowed:
        problems.append(f"{figure} {mine:.1f} ms over {ratio:g} x stable {theirs:.1f} ms + {slack_ms:g} ms "
                        f"({slack_name}) = {allowed:.1f} ms")


def judge_compare(gate: CompareGate, reading: TrafficReading, waited_s: float) -> tuple[bool, str]:
    """(passed, why) for what each release served."""
    canary, stable = reading.canary, reading.stable
    counts = f"over {canary.count} canary / {stable.count} stable requests"
    if reading.silent:  # their calls since are not in the ledger: said, whatever the verdict
        counts += (f"; not heard from lately, so not counted since: gateway{'s' if len(reading.silent) > 1 else ''} "
                   f"{', '.join(reading.silent)}")
    short = [f"{what}: canary {mine}, stable {theirs}"
             for (what, mine), (_, theirs) in zip(_counts(gate, canary), _counts(gate, stable), strict=True)
             if mine < gate.min_requests or theirs < gate.min_requests]
    if short:
        where = f" ({counts.split('; ', 1)[1]})" if reading.silent else ""
        if not reading.gateways and not canary.count and not stable.count:
            where += " (no gateway reported calls since the step began: each pushes them to its control plane)"
        return False, (f"not enough traffic to compare within {waited_s:.0f}s: {'; '.join(short)} "
                       f"(minRequests {gate.min_requests} each){where}")
    problems: list[str] = []
    said: list[str] = []
    _ratio("p95", gate.p95_ratio, gate.p95_slack_ms, "p95SlackMs", canary.p95_ms, stable.p95_ms, said, problems)
    if gate.error_rate_points is not None:
        mine_rate, their_rate = 100 * canary.errors / canary.count, 100 * stable.errors / stable.count
        said.append(f"errors {mine_rate:.1f}% vs stable {their_rate:.1f}%")
        if mine_rate > their_rate + gate.error_rate_points + 1e-9:
            problems.append(f"error rate {mine_rate:.1f}% over stable {their_rate:.1f}% + "
                            f"{gate.error_rate_points:g} points")
    _ratio("TTFT p95", gate.ttft_ratio, gate.ttft_slack_ms, "ttftSlackMs", canary.ttft_p95_ms, stable.ttft_p95_ms,
           said, problems)
    _ratio("TPOT p95", gate.tpot_ratio, gate.tpot_slack_ms, "tpotSlackMs", canary.tpot_p95_ms, stable.tpot_p95_ms,
           said, problems)
    if gate.tokens_ratio is not None:
        mine, theirs, ratio = canary.tokens_mean, stable.tokens_mean, gate.tokens_ratio
        low, high = theirs / ratio, theirs * ratio
        said.append(f"mean tokens {mine:.1f} vs stable {theirs:.1f} (allowed {low:.1f} to {high:.1f})")
        if not low - 1e-9 <= mine <= high + 1e-9:
            problems.append(f"mean tokens {mine:.1f} per call {'over' if mine > high else 'under'} stable {theirs:.1f} "
                            f"{'x' if mine > high else '/'} {ratio:g} (tokensRatio) = {high if mine > high else low:.1f}")
    if problems:
        return False, f"{'; '.join(problems)} ({counts})"
    return True, f"{', '.join(said)} ({counts})"


Read = Callable[[], Awaitable[TrafficReading]]
# (namespace, name, canary version, stable version, since epoch s) -> how to read their traffic
TrafficReader = Callable[[str, str, str, str, float], Read]


def in_process(reading: Callable[[str, str, str, str, float], TrafficReading]) -> TrafficReader:
    """`plnt up`: the ledger is in this process (gateway/calls.py CallsHub.reading)."""

    def reader(namespace: str, name: str, canary: str, stable: str, since: float) -> Read:
        async def read() -> TrafficReading:
            return reading(namespace, name, canary, stable, since)

        return read

    return reader


async def compare_gate(gate: CompareGate, read: Read) -> tuple[bool, str]:
    """Waits for enough traffic (at most the gate's window), then judges. `read()` is the canary's and
    the stable release's traffic since the step began (the ledger's, where it is kept)."""
    started = time.monotonic()
    deadline = started + gate.window_s
    while True:
        reading = await read()
        if enough(gate, reading) or time.monotonic() >= deadline:
            return judge_compare(gate, reading, time.monotonic() - started)
        await asyncio.sleep(POLL_S)


class ControlTraffic:
    """A `plnt worker`'s read of the reconciler's ledger: `GET {control_url}/internal/traffic` with the
    internal token (the gateways push their calls there, gateway/calls.py)."""

    def __init__(self, control_url: str, token: str, timeout_s: float = 10.0) -> None:
        self.url = f"{control_url.rstrip('/')}{TRAFFIC_PATH}"
        self._headers = {"authorization": f"Bearer {token}"}
        self._timeout_s = timeout_s

    def reader(self, namespace: str, name: str, canary: str, stable: str, since: float) -> Read:
        params = {"namespace": namespace, "name": name, "canary": canary, "stable": stable, "since": repr(since)}

        async def read() -> TrafficReading:
            async with httpx.AsyncClient(trust_env=False, timeout=self._timeout_s) as client:
                try:
                    async with client.stream("GET", self.url, params=params, headers=self._headers) as response:
                        body = bytearray()
                        async for chunk in response.aiter_bytes():
                            body += chunk
                            if len(body) > MAX_READING_BYTES:
                                raise GateUnusable(f"GET {self.url} answered over {MAX_READING_BYTES} bytes: "
                                                   "not a traffic reading")
                except httpx.HTTPError as exc:  # (the token is in a header, never in the message)
                    raise GateUnavailable(f"the control plane's traffic ledger (GET {self.url}) did not answer: "
                                          f"{type(exc).__name__}; asked again") from None
            status = response.status_code
            if status >= 500 or status == 429:  # a standby reconciler, or one stopping: ask again
                raise GateUnavailable(f"the control plane's traffic ledger (GET {self.url}) answered HTTP {status}; "
                                      "asked again")
            if status in (401, 403, 404):
                raise GateUnusable(f"GET {self.url} answered HTTP {status}: the worker's --internal-token-file must "
                                   "hold the reconciler's internal token, and the reconciler must be one that keeps "
                                   "the gateways' traffic (this version of plnt reconcile)")
            try:
                return TrafficReading.model_validate_json(bytes(body)) if status == 200 else _refused(self.url, status)
            except ValidationError as exc:
                raise GateUnusable(f"GET {self.url} answered something that is not a traffic reading: "
                                   f"{exc.errors()[0]['msg']}") from None

        return read


def _refused(url: str, status: int) -> TrafficReading:
    raise GateUnusable(f"GET {url} answered HTTP {status}: the worker's request was refused")
