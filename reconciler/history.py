"""A saga's steps, read from Temporal's history: what `plnt history NAME` shows.

Each activity of the newest saga of a WorkflowRun: when it started, how long it took, how many
attempts it needed and how it ended. (Phase records, local activities, are left out.)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError

from .saga_io import SagaResult, saga_workflow_id


class SagaStep(BaseModel):
    step: str
    started_at: datetime | None
    duration_ms: float | None
    attempts: int
    outcome: str  # completed | failed | timed out | cancelled | running
    error: str | None = None


class SagaHistory(BaseModel):
    workflow_id: str
    run_id: str
    status: str
    started_at: datetime | None
    closed_at: datetime | None
    steps: list[SagaStep]
    result: dict[str, Any] | None = None


_ENDINGS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("completed", "activity_task_completed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("timed out", "activity_task_timed_out_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("cancelled", "activity_task_canceled_event_attributes"),
}


class NoSaga(LookupError):
    pass


async def saga_history(client: Client, namespace: str, name: str) -> SagaHistory:
    handle = client.get_workflow_handle(saga_workflow_id(namespace, name), result_type=SagaResult)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as exc:
        raise NoSaga(f"no saga has run for {namespace}/{name}") from exc

    scheduled: dict[int, dict[str, Any]] = {}
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = {"step": attrs.activity_type.name, "scheduled": event.event_time.ToDatetime(),
                                         "started": None, "attempts": 1, "outcome": "running", "ended": None, "error": None}
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            entry = scheduled.get(attrs.scheduled_event_id)
            if entry is not None:
                entry["started"] = event.event_time.ToDatetime()
                entry["attempts"] = max(attrs.attempt, 1)
        elif kind in _ENDINGS:
            outcome, field = _ENDINGS[kind]
            attrs = getattr(event, field)
            entry = scheduled.get(attrs.scheduled_event_id)
            if entry is not None:
                entry["outcome"], entry["ended"] = outcome, event.event_time.ToDatetime()
                failure = getattr(attrs, "failure", None)
                if failure is not None and failure.message:
                    cause = failure.cause if failure.HasField("cause") else failure
                    entry["error"] = cause.message or failure.message

    steps = []
    for entry in scheduled.values():
        begin = entry["started"] or entry["scheduled"]
        duration = (entry["ended"] - entry["scheduled"]).total_seconds() * 1000 if entry["ended"] else None
        steps.append(SagaStep(step=entry["step"], started_at=begin, duration_ms=duration, attempts=entry["attempts"],
                              outcome=entry["outcome"], error=entry["error"]))
    result = None
    if description.status is not None and description.status.name == "COMPLETED":
        try:
            result = (await handle.result()).model_dump(mode="json")
        except Exception:  # noqa: BLE001 - the steps are what matters; the result is a bonus
            result = None
    return SagaHistory(
        workflow_id=handle.id, run_id=description.run_id, status=description.status.name if description.status else "UNKNOWN",
        started_at=description.start_time, closed_at=description.close_time, steps=steps, result=result,
    )
