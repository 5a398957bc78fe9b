"""Live smoke numbers: while a WorkflowRun is in Canary, the running smoke test's heartbeats (calls
done, p95 and errors so far: `smoke.progress_of`) are read from Temporal and kept in its status as
`smokeProgress`, so `plnt status`, `GET /workflows` and the forge's pending status show them as the
test runs. It reads the saga's pending activity, wherever the worker that runs it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from plnt.core.status import Phase
from plnt.reconciler.saga.io import saga_workflow_id
from plnt.reconciler.status_store import StatusStore
from temporalio.client import Client
from temporalio.service import RPCError

log = logging.getLogger(__name__)

SMOKE_ACTIVITY = "smoke_test"


def progress_from(details: list[Any]) -> dict[str, Any] | None:
    """The newest heartbeat's progress, if it is one (anything else is ignored)."""
    last = details[-1] if details else None
    if isinstance(last, dict) and isinstance(last.get("done"), int) and isinstance(last.get("of"), int):
        return {key: last[key] for key in ("done", "of", "metrics") if key in last}
    return None


async def read_progress(client: Client, namespace: str, name: str) -> dict[str, Any] | None:
    handle = client.get_workflow_handle(saga_workflow_id(namespace, name))
    description = await handle.describe()
    for pending in description.raw_description.pending_activities:
        if pending.activity_type.name == SMOKE_ACTIVITY and pending.heartbeat_details.payloads:
            return progress_from(await client.data_converter.decode(pending.heartbeat_details.payloads))
    return None


async def follow_smoke_progress(client: Client, statuses: StatusStore, stop: asyncio.Event,
                                every_s: float = 1.0) -> None:
    """Until `stop`: copy each Canary's smoke progress into its status; clear it after Canary."""
    while not stop.is_set():
        for status in statuses.all():
            if status.phase is Phase.CANARY:
                try:
                    progress = await read_progress(client, status.namespace, status.name)
                except RPCError as exc:  # the saga just ended, or Temporal is briefly away: next round
                    log.debug("smoke-progress-unread workflowrun=%s error=%s", status.key, exc)
                    continue
                except Exception:  # noqa: BLE001 - live numbers are a nicety: never stop following
                    log.exception("smoke-progress-failed workflowrun=%s", status.key)
                    continue
                if progress is not None and progress != status.smoke_progress:
                    statuses.update_nowait(status.namespace, status.name, smoke_progress=progress)
            elif status.smoke_progress is not None:
                statuses.update_nowait(status.namespace, status.name, smoke_progress=None)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(every_s):
                await stop.wait()
