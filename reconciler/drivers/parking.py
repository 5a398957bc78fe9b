"""Scale to zero, the local driver's side. A runner whose release has `park_after_s` exits by itself
after that long without an invocation, and writes first that it parks (runner/idle.py), so plnt
tells it from one that died. Its record is then marked parked (no pid): drift leaves it alone, and
the next request for it wakes it (LocalDriver.wake: the same release started again, on its
recorded port when that is free).
"""

from __future__ import annotations

import logging
from pathlib import Path

from plnt.core.parking import PARKED_FILE, read_parked
from plnt.reconciler.drivers.processes import RunnerProcesses
from plnt.reconciler.state import LiveWorkflow, Release

log = logging.getLogger(__name__)


class ParkedRunners:
    """Which runners parked themselves, read from the file each writes in its own directory."""

    def __init__(self, runners_dir: Path, processes: RunnerProcesses) -> None:
        self._runners_dir = runners_dir  # STATE/runners: each release's cwd
        self._processes = processes

    def parked_itself(self, release: Release, *, alive_too: bool = False) -> bool:
        """Whether this release's runner process wrote that it parks, and is gone (or, with
        `alive_too`, still exiting)."""
        if release.pid is None or (not alive_too and self._processes.running(release)):
            return False
        return read_parked(self._runners_dir / release.release_id) == release.pid

    def clear(self, release: Release) -> None:
        """Before a start: the file is an earlier process's, and this one has not parked."""
        (self._runners_dir / release.release_id / PARKED_FILE).unlink(missing_ok=True)

    async def wait_gone(self, release: Release) -> None:
        """Wait (up to the stop timeout) for a parking runner to exit: it answers a request it
        accepted before closing its listener. Then SIGTERM, and SIGKILL, as any stop."""
        assert release.pid is not None
        await self._processes.wait_exit(release.pid, release.pid_start)
        if self._processes.alive(release.pid, release.pid_start):
            await self._processes.terminate(release.pid, release.pid_start, release.release_id)
        self._processes.reap(release.pid)

    def newly_parked(self, live: LiveWorkflow) -> dict[str, Release]:
        """The releases of one record whose runner parked itself and exited, as they are recorded
        from now on (track -> release): parked, with no process."""
        update: dict[str, Release] = {}
        for track in ("stable", "canary"):
            release: Release | None = getattr(live, track)
            if release is not None and not release.parked and self.parked_itself(release):
                log.info("runner-parked release=%s port=%s: no invocation for %gs; the next request starts "
                         "it again", release.release_id, release.port, release.park_after_s or 0)
                self._processes.reap(release.pid)
                update[track] = release.model_copy(update={"parked": True, "pid": None, "pid_start": None})
        return update
