"""The sagas one controller started or adopted, followed to their end: the reconciler's for the
branch, the PreviewController's for pull requests. When a saga ends (whatever its outcome) it is
forgotten and the controller is woken, so the newest spec is acted on at once."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from plnt.reconciler.saga.io import SagaResult
from temporalio.client import WorkflowHandle

log = logging.getLogger(__name__)


class RunningSagas:
    def __init__(self, wake: asyncio.Event, *, what: str = "saga", subject: str = "workflowrun") -> None:
        self._wake = wake
        self._what = what        # log event prefix: saga-ended, preview-saga-ended
        self._subject = subject  # log field naming the key
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.fingerprints: dict[str, str | None] = {}  # what each running saga deploys (None: uninstall)
        self.cancelled: set[str] = set()  # cancellation asked for, not yet ended

    def follow(self, key: str, handle: WorkflowHandle[Any, SagaResult], deploys: str | None) -> None:
        async def wait() -> None:
            try:
                result = await handle.result()
                log.info("%s-ended %s=%s phase=%s reason=%r", self._what, self._subject, key, result.phase.value,
                         result.reason)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - a saga that failed outright is still over
                log.error("%s-error %s=%s error=%s", self._what, self._subject, key, exc)
            finally:
                self.tasks.pop(key, None)
                self.fingerprints.pop(key, None)
                self.cancelled.discard(key)
                self._wake.set()

        self.fingerprints[key] = deploys
        self.tasks[key] = asyncio.create_task(wait(), name=f"{self._what}-{key}")
