"""A saga's steps, read from Temporal's history: what `plnt history NAME` and the UI's timeline show.

`saga_history`: each activity of one saga run (the newest, or `run_id`) of a WorkflowRun: when it
started, how long it took, how many attempts it needed, how it ended, and a short `detail` decoded
from its result (pull_recipe's digest and signer, smoke_test's metrics ...); with the rollout's
commit and version (the saga's input), signer, outcome, smoke verdict and budgets. (Phase records,
local activities, are left out.)

`saga_rollouts`: every saga run of a WorkflowRun or ModelDeployment, newest first (Temporal's
visibility list of its workflow id), each with its commit, version and outcome.

Payloads are decoded with the client's data converter (its codec included); a payload that does not
decode leaves its field empty: history is for reading, it never fails on one odd event.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from plnt.reconciler.saga.io import SagaResult, saga_workflow_id
from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

MAX_ROLLOUTS = 100
MAX_DETAIL_KEYS = 12
MAX_DETAIL_TEXT = 300


class SagaStep(BaseModel):
    step: str
    started_at: datetime | None
    duration_ms: float | None
    attempts: int
    outcome: str  # completed | failed | timed out | cancelled | running
    error: str | None = None
    # A short summary of the activity's result (see step_detail); None while running or failed.
    detail: dict[str, Any] | None = None


class PersonAction(BaseModel):
    """A person's action the saga accepted (the `act` update): pause, resume, promote or abort."""

    at: datetime | None
    verb: str
    by: str = ""
    reason: str = ""


class SagaHistory(BaseModel):
    workflow_id: str
    run_id: str
    status: str
    started_at: datetime | None
    closed_at: datetime | None
    steps: list[SagaStep]
    result: dict[str, Any] | None = None
    # What a rollout's timeline needs at a glance.
    commit: str | None = None  # the saga's input: the commit it deploys
    version: str | None = None
    signer: str | None = None  # who signed the recipe or model pull_recipe verified
    phase: str | None = None  # the saga's outcome (SagaResult), once it completed
    reason: str | None = None
    smoke: dict[str, Any] | None = None  # {passed, reason, metrics} of smoke_test
    budget: dict[str, Any] | None = None  # the spec's canary.smokeTest (camelCase), from validate
    actions: list[PersonAction] = []  # what people did to the rollout (plnt rollout), as its history recorded



class SagaRollout(BaseModel):
    """One saga run of a WorkflowRun (`GET /workflows/{name}/rollouts`)."""

    runId: str  # noqa: N815 - the API's camelCase
    status: str  # Temporal's: RUNNING, COMPLETED, FAILED, TERMINATED, CANCELED, TIMED_OUT ...
    startedAt: datetime | None  # noqa: N815
    closedAt: datetime | None  # noqa: N815
    durationMs: float | None  # noqa: N815
    commit: str | None = None
    version: str | None = None
    phase: str | None = None  # SagaResult's, once completed
    reason: str | None = None
    action: str | None = None  # deploy | uninstall


_ENDINGS = {
    EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED: ("completed", "activity_task_completed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED: ("failed", "activity_task_failed_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT: ("timed out", "activity_task_timed_out_event_attributes"),
    EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED: ("cancelled", "activity_task_canceled_event_attributes"),
}


class NoSaga(LookupError):
    pass


def _short(value: Any) -> Any:
    if isinstance(value, str) and len(value) > MAX_DETAIL_TEXT:
        return value[:MAX_DETAIL_TEXT] + "..."
    return value


def _scalars(data: dict[str, Any], keys: tuple[str, ...] | None = None) -> dict[str, Any]:
    picked = {k: v for k, v in data.items() if (keys is None or k in keys)
              and (v is None or isinstance(v, (str, int, float, bool)))}
    return {k: _short(v) for k, v in list(picked.items())[:MAX_DETAIL_KEYS]}


def _took(ms: Any) -> str:
    return f" in {ms:.0f} ms" if isinstance(ms, (int, float)) and ms > 0 else ""


def step_detail(step: str, result: Any) -> dict[str, Any] | None:
    """A short dict of what one activity's result says, for a timeline: bounded (a dozen scalar
    keys, long texts cut) and without runner addresses (history is a `read` endpoint)."""
    if not isinstance(result, dict):
        return None
    if step == "pull_recipe":
        detail = _scalars(result, ("digest", "version", "signer", "transferred_bytes"))
        if isinstance(result.get("inputs"), list):
            detail["inputs"] = [str(name)[:100] for name in result["inputs"][:MAX_DETAIL_KEYS]]
        return detail
    if step == "check_gates":  # each gate's verdict: {NAME: "passed: ..." | "failed: ..."}
        verdicts = [v for v in result.get("verdicts") or [] if isinstance(v, dict)][:MAX_DETAIL_KEYS]
        return {str(v.get("name"))[:100]: _short(f"{'passed' if v.get('passed') else 'failed'}"
                                                 f"{_took(v.get('duration_ms'))}: {v.get('reason')}") for v in verdicts}
    if step == "smoke_test":
        metrics = result.get("metrics")
        return {"passed": result.get("passed"), "reason": _short(result.get("reason")),
                "metrics": _scalars(metrics) if isinstance(metrics, dict) else None}
    if step == "validate":
        return _scalars(result, ("backend_type", "version", "traffic_percent"))
    if step in ("install_release", "promote_release", "set_canary_traffic"):
        return _scalars(result, ("release_id", "track", "version", "traffic_percent"))
    return _scalars({k: v for k, v in result.items() if k not in ("endpoint", "recipe_dir", "pid", "port")})


async def _decode(client: Client, payloads: Any) -> Any:
    """The first payload of `payloads` (a Payloads message) as JSON-like data, or None."""
    items: list[Payload] = list(getattr(payloads, "payloads", []) or [])
    if not items:
        return None
    try:
        decoded = await client.data_converter.decode(items[:1])
    except Exception:  # noqa: BLE001 - one odd payload leaves one field empty
        return None
    value = decoded[0] if decoded else None
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return value


async def saga_history(client: Client, namespace: str, name: str, run_id: str | None = None) -> SagaHistory:
    """The steps of the newest saga of namespace/name, or of its run `run_id`. Raises NoSaga."""
    handle: WorkflowHandle[Any, SagaResult] = client.get_workflow_handle(
        saga_workflow_id(namespace, name), run_id=run_id, result_type=SagaResult)
    try:
        description = await handle.describe()
        history = await handle.fetch_history()
    except RPCError as exc:
        which = f"run {run_id} of the saga" if run_id else "no saga has run"
        raise NoSaga(f"{which} for {namespace}/{name}" + (" does not exist" if run_id else "")) from exc

    scheduled: dict[int, dict[str, Any]] = {}
    actions: list[PersonAction] = []
    saga_input: Any = None
    outcome: Any = None
    for event in history.events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
            saga_input = await _decode(client, event.workflow_execution_started_event_attributes.input)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            outcome = await _decode(client, event.workflow_execution_completed_event_attributes.result)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            request = event.workflow_execution_update_accepted_event_attributes.accepted_request
            if request.input.name == "act":
                args = await _decode(client, request.input.args)
                if isinstance(args, dict):
                    actions.append(PersonAction(at=event.event_time.ToDatetime(), verb=_text(args.get("verb")) or "?",
                                                by=_text(args.get("by")) or "", reason=_text(args.get("reason")) or ""))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            scheduled[event.event_id] = {"step": attrs.activity_type.name, "scheduled": event.event_time.ToDatetime(),
                                         "started": None, "attempts": 1, "outcome": "running", "ended": None,
                                         "error": None, "result": None}
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            entry = scheduled.get(attrs.scheduled_event_id)
            if entry is not None:
                entry["started"] = event.event_time.ToDatetime()
                entry["attempts"] = max(attrs.attempt, 1)
        elif kind in _ENDINGS:
            ending, field = _ENDINGS[kind]
            attrs = getattr(event, field)
            entry = scheduled.get(attrs.scheduled_event_id)
            if entry is not None:
                entry["outcome"], entry["ended"] = ending, event.event_time.ToDatetime()
                failure = getattr(attrs, "failure", None)
                if failure is not None and failure.message:
                    cause = failure.cause if failure.HasField("cause") else failure
                    entry["error"] = cause.message or failure.message
                if ending == "completed":
                    entry["result"] = await _decode(client, attrs.result)

    steps = []
    found: dict[str, Any] = {}
    for entry in scheduled.values():
        begin = entry["started"] or entry["scheduled"]
        duration = (entry["ended"] - entry["scheduled"]).total_seconds() * 1000 if entry["ended"] else None
        if entry["result"] is not None:
            found[entry["step"]] = entry["result"]
        steps.append(SagaStep(step=entry["step"], started_at=begin, duration_ms=duration, attempts=entry["attempts"],
                              outcome=entry["outcome"], error=entry["error"],
                              detail=step_detail(entry["step"], entry["result"])))
    result = outcome if isinstance(outcome, dict) else None
    saga = saga_input if isinstance(saga_input, dict) else {}
    pulled, smoke, valid = found.get("pull_recipe"), found.get("smoke_test"), found.get("validate")
    spec = valid.get("spec") if isinstance(valid, dict) else None
    canary = spec.get("canary") if isinstance(spec, dict) else None
    budget = canary.get("smokeTest") if isinstance(canary, dict) else None
    return SagaHistory(
        workflow_id=handle.id, run_id=description.run_id,
        status=description.status.name if description.status else "UNKNOWN",
        started_at=description.start_time, closed_at=description.close_time, steps=steps, result=result,
        commit=_text(saga.get("commit")), version=_text(saga.get("version")),
        signer=_text(pulled.get("signer")) or None if isinstance(pulled, dict) else None,
        phase=_text(result.get("phase")) if result else None, reason=_text(result.get("reason")) if result else None,
        smoke=step_detail("smoke_test", smoke) if isinstance(smoke, dict) else None,
        budget=budget if isinstance(budget, dict) else None, actions=actions,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


async def saga_rollouts(client: Client, namespace: str, name: str, limit: int = 20) -> list[SagaRollout]:
    """The saga runs of namespace/name, newest first (at most `limit`). Raises NoSaga for none."""
    limit = max(1, min(limit, MAX_ROLLOUTS))
    workflow_id = saga_workflow_id(namespace, name)
    try:
        executions = [execution async for execution in client.list_workflows(
            f"WorkflowId = '{workflow_id}'", limit=limit)]
    except RPCError as exc:
        raise NoSaga(f"cannot list the sagas of {namespace}/{name}: {exc.message}") from exc
    if not executions:
        raise NoSaga(f"no saga has run for {namespace}/{name}")
    executions.sort(key=lambda e: e.start_time, reverse=True)

    async def one(execution: Any) -> SagaRollout:
        saga_input, outcome = await _ends(client, workflow_id, execution.run_id)
        saga = saga_input if isinstance(saga_input, dict) else {}
        result = outcome if isinstance(outcome, dict) else {}
        closed = execution.close_time
        return SagaRollout(
            runId=execution.run_id, status=execution.status.name if execution.status else "UNKNOWN",
            startedAt=execution.start_time, closedAt=closed,
            durationMs=(closed - execution.start_time).total_seconds() * 1000 if closed else None,
            commit=_text(saga.get("commit")), version=_text(result.get("version")) or _text(saga.get("version")),
            phase=_text(result.get("phase")), reason=_text(result.get("reason")), action=_text(saga.get("action")),
        )

    return list(await asyncio.gather(*(one(e) for e in executions[:limit])))


async def _ends(client: Client, workflow_id: str, run_id: str) -> tuple[Any, Any]:
    """(the saga's input, its result) of one run: its first event, and its last when it completed."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    saga_input = outcome = None
    try:
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED:
                saga_input = await _decode(client, event.workflow_execution_started_event_attributes.input)
            elif event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
                outcome = await _decode(client, event.workflow_execution_completed_event_attributes.result)
    except RPCError:
        pass  # kept with what the list said
    return saga_input, outcome
