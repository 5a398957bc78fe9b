"""record_phase: the saga's status writes, beside the DeploySaga workflow."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from plnt.core.status import RolloutMark
from plnt.reconciler.errors import UntrustedSagaInput
from plnt.reconciler.saga import progress as saga_progress
from plnt.reconciler.saga.activities.base import boundary
from plnt.reconciler.saga.io import PhaseUpdate
from plnt.reconciler.status_store import StatusStore
from temporalio import activity


class PhaseRecorder:
    """The saga's status writes. Runs where the status lives: beside the DeploySaga workflow (in
    `plnt up`, or in `plnt reconcile` when the roles run apart), never on a worker.

    A saga's outcome comes as the `record_phase` local activity, and is on disk when it returns; its
    progress on the way comes from the saga's own code through `saga_progress`, written behind.
    """

    def __init__(self, statuses: StatusStore) -> None:
        self._statuses = statuses

    @activity.defn(name="record_phase")
    @boundary
    async def record_phase(self, update: PhaseUpdate) -> None:
        # Only DeploySaga's own code (running on plnt's worker) may write status: it calls this as a
        # local activity, which nobody else can schedule on plnt's worker.
        if not activity.info().is_local:
            raise UntrustedSagaInput("record_phase runs only as a local activity of plnt's own DeploySaga")
        if update.phase is None:
            self._statuses.remove(update.namespace, update.name)
            return
        await self._statuses.record(update.namespace, update.name, **self._fields(update))

    def report_progress(self, namespace: str, task_queue: str) -> Callable[[], Awaitable[None]]:
        """Sagas of this process on `task_queue` write their progress here; returns the unregister call.
        On the event loop: the writes are made on it."""
        return saga_progress.register(namespace, task_queue, self._progress, asyncio.get_running_loop())

    def _progress(self, update: PhaseUpdate) -> None:
        if update.phase is not None:
            self._statuses.update_nowait(update.namespace, update.name, **self._fields(update))

    @staticmethod
    def _fields(update: PhaseUpdate) -> dict[str, Any]:
        assert update.phase is not None
        fields = dict(update.fields)
        if update.commit is not None:
            fields["observed_commit"] = update.commit
            # The rollout's own record: only this saga writes it (rollout statuses and notes follow it).
            fields["rollout"] = RolloutMark(commit=update.commit, phase=update.phase, message=update.message,
                                            at=time.time())
        if update.saga_id is not None:
            fields["saga_id"] = update.saga_id
        return {**fields, "phase": update.phase, "message": update.message}

