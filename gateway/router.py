"""The gateway's router: holds the current `RouteTable` (plnt.core.routes), picks the backend of
each request (weighted or by session bucket: see plnt.core.routes; among a model's stable replicas
by conversation: see affinity.py), and counts requests in flight per runner so a retired runner is
stopped only once they ended (`drain`)."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from plnt.core.routes import Backend, NoCanary, Route, RouteNotReady, RouteTable, Track, session_bucket
from plnt.gateway import affinity


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
    (ReadError) and is not retried for a runner: it may have started the work (gateway/retry.py).
    """

    def __init__(self, table: RouteTable | None = None, *, rng: random.Random | None = None,
                 cache_affinity: bool = True) -> None:
        self._table = table if table is not None else RouteTable()
        # Injectable so tests (and benchmarks) can make the canary split reproducible.
        self._rng = rng if rng is not None else random.Random()
        # A model's conversations keep their stable replica (affinity.py); off: round robin, as for runners.
        self.cache_affinity = cache_affinity
        self.max_extra = affinity.MAX_EXTRA  # the load bound (affinity.place); a bench may try another
        self.placed: Callable[[Route, bool], None] | None = None  # (route, spilled) of each placement by conversation
        self._turn = itertools.count()  # round robin over stable replicas
        self._in_flight: dict[str, int] = {}  # endpoint -> requests using it right now
        self._drained: dict[str, asyncio.Event] = {}  # endpoint -> set when it reaches 0

    @property
    def table(self) -> RouteTable:
        return self._table

    def replace(self, table: RouteTable) -> None:
        self._table = table

    def choose(
        self, route: Route, rng: random.Random | None = None, *, session: str | None = None,
        conversation: bytes | None = None,
    ) -> tuple[Backend, Track]:
        """Pick the backend for one request: the canary with probability traffic_percent/100,
        or, with a `session` id, by the session's bucket (same session, same version). Among
        several stable replicas: by `conversation` (affinity.conversation_key) when given,
        else the session's bucket, else in turn.

        Raises RouteNotReady when nothing is promoted, even if a canary exists: a canary
        alone must never take all the traffic.
        """
        replicas = route.stable_replicas
        if not replicas:
            raise RouteNotReady(route)
        bucket = session_bucket(route, session) if session else None
        if route.canary is not None and route.traffic_percent > 0:
            if bucket is not None:
                if bucket < route.traffic_percent * 100:
                    return route.canary, "canary"
            elif (rng or self._rng).random() * 100 < route.traffic_percent:  # uniform in [0, 1)
                return route.canary, "canary"
        if len(replicas) == 1:
            return replicas[0], "stable"
        if conversation is not None:
            return self.by_conversation(route, conversation), "stable"
        index = bucket if bucket is not None else next(self._turn)
        return replicas[index % len(replicas)], "stable"

    def by_conversation(self, route: Route, conversation: bytes) -> Backend:
        """The stable replica for a conversation: its own, unless that one has too many requests in
        flight (affinity.place)."""
        replicas = route.stable_replicas
        in_flight = self._in_flight
        placement = affinity.place(conversation, [b.endpoint for b in replicas],
                                   [in_flight.get(b.endpoint, 0) for b in replicas], max_extra=self.max_extra)
        if self.placed is not None:
            self.placed(route, placement.spilled)
        return replicas[placement.index]

    def choose_track(self, route: Route, track: Track, *, conversation: bytes | None = None) -> tuple[Backend, Track]:
        """The backend of a track the request named (X-Plnt-Track, see forced_track): a stable
        replica (by `conversation` when given, else round robin), or the canary under test.
        Raises RouteNotReady (stable: nothing promoted) or NoCanary."""
        if track == "canary":
            if route.canary is None:
                raise NoCanary(route)
            return route.canary, "canary"
        replicas = route.stable_replicas
        if not replicas:
            raise RouteNotReady(route)
        if len(replicas) == 1:
            return replicas[0], "stable"
        if conversation is not None:
            return self.by_conversation(route, conversation), "stable"
        return replicas[next(self._turn) % len(replicas)], "stable"

    def other_replica(self, route: Route, failed: Backend, *, conversation: bytes | None = None) -> Backend | None:
        """A stable replica other than `failed` to retry on (gateway/retry.py says when), or None. A
        conversation's retry goes where its turns go while `failed` is away (the next in its ranking,
        affinity.py), so the replica that reads its history once keeps it; other requests in turn."""
        replicas = [b for b in route.stable_replicas if b.endpoint != failed.endpoint]
        if not replicas:
            return None
        if conversation is not None and len(replicas) > 1:
            in_flight = self._in_flight
            placement = affinity.place(conversation, [b.endpoint for b in replicas],
                                       [in_flight.get(b.endpoint, 0) for b in replicas], max_extra=self.max_extra)
            return replicas[placement.index]
        return replicas[next(self._turn) % len(replicas)]

    @contextmanager
    def in_flight(self, backend: Backend) -> Iterator[None]:
        """Count a request against `backend` for `drain`. Enter it right after `choose`,
        with no await in between, so `drain` can never miss a request."""
        self.enter(backend)
        try:
            yield
        finally:
            self.leave(backend)

    def enter(self, backend: Backend) -> None:
        """`in_flight` without a block (for a stream that outlives the handler's frame);
        every `enter` needs exactly one `leave`."""
        endpoint = backend.endpoint
        self._in_flight[endpoint] = self._in_flight.get(endpoint, 0) + 1

    def leave(self, backend: Backend) -> None:
        endpoint = backend.endpoint
        self._in_flight[endpoint] -= 1
        if self._in_flight[endpoint] == 0:
            del self._in_flight[endpoint]
            event = self._drained.pop(endpoint, None)
            if event is not None:
                event.set()

    def in_flight_count(self, backend: Backend) -> int:
        return self._in_flight.get(backend.endpoint, 0)

    def endpoints_in_flight(self) -> frozenset[str]:
        return frozenset(self._in_flight)

    async def drain(self, backend: Backend, *, timeout_s: float | None = None) -> bool:
        """Wait until no request is using `backend` (call after `replace` took it out).

        Returns False if `timeout_s` elapsed first; stopping the runner gracefully is still
        fine then for requests it already received.
        """
        return await self.drain_endpoint(backend.endpoint, timeout_s=timeout_s)

    async def drain_endpoint(self, endpoint: str, *, timeout_s: float | None = None) -> bool:
        """`drain` by the runner's endpoint (what requests are counted by)."""
        if endpoint not in self._in_flight:
            return True
        event = self._drained.setdefault(endpoint, asyncio.Event())
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            return False
        return True
