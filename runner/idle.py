"""Scale to zero: a runner that has served no invocation for `after_s` seconds parks (exits), and plnt
starts it again, the same release on the same port, when the next request comes (the gateway asks
plnt to wake it: see LocalDriver.wake).

Only invocations count (POST /invoke and /chat): plnt's health checks and /stats keep no runner up.
To park, the runner writes PARKED_FILE ({"pid", "idleSeconds"}) in its working directory (its own
STATE/runners/RELEASE/), so plnt tells a parked runner from one that died, then stops as on SIGTERM:
the listener closes first, and a request accepted before that is still answered.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from plnt.runner.load import LoadMeter


class IdleParker(LoadMeter):
    """ASGI wrapper: a LoadMeter (it counts invocations in flight) that calls `park` once none has run
    for `after_s`.

    One timer at a time, re-armed only when it fires: an invocation costs two counter updates, and an
    idle runner wakes once per `after_s`."""

    def __init__(self, app: Any, after_s: float, park: Callable[[], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not after_s > 0:
            raise ValueError("after_s must be > 0")
        super().__init__(app, clock)
        self.after_s = after_s
        self._park = park
        self.parked = False
        self._timer: asyncio.TimerHandle | None = None

    def _arm(self, delay: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        if self.in_flight:
            self._arm(self.after_s)
            return
        remaining = self.last_activity + self.after_s - self._clock()
        if remaining > 0:
            self._arm(remaining)
            return
        self.parked = True
        self._park()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan" and self._timer is None and not self.parked:
            self.last_activity = self._clock()  # counted from when the runner serves
            self._arm(self.after_s)
        await super().__call__(scope, receive, send)
