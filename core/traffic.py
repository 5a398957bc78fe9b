"""The real traffic each release served, as the gateway answered it: what a live comparison gate
(Gate `compare`, reconciler/gates/compare.py) holds a canary to against its stable release.

plnt up's process keeps one ledger: the calls its own gateway answers and those its gateway worker
processes push (gateway/calls.py: the same tuples as GET /calls, so no extra hop and nothing of the
body).
Per release and track, the last MAX_PER_RELEASE calls' time, latency and outcome; at most
MAX_RELEASES keys, the least recently served forgotten first."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

MAX_PER_RELEASE = 20_000
MAX_RELEASES = 256

# (namespace, workflow, version, track)
ReleaseKey = tuple[str, str, str, str]


@dataclass(frozen=True)
class Served:
    latencies_s: list[float]
    errors: int  # answered 5xx (a timeout at the gateway is a 504); a client's 4xx is not the release's fault

    @property
    def count(self) -> int:
        return len(self.latencies_s)


class TrafficLedger:
    def __init__(self, per_release: int = MAX_PER_RELEASE, releases: int = MAX_RELEASES) -> None:
        self._per_release = per_release
        self._releases = releases
        self._by: OrderedDict[ReleaseKey, deque[tuple[float, float, bool]]] = OrderedDict()

    def add(self, namespace: str, workflow: str, version: str, track: str, at: float, code: int,
            latency_s: float) -> None:
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
        calls.append((at, latency_s, code < 500))

    def served(self, namespace: str, workflow: str, version: str, track: str, since: float) -> Served:
        """What `version` on `track` answered since epoch `since`."""
        calls = self._by.get((namespace, workflow, version, track)) or ()
        kept = [(latency, ok) for at, latency, ok in calls if at >= since]
        return Served([latency for latency, _ in kept], sum(1 for _, ok in kept if not ok))
