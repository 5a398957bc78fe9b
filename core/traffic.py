"""The real traffic each release served, as the gateways answered it: what a live comparison gate
(Gate `compare`, reconciler/gates/compare.py) holds a canary to against its stable release.

One ledger per control plane: `plnt up`'s process (the calls its own gateway answers and those its
gateway worker processes push), or `plnt reconcile`'s (the calls every `plnt gateway` process pushes
to its `--control-url`). gateway/calls.py feeds it (the same tuples as GET /calls: no body, no token)
and answers `GET /internal/traffic` from it; a `plnt worker` reads that (reconciler/gates/compare.py).
Per release and track, the last MAX_PER_RELEASE calls' time, latency, outcome, and for streamed chat
the time to first token, time per output token and completion tokens where known; at most
MAX_RELEASES keys, the least recently served forgotten first."""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

TRAFFIC_PATH = "/internal/traffic"  # a control plane's reading of its ledger (gateway/calls.py CallsHub)
MAX_PER_RELEASE = 20_000
MAX_RELEASES = 256

# (namespace, workflow, version, track)
ReleaseKey = tuple[str, str, str, str]
# (at epoch s, latency s, ok, ttft s or None, tpot s or None, completion tokens or None)
Entry = tuple[float, float, bool, "float | None", "float | None", "int | None"]
# What the gateway measured of one call beyond its latency: (ttft s, tpot s, completion tokens), each None
# where not known (a call that did not stream has no TTFT; a workflow's invoke has no tokens).
Figures = tuple["float | None", "float | None", "int | None"]
NO_FIGURES: Figures = (None, None, None)


def p95_ms(values_s: Iterable[float]) -> float:
    """Nearest-rank p95, in ms (0 for none)."""
    ordered = sorted(values_s)
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)] * 1000


_WIRE = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
Count = Annotated[int, Field(ge=0)]
Figure = Annotated[float, Field(ge=0)]


class TrafficSummary(BaseModel):
    """What one release answered since a time: every figure a compare gate judges. TTFT, TPOT and
    tokens are over the calls that have them (`ttftCount`, ...), so a mix of streamed and whole
    answers compares like with like."""

    model_config = _WIRE

    count: Count = 0
    errors: Count = 0  # answered 5xx (a timeout at the gateway is a 504); a client's 4xx is not the release's fault
    p95_ms: Figure = Field(default=0.0, alias="p95Ms")
    ttft_count: Count = Field(default=0, alias="ttftCount")
    ttft_p95_ms: Figure = Field(default=0.0, alias="ttftP95Ms")
    tpot_count: Count = Field(default=0, alias="tpotCount")
    tpot_p95_ms: Figure = Field(default=0.0, alias="tpotP95Ms")
    tokens_count: Count = Field(default=0, alias="tokensCount")
    tokens_mean: Figure = Field(default=0.0, alias="tokensMean")


def summarize(entries: Iterable[Entry]) -> TrafficSummary:
    kept = list(entries)
    ttfts = [e[3] for e in kept if e[3] is not None]
    tpots = [e[4] for e in kept if e[4] is not None]
    tokens = [e[5] for e in kept if e[5] is not None]
    return TrafficSummary(
        count=len(kept), errors=sum(1 for e in kept if not e[2]), p95_ms=p95_ms(e[1] for e in kept),
        ttft_count=len(ttfts), ttft_p95_ms=p95_ms(ttfts), tpot_count=len(tpots), tpot_p95_ms=p95_ms(tpots),
        tokens_count=len(tokens), tokens_mean=sum(tokens) / len(tokens) if tokens else 0.0)


class TrafficReading(BaseModel):
    """`GET /internal/traffic`: the canary's traffic (its canary and shadow tracks) and the stable
    release's since the canary's step began, and which gateways that rests on."""

    model_config = _WIRE

    canary: TrafficSummary
    stable: TrafficSummary
    gateways: Count = 0  # gateway processes whose calls are counted (heard from since the step began)
    silent: tuple[Annotated[str, Field(max_length=64)], ...] = Field(default=(), max_length=1000, description=(
        "gateway processes heard from since the step began but not lately: their calls since are missing"))


class TrafficLedger:
    def __init__(self, per_release: int = MAX_PER_RELEASE, releases: int = MAX_RELEASES) -> None:
        self._per_release = per_release
        self._releases = releases
        self._by: OrderedDict[ReleaseKey, deque[Entry]] = OrderedDict()

    def add(self, namespace: str, workflow: str, version: str, track: str, at: float, code: int,
            latency_s: float, figures: Figures = NO_FIGURES) -> None:
        if not version:  # a request that reached no release
            return
        key = (namespace, workflow, version, track)
        calls = self._by.get(key)
        if calls is None:
            calls = self._by[key] = deque(maxlen=self._per_release)
            if len(self._by) > self._releases:
                self._by.popitem(last=False)
        else:
            self._by.move_to_end(key)
        calls.append((at, latency_s, code < 500, *figures))

    def served(self, namespace: str, workflow: str, version: str, tracks: tuple[str, ...], since: float) -> TrafficSummary:
        """What `version` answered on `tracks` since epoch `since`."""
        return summarize(entry for track in tracks for entry in self._by.get((namespace, workflow, version, track), ())
                         if entry[0] >= since)

    def reading(self, namespace: str, workflow: str, canary: str, stable: str, since: float) -> TrafficReading:
        """The canary (what it answered to mirrored requests too: canary.shadowPercent) and the stable."""
        return TrafficReading(canary=self.served(namespace, workflow, canary, ("canary", "shadow"), since),
                              stable=self.served(namespace, workflow, stable, ("stable",), since))
