"""The deploy saga: one Temporal workflow per drift of one WorkflowRun.

    validate -> pull recipe -> install canary -> smoke test -> promote | roll back

A stepped canary (canary.steps) goes through its steps between the install and the promotion: at
each, the canary's share (set_canary_traffic, from the second step on), its smoke test, then its
pause as a durable timer; a failed step rolls back. Kill-safe at every step: Temporal replays the
steps done and resumes the one under way.

`run()` owns compensation and the final status; `_deploy()` holds the business steps. Whatever
happens the saga ends with a status (Ready, RolledBack or Failed) and a reason: compensation
removes the canary and never raises. Workflow id: `plnt-<namespace>-<name>`, so Temporal itself
refuses a second saga beside a running one.

The input is not trusted (see saga_io): it names a commit, and the activities check it against
plnt's own clone before anything else. A saga they refuse (UntrustedSagaInput), or whose input does
not even decode, or that runs under another workflow id, fails at once: no status is written, no
canary is touched, nothing installs.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from plnt.core.status import FINAL_PHASES, Phase
    from plnt.reconciler.errors import NON_RETRYABLE_ERROR_TYPES, UntrustedSagaInput
    from plnt.reconciler.saga.io import (
        CanaryStepInput,
        InstallInput,
        PhaseUpdate,
        PulledRecipeInfo,
        PullInput,
        Release,
        ReleaseRef,
        SagaInput,
        SagaResult,
        SmokeInput,
        SmokeResult,
        ValidatedSpec,
        ValidateInput,
    )
    from plnt.reconciler.saga.progress import report as report_progress  # not `from . import`: the sandbox would load it again
    from plnt.reconciler.settings import RetrySettings



HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# Sagas started from here on report their progress statuses from the saga's code (saga_progress);
# a history recorded before it has a local activity for each and replays as it was made.
PROGRESS_FROM_SAGA = "progress-from-saga"


def retry_policy(settings: RetrySettings) -> RetryPolicy:
    return RetryPolicy(
        initial_interval=timedelta(seconds=settings.initial_interval_s),
        backoff_coefficient=settings.backoff,
        maximum_interval=timedelta(seconds=settings.maximum_interval_s),
        maximum_attempts=settings.maximum_attempts,
        non_retryable_error_types=NON_RETRYABLE_ERROR_TYPES,
    )


@workflow.defn(name="DeploySaga")
class DeploySaga:
    def __init__(self) -> None:
        self._step = "starting"
        self._validated = False  # until then a refusal writes no status: the input may be forged

    @workflow.query
    def step(self) -> str:
        return self._step

    @workflow.run
    async def run(self, raw: RawValue) -> SagaResult:
        # Decoded here, not by the SDK: an input that does not fit SagaInput (a forged one carrying a
        # spec or a trust policy, say) fails the saga with a reason instead of retrying its task forever.
        try:
            saga = workflow.payload_converter().from_payload(raw.payload, SagaInput)
        except Exception as exc:  # noqa: BLE001 - any decoding error is the same refusal
            raise _refusal(f"the saga input is not a plnt SagaInput (it names a commit; it carries no spec, "
                           f"backend or trust policy): {_first_line(exc)}") from None
        if workflow.info().workflow_id != saga.workflow_id:
            raise _refusal(f"a saga for {saga.key} runs as workflow {saga.workflow_id}, not {workflow.info().workflow_id}")
        if saga.action == "uninstall":
            return await self._uninstall(saga)
        try:
            return await self._deploy(saga)
        except (ActivityError, ApplicationError, CancelledError, asyncio.CancelledError) as exc:
            reason = failure_reason(exc)
            if _untrusted(exc) and not self._validated:
                raise _refusal(reason.removeprefix(f"{UntrustedSagaInput.__name__}: ")) from None
        # (Refused after validate, e.g. its commit force-pushed away mid-saga: a saga of plnt's own, so it
        # is compensated and fails like any other.)
        # Compensation runs even when the saga was cancelled: shield it from the cancellation.
        # Removing a canary that was never installed is a no-op, so no bookkeeping is needed.
        await asyncio.shield(asyncio.ensure_future(self._remove_canary(saga)))
        await asyncio.shield(asyncio.ensure_future(self._phase(saga, Phase.FAILED, reason, {
            "last_error": reason, "canary_version": None, "traffic_percent": 0, **_NO_STEP,
        })))
        return SagaResult(phase=Phase.FAILED, reason=reason, version=saga.version)

    async def _deploy(self, saga: SagaInput) -> SagaResult:
        ref = saga.ref()
        # Checked against the commit before the first status write: a refused saga writes nothing.
        valid = await self._call("validate", ValidateInput(saga=ref), ValidatedSpec, saga)
        self._validated = True
        await self._phase(saga, Phase.VERIFYING, f"verifying {saga.version}", {
            "attempted_fingerprint": saga.fingerprint, "attempted_version": saga.version, "last_error": None,
        })
        pulled = await self._call("pull_recipe", PullInput(saga=ref), PulledRecipeInfo, saga)
        # Data in the status write only (no new command): replay-safe for histories recorded before.
        await self._phase(saga, Phase.VERIFYING, f"{saga.version} verified: signed by {pulled.signer}", {
            "signer": pulled.signer or None, "inputs": pulled.inputs,
        })

        percent = valid.traffic_percent
        await self._phase(saga, Phase.DEPLOYING, f"installing canary {saga.version}", {})
        await self._call("install_release", InstallInput(saga=ref, track="canary", recipe_digest=pulled.digest),
                         Release, saga)
        steps = valid.canary_steps
        if len(steps) > 1 or any(step.pause_s for step in steps):
            smoke, failed = await self._through_steps(saga, valid)
        else:  # one step, no pause: the saga as it always was (histories recorded before steps replay so)
            await self._phase(saga, Phase.CANARY, f"smoke-testing canary {saga.version} with {percent}% of traffic", {
                "canary_version": saga.version, "traffic_percent": percent,
                "smoke_budget": (valid.spec.get("canary") or {}).get("smokeTest"),  # shown beside the numbers
            })
            smoke = await self._call("smoke_test", SmokeInput(saga=ref), SmokeResult, saga)
            failed = None if smoke.passed else smoke.reason
        smoke_record = smoke.model_dump(mode="json")
        if failed is not None:
            await self._remove_canary(saga)
            await self._phase(saga, Phase.ROLLED_BACK, failed, {
                "last_error": failed, "canary_version": None, "traffic_percent": 0, "smoke_test": smoke_record,
                **_NO_STEP,
            })
            return SagaResult(phase=Phase.ROLLED_BACK, reason=failed, version=saga.version)

        stable = await self._call("promote_release", ReleaseRef(saga=ref), Release, saga)
        message = f"{saga.version} promoted; {smoke.reason}"
        await self._phase(saga, Phase.READY, message, {
            "version": saga.version, "endpoint": stable.endpoint, "canary_version": None, "traffic_percent": 0,
            "smoke_test": smoke_record, "last_error": None, "deployed_spec": valid.spec,
            "deployed_fingerprint": saga.fingerprint, **_NO_STEP,
        })
        return SagaResult(phase=Phase.READY, reason=message, version=saga.version)

    async def _through_steps(self, saga: SagaInput, valid: ValidatedSpec) -> tuple[SmokeResult, str | None]:
        """Each step of a stepped canary: its share, its smoke test, its pause. Returns the last smoke
        test, and why a step failed (None when every step passed)."""
        ref, version, steps = saga.ref(), saga.version, valid.canary_steps
        budget = (valid.spec.get("canary") or {}).get("smokeTest")
        n = len(steps)
        smoke: SmokeResult | None = None
        for i, step in enumerate(steps, 1):
            if i > 1:
                await self._call("set_canary_traffic", CanaryStepInput(saga=ref, step=i), Release, saga)
            place = f"step {i}/{n}"
            await self._phase(saga, Phase.CANARY, f"{place}: smoke-testing canary {version} with {step.weight}% of "
                              "traffic", {"canary_version": version, "traffic_percent": step.weight, "canary_step": i,
                                          "canary_steps": n, "smoke_budget": budget, "smoke_progress": None})
            smoke = await self._call("smoke_test", SmokeInput(saga=ref), SmokeResult, saga)
            if not smoke.passed:
                return smoke, f"{place} at {step.weight}%: {smoke.reason}"
            if step.pause_s:
                after = f"step {i + 1}" if i < n else "the promotion"
                await self._phase(saga, Phase.CANARY, f"{place} passed at {step.weight}%; pausing "
                                  f"{_duration(step.pause_s)} before {after}", {"smoke_test": smoke.model_dump(mode="json")})
                await workflow.sleep(timedelta(seconds=step.pause_s))
        assert smoke is not None  # validate gives at least one step
        return smoke, None

    async def _uninstall(self, saga: SagaInput) -> SagaResult:
        ref = saga.ref()
        try:
            # The canary first: its activity checks the commit before the first status write.
            await self._call("remove_release", ReleaseRef(saga=ref, track="canary"), None, saga)
        except (ActivityError, ApplicationError) as exc:
            if _untrusted(exc):
                raise _refusal(failure_reason(exc).removeprefix(f"{UntrustedSagaInput.__name__}: ")) from None
            reason = failure_reason(exc)
            await self._phase(saga, Phase.FAILED, f"uninstall failed: {reason}", {"last_error": reason})
            return SagaResult(phase=Phase.FAILED, reason=reason)
        await self._phase(saga, Phase.DELETING, "removed from the repository; uninstalling", {})
        try:
            await self._call("remove_release", ReleaseRef(saga=ref, track="stable"), None, saga)
        except (ActivityError, ApplicationError) as exc:
            reason = failure_reason(exc)
            await self._phase(saga, Phase.FAILED, f"uninstall failed: {reason}", {"last_error": reason})
            return SagaResult(phase=Phase.FAILED, reason=reason)
        await workflow.execute_local_activity(
            "record_phase", PhaseUpdate(namespace=saga.namespace, name=saga.name, phase=None, commit=saga.commit),
            start_to_close_timeout=timedelta(seconds=10),
        )
        return SagaResult(phase=Phase.DELETING, reason="uninstalled")

    async def _remove_canary(self, saga: SagaInput) -> None:
        """Compensation: best effort, never raises."""
        try:
            await self._call("remove_release", ReleaseRef(saga=saga.ref(), track="canary"), None, saga)
        except Exception as exc:  # noqa: BLE001 - compensation must not fail the saga
            workflow.logger.warning("compensation failed for %s/%s: %s", saga.namespace, saga.name, exc)

    async def _call(self, activity: str, arg: Any, result_type: Any, saga: SagaInput) -> Any:
        self._step = activity
        kwargs: dict[str, Any] = {}
        if result_type is not None:
            kwargs["result_type"] = result_type
        return await workflow.execute_activity(
            activity, arg,
            start_to_close_timeout=timedelta(seconds=saga.retry.step_timeouts.of(activity)),
            # Every long activity heartbeats each second: a dead worker is noticed in 10 s.
            heartbeat_timeout=None if activity == "validate" else HEARTBEAT_TIMEOUT,
            retry_policy=retry_policy(saga.retry),
            **kwargs,
        )

    async def _phase(self, saga: SagaInput, phase: Phase, message: str, fields: dict[str, Any]) -> None:
        if phase in FINAL_PHASES and self._validated:
            # Also in the outcome: the plan reads which spec failed from it, and the progress write
            # that carried them first is not durable.
            fields = {"attempted_fingerprint": saga.fingerprint, "attempted_version": saga.version, **fields}
        update = PhaseUpdate(namespace=saga.namespace, name=saga.name, phase=phase, commit=saga.commit,
                             message=message, saga_id=workflow.info().run_id, fields=fields)
        if phase not in FINAL_PHASES and workflow.patched(PROGRESS_FROM_SAGA):
            if not workflow.unsafe.is_replaying():
                info = workflow.info()
                if not report_progress(info.namespace, info.task_queue, update):
                    workflow.logger.warning("no progress sink in this process for task queue %s: %s/%s %s not "
                                            "written", info.task_queue, saga.namespace, saga.name, phase.value)
            return
        await workflow.execute_local_activity("record_phase", update, start_to_close_timeout=timedelta(seconds=10))


# The final phases clear a stepped canary's place.
_NO_STEP = {"canary_step": None, "canary_steps": None}


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _untrusted(exc: BaseException) -> bool:
    cause: BaseException | None = exc
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    return isinstance(cause, ApplicationError) and cause.type == UntrustedSagaInput.__name__


def _refusal(message: str) -> ApplicationError:
    """Fails the workflow (not its task): the saga ends refused, and says why."""
    return ApplicationError(f"refused: {message}", type=UntrustedSagaInput.__name__, non_retryable=True)


def _first_line(exc: BaseException) -> str:
    cause = exc.__cause__ or exc
    return " ".join(str(cause).split())[:500]


def failure_reason(exc: BaseException) -> str:
    """The innermost message of an activity failure, with its error type: what a human needs."""
    if isinstance(exc, (CancelledError, asyncio.CancelledError)) or (
        isinstance(exc, ActivityError) and isinstance(exc.cause, CancelledError)
    ):
        return "superseded: a newer commit changed this WorkflowRun before the saga finished"
    cause: BaseException | None = exc
    while isinstance(cause, ActivityError) and cause.cause is not None:
        cause = cause.cause
    if isinstance(cause, ApplicationError) and cause.type:
        return f"{cause.type}: {cause.message}"
    return str(cause)
