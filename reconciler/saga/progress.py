"""Where a running saga reports its progress statuses (Verifying, Deploying, Canary, Deleting).

A saga's outcome (Ready, RolledBack, Failed, or its status removed after an uninstall) is written
by the `record_phase` local activity: durable, recorded in the saga's history, never written twice.
Its progress on the way is reported the way workflow logs are: once, as the step happens, from the
workflow's own code, and not again when Temporal replays the history. A local activity per step
cost two workflow activations, a history marker and an activity dispatch: about a fifth of a saga's
CPU in plnt and in Temporal (`bench/many_workflowruns.py --standin-runners`).

What that gives up: a progress write that had not reached the disk when plnt died is not written
again; the status shows the step before until the saga's next step (or its outcome) writes.

The process that runs DeploySaga workers registers one sink per (Temporal namespace, task queue)
(`plnt up`, or `plnt reconcile` when the roles run apart; the saga tests register theirs). A
saga with no sink in its process drops its progress with a warning: whether a step writes must
not decide which commands the saga sends, or a history recorded on one worker would not replay on
another.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from plnt.reconciler.saga.io import PhaseUpdate

ProgressSink = Callable[[PhaseUpdate], None]

_sinks: dict[tuple[str, str], ProgressSink] = {}
_lock = threading.Lock()


def register(namespace: str, task_queue: str, sink: ProgressSink,
             loop: asyncio.AbstractEventLoop) -> Callable[[], Awaitable[None]]:
    """Sagas on this queue report to `sink`, called on `loop` (workflow code runs in worker threads).

    Returns the cleanup that unregisters it (after the worker's shutdown). Two sinks for one queue in one process are refused: the
    sagas would report to whichever registered last.
    """
    key = (namespace, task_queue)

    def on_loop(update: PhaseUpdate) -> None:
        loop.call_soon_threadsafe(sink, update)

    with _lock:
        if key in _sinks:
            raise ValueError(f"a DeploySaga worker of this process already reports progress for task queue "
                             f"{task_queue!r} in namespace {namespace!r}")
        _sinks[key] = on_loop

    async def unregister() -> None:
        with _lock:
            if _sinks.get(key) is on_loop:
                del _sinks[key]

    return unregister


def report(namespace: str, task_queue: str, update: PhaseUpdate) -> bool:
    """Hand a progress status to the sink of the saga's queue; False when this process has none."""
    with _lock:
        sink = _sinks.get((namespace, task_queue))
    if sink is None:
        return False
    try:
        sink(update)
    except RuntimeError:  # its loop closed: plnt is stopping, and so is this saga's worker
        return False
    return True
