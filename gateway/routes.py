"""Route table of the gateway: which runner release answers which workflow.

The reconciler builds a new `RouteTable` whenever a saga installs a canary, promotes or
rolls back, and hands it to `Router.replace`. Tables are immutable snapshots, so a request
that already looked up its route keeps a consistent view (stable, canary and percentage
from the same moment) even if the table is swapped while it is in flight.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Literal

Track = Literal["stable", "canary"]


class AmbiguousRoute(LookupError):
    """The workflow name exists in several namespaces and none was given."""

    def __init__(self, name: str, namespaces: Iterable[str]) -> None:
        self.name = name
        self.namespaces = sorted(namespaces)
        super().__init__(
            f"workflow {name!r} exists in namespaces {', '.join(self.namespaces)}; "
            "pick one with ?namespace="
        )


class RouteNotReady(LookupError):
    """The workflow is known but has no promoted (stable) release to send traffic to."""

    def __init__(self, route: Route) -> None:
        self.route = route
        super().__init__(f"workflow {route.namespace}/{route.name} has no promoted release yet")


@dataclass(frozen=True)
class Backend:
    """One runner release, reachable over HTTP on loopback."""

    endpoint: str  # "http://127.0.0.1:PORT", no trailing slash
    version: str
    release_id: str


@dataclass(frozen=True)
class Route:
    namespace: str
    name: str
    stable: Backend | None  # None: known workflow, nothing promoted yet -> 503
    canary: Backend | None = None
    canary_percent: int = 0  # share of requests sent to the canary, 0..100

    def __post_init__(self) -> None:
        # Reject bad percentages here, where the reconciler builds the route, rather than
        # silently clamping them on every request.
        if not 0 <= self.canary_percent <= 100:
            raise ValueError(f"canary_percent must be within 0..100, got {self.canary_percent}")


class RouteTable:
    """Immutable snapshot of all routes, indexed by workflow name then namespace."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        by_name: dict[str, dict[str, Route]] = {}
        for route in routes:
            namespaces = by_name.setdefault(route.name, {})
            if route.namespace in namespaces:
                raise ValueError(f"duplicate route {route.namespace}/{route.name}")
            namespaces[route.namespace] = route
        self._by_name = by_name

    def lookup(self, name: str, namespace: str | None = None) -> Route | None:
        """Route for `name` (in `namespace` if given); None if unknown.

        Raises AmbiguousRoute when no namespace is given and the name is not unique, rather
        than guessing: sending a request to the wrong team's workflow is worse than a 409.
        """
        namespaces = self._by_name.get(name)
        if not namespaces:
            return None
        if namespace is not None:
            return namespaces.get(namespace)
        if len(namespaces) > 1:
            raise AmbiguousRoute(name, namespaces)
        return next(iter(namespaces.values()))

    def __iter__(self) -> Iterator[Route]:
        for namespaces in self._by_name.values():
            yield from namespaces.values()

    def __len__(self) -> int:
        return sum(len(namespaces) for namespaces in self._by_name.values())

    def __repr__(self) -> str:
        return f"RouteTable({list(self)!r})"


class Router:
    """Holds the current `RouteTable`; the reconciler swaps it, request handlers read it.

    Everything runs on one asyncio loop and `replace` is a single reference assignment, so
    no lock is needed: a reader sees either the old or the new table, never a mix.

    Retiring a runner (promotion, rollback) without losing requests:
        router.replace(new_table)          # no new request picks the old runner
        await router.drain(old_backend)    # requests that already picked it have finished
        stop the old runner (gracefully)
    Skipping `drain` is *almost* safe: a request that picked the old runner just before
    `replace` may reach it while it shuts down. A refused connect is retried on the new
    table, but a reused keep-alive connection the runner closes under the request fails
    (ReadError) and cannot safely be retried: the runner may have started the work.
    """

    def __init__(self, table: RouteTable | None = None, *, rng: random.Random | None = None) -> None:
        self._table = table if table is not None else RouteTable()
        # Injectable so tests (and benchmarks) can make the canary split reproducible.
        self._rng = rng if rng is not None else random.Random()
        self._in_flight: dict[str, int] = {}  # endpoint -> requests using it right now
        self._drained: dict[str, asyncio.Event] = {}  # endpoint -> set when it reaches 0

    @property
    def table(self) -> RouteTable:
        return self._table

    def replace(self, table: RouteTable) -> None:
        self._table = table

    def choose(self, route: Route, rng: random.Random | None = None) -> tuple[Backend, Track]:
        """Pick the backend for one request: the canary with probability canary_percent/100.

        Raises RouteNotReady when nothing is promoted, even if a canary exists: a canary
        alone must never take all the traffic.
        """
        if route.stable is None:
            raise RouteNotReady(route)
        if route.canary is not None and route.canary_percent > 0:
            draw = (rng or self._rng).random()  # uniform in [0, 1)
            if draw * 100 < route.canary_percent:
                return route.canary, "canary"
        return route.stable, "stable"

    @contextmanager
    def in_flight(self, backend: Backend) -> Iterator[None]:
        """Count a request against `backend` for `drain`. Enter it right after `choose`,
        with no await in between, so `drain` can never miss a request."""
        endpoint = backend.endpoint
        self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1
        try:
            yield
        finally:
            self._in_flight[endpoint] -= 1
            if self._in_flight[endpoint] == 0:
                del self._in_flight[endpoint]
                event = self._drained.pop(endpoint, None)
                if event is not None:
                    event.set()

    def in_flight_count(self, backend: Backend) -> int:
        return self._in_flight.get(backend.endpoint, 0)

    async def drain(self, backend: Backend, *, timeout_s: float | None = None) -> bool:
        """Wait until no request is using `backend` (call after `replace` took it out).

        Returns False if `timeout_s` elapsed first; stopping the runner gracefully is still
        fine then for requests it already received.
        """
        if backend.endpoint not in self._in_flight:
            return True
        event = self._drained.setdefault(backend.endpoint, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
