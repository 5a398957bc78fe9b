"""Launching DeploySagas on Temporal and following them to their end, for the two controllers that
start them: the Reconciler for the tracked branch and the PreviewController for pull requests.
Each has one SagaLauncher, and runs its passes in `poll`.

A saga's workflow id is its WorkflowRun's, so at most one runs per WorkflowRun: a start that finds
one running follows it instead. When a saga ends (whatever its outcome) it is forgotten and the
controller is woken, so the newest spec is acted on at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from plnt.core.specs.models import run_key
from plnt.core.status import Phase, WorkflowRunStatus
from plnt.reconciler.errors import PlntError
from plnt.reconciler.redact import redact
from plnt.reconciler.saga.io import SagaInput, SagaResult, saga_workflow_id
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

log = logging.getLogger(__name__)


class SagaLauncher:
    """The sagas one controller started or adopted, by WorkflowRun key, until each ends."""

    def __init__(self, client: Client, task_queue: str, wake: asyncio.Event, *, what: str = "saga",
                 subject: str = "workflowrun") -> None:
        self._client = client
        self._task_queue = task_queue
        self._wake = wake  # set when a saga ends
        self._what = what        # log event prefix: saga-ended, preview-saga-ended
        self._subject = subject  # log field naming the key
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.fingerprints: dict[str, str | None] = {}  # what each running saga deploys (None: uninstall)
        self._cancelled: set[str] = set()  # cancellation asked for, not yet ended

    def __contains__(self, key: object) -> bool:
        return key in self._tasks

    def __len__(self) -> int:
        return len(self._tasks)

    @property
    def running(self) -> set[str]:
        return set(self._tasks)

    async def start(self, key: str, saga: SagaInput,
                    traced: contextlib.AbstractContextManager[Any] | None = None) -> bool:
        """Start the saga and follow it; True when this call started it, False when a saga of this
        WorkflowRun was still running (it is followed instead, and the newest spec is acted on when
        it ends). `traced` is around the start only (the saga's spans, started by Temporal's
        interceptor, are its children)."""
        try:
            with traced or contextlib.nullcontext():
                handle = await self._client.start_workflow(
                    "DeploySaga", saga, id=saga.workflow_id, task_queue=self._task_queue,
                    id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    result_type=SagaResult,
                )
            started = True
        except WorkflowAlreadyStartedError:
            handle = self._client.get_workflow_handle(saga.workflow_id, result_type=SagaResult)
            started = False
        self.follow(key, handle, saga.fingerprint)
        return started

    async def cancel(self, namespace: str, name: str, *, why: str) -> None:
        """The newest spec wins: cancel the running saga (it removes its canary); when it has
        ended, the next pass starts a saga for the newest spec. Asked once per saga."""
        key = run_key(namespace, name)
        if key in self._cancelled:
            return
        self._cancelled.add(key)
        log.info("%s-superseded %s=%s (%s)", self._what, self._subject, key, why)
        try:
            await self._client.get_workflow_handle(saga_workflow_id(namespace, name)).cancel()
        except RPCError as exc:
            log.warning("%s-cancel-failed %s=%s error=%s", self._what, self._subject, key, exc)
            self._cancelled.discard(key)

    async def adopt(self, statuses: Iterable[WorkflowRunStatus]) -> None:
        """After a restart: follow the sagas of these WorkflowRuns that Temporal is still running,
        instead of starting new ones."""
        for status in statuses:
            handle = self._client.get_workflow_handle(saga_workflow_id(status.namespace, status.name),
                                                      result_type=SagaResult)
            try:
                description = await handle.describe()
            except RPCError:
                continue
            if description.status == WorkflowExecutionStatus.RUNNING:
                log.info("%s-adopted %s=%s saga=%s", self._what, self._subject, status.key, handle.id)
                deploys = None if status.phase is Phase.DELETING else status.attempted_fingerprint
                self.follow(status.key, handle, deploys)

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
                self._tasks.pop(key, None)
                self.fingerprints.pop(key, None)
                self._cancelled.discard(key)
                self._wake.set()

        self.fingerprints[key] = deploys
        self._tasks[key] = asyncio.create_task(wait(), name=f"{self._what}-{key}")

    async def close(self) -> None:
        """Stop following (the sagas go on in Temporal; the next start adopts them)."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        self._tasks.clear()


async def poll(stop: asyncio.Event, wake: asyncio.Event, interval_s: float, one_pass: Callable[[], Awaitable[object]],
               *, what: str, on_skipped: Callable[[PlntError], None] = lambda exc: None) -> None:
    """Run `one_pass` until `stop` is set: again as soon as `wake` is set, else after `interval_s`.
    The loop outlives any one bad pass: a PlntError is logged as `{what}-skipped` (and given to
    `on_skipped`), anything else as `{what}-failed`."""
    while not stop.is_set():
        # Cleared before the pass, so a wake during the pass (a webhook, a saga ending) runs another.
        wake.clear()
        try:
            await one_pass()
        except PlntError as exc:
            log.warning("%s-skipped reason=%s", what, redact(str(exc)))
            on_skipped(exc)
        except Exception:  # noqa: BLE001 - the loop must outlive any one bad pass
            log.exception("%s-failed", what)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(interval_s):
                await _first(wake.wait(), stop.wait())


async def _first(*aws: Any) -> None:
    tasks = [asyncio.ensure_future(aw) for aw in aws]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
