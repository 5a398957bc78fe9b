"""Leader election of the reconciler: with several replicas, exactly one reconciles.

Two implementations of one protocol: a lock file in the state store (one machine: replicas that
share a state directory) and a Kubernetes Lease (reconciler/control/kube.py). A replica that does not hold
the lease waits; it starts reconciling only once it holds it, and stops at once when it loses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from pathlib import Path
from typing import Protocol

log = logging.getLogger(__name__)


class LeaderLease(Protocol):
    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this replica holds the lease (True) or `stop` is set (False)."""
        ...

    async def hold(self, stop: asyncio.Event) -> None:
        """Keep the lease until `stop` is set or it is lost; returns then (a loss is logged)."""
        ...

    async def release(self) -> None:
        """Give the lease up at once, so a waiting replica takes over without waiting for expiry."""
        ...


class FileLease:
    """An exclusive `flock` on a file in the state directory. The kernel drops the lock when the
    process dies, however it dies, so a killed reconciler never blocks the next one."""

    def __init__(self, path: Path, *, identity: str, poll_s: float = 0.5) -> None:
        self.path = path
        self.identity = identity
        self._poll_s = poll_s
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    async def acquire(self, stop: asyncio.Event) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        waiting_logged = False
        while not stop.is_set():
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                if not waiting_logged:
                    log.info("lease-standby lease=%s holder=%s (another reconciler is active; waiting)",
                             self.path, self._holder() or "unknown")
                    waiting_logged = True
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll_s):
                        await stop.wait()
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{self.identity}\n".encode())
            self._fd = fd
            log.info("lease-acquired lease=%s identity=%s", self.path, self.identity)
            return True
        return False

    async def hold(self, stop: asyncio.Event) -> None:
        # A flock cannot be taken away from a live process: holding is waiting for stop.
        await stop.wait()

    async def release(self) -> None:
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        log.info("lease-released lease=%s identity=%s", self.path, self.identity)

    def _holder(self) -> str | None:
        try:
            return self.path.read_text(encoding="utf-8").strip() or None
        except OSError:
            return None
