"""The deploy saga: one Temporal workflow per drift of one WorkflowRun.

    validate -> [wait for dependencies] -> pull recipe -> install canary -> smoke test -> promote | roll back

A stepped canary (canary.steps) goes through its steps between the install and the promotion: at
each, the canary's share (set_canary_traffic, from the second step on), its smoke test, its pause
(the soak: a durable timer or, `pause: manual`, until a person resumes), then its gates (check_gates:
canary.gates and the step's own, judging what the soak saw); a failed step rolls back. Kill-safe at
every step: Temporal replays the steps done and resumes the one under way.

A person acts on a running rollout through the `act` update (plnt rollout pause|resume|promote|abort,
recorded in the history): pause holds it before its next step; resume ends a hold or a pause;
promote and abort interrupt whatever the canary is doing (a smoke test, a pause, its gates) and promote it or
roll it back. An action that names another commit or spec fingerprint than the saga's is refused.

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
        CanaryStepPlan,
        DependenciesInput,
        GateInput,
        GateResults,
        InstallInput,
        PhaseUpdate,
        PulledRecipeInfo,
        PullInput,
        Release,
        ReleaseRef,
        RolloutAction,
        RolloutState,
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
        self._saga: SagaInput | None = None
        # What people did (the `act` update) and where the canary is.
        self._canary_at: tuple[int, int] | None = None  # (step, steps) once the canary takes traffic
        self._step_since: float | None = None  # when the canary took the current step's share (epoch s)
        self._paused_by: str | None = None
        self._waiting: str | None = None  # "manual" or "timed" during a step's pause
        self._resumes = 0
        self._decision: RolloutAction | None = None  # promote or abort
        self._settled = False  # promoting or rolling back: no action any more
        self._actions: list[str] = []

    @workflow.query
    def step(self) -> str:
        return self._step

    @workflow.query
    def rollout(self) -> RolloutState:
        saga = self._saga
        assert saga is not None
        at = self._canary_at or (None, None)
        return RolloutState(commit=saga.commit, fingerprint=saga.fingerprint, version=saga.version, step=self._step,
                            canary_step=at[0], canary_steps=at[1], paused_by=self._paused_by,
                            waiting_for_person=self._waiting == "manual",
                            decision=self._decision.verb if self._decision else None, actions=list(self._actions))

    @workflow.update
    async def act(self, action: RolloutAction) -> str:
        who = action.by or "someone"
        self._actions.append(f"{action.verb} by {who}" + (f": {action.reason}" if action.reason else ""))
        if action.verb == "pause":
            self._paused_by = who
            return f"paused: the rollout holds before its next step until resume, promote or abort ({self._where()})"
        if action.verb == "resume":
            self._paused_by = None
            self._resumes += 1
            return f"resumed ({self._where()})"
        self._decision = action
        if action.verb == "promote":
            return f"promoting {self._saga.version if self._saga else ''} now, skipping what is left of its steps"
        return "aborting: the canary is removed and the rollout ends RolledBack; it stays so until a new commit"

    @act.validator
    def _may_act(self, action: RolloutAction) -> None:
        saga = self._saga
        if saga is None or saga.action != "deploy" or not self._validated:
            raise _action_refused("this saga has no rollout to act on yet (it has not validated its commit)")
        if action.commit != saga.commit or action.fingerprint != saga.fingerprint:
            raise _action_refused(
                f"this rollout is commit {saga.commit[:12]} ({saga.version}, spec {saga.fingerprint}); the action "
                f"names commit {action.commit[:12]} (spec {action.fingerprint}): look again (plnt status) and act "
                "on the rollout under way")
        if self._settled or self._decision is not None:
            decided = self._decision.verb if self._decision else "finishing"
            raise _action_refused(f"the rollout is already {_ING.get(decided, decided)}")
        if action.verb == "pause" and self._paused_by is not None:
            raise _action_refused(f"already paused by {self._paused_by}")
        if action.verb == "resume" and self._paused_by is None and self._waiting is None:
            raise _action_refused(f"nothing to resume: the rollout is not paused ({self._where()})")

    def _where(self) -> str:
        if self._canary_at is None:
            return f"{self._step} (before its canary took traffic)"
        return f"step {self._canary_at[0]}/{self._canary_at[1]}"

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
        self._saga = saga
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
        self._settled = True
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
        if saga.promote_at_once is not None:  # an emergency pin: promoted once installed, as a person's promote
            pin = saga.promote_at_once
            self._decision = RolloutAction(verb="promote", **pin.model_dump())
            self._actions.append(f"pin by {pin.by or 'someone'}" + (f": {pin.reason}" if pin.reason else ""))
        if valid.depends_on:  # (histories recorded before dependsOn have none, and replay as they were)
            await self._phase(saga, Phase.VERIFYING, f"waiting for {', '.join(valid.depends_on)} to be promoted "
                              f"(dependsOn) before {saga.version}", {
                                  "attempted_fingerprint": saga.fingerprint, "attempted_version": saga.version,
                                  "last_error": None})
            await self._call("wait_for_dependencies", DependenciesInput(saga=ref), None, saga)
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
        await self._call("install_release", InstallInput(saga=ref, track="canary", recipe_digest=pulled.digest,
                                                      placement=saga.placement),
                         Release, saga)
        steps = valid.canary_steps
        if len(steps) > 1 or any(step.pause_s or step.manual or step.gates for step in steps):
            smoke, failed = await self._through_steps(saga, valid)
        else:  # one step, no pause: the saga as it always was (histories recorded before steps replay so)
            self._canary_at = (1, 1)
            if self._decision is None:
                await self._phase(saga, Phase.CANARY, f"smoke-testing canary {saga.version} with {percent}% of traffic", {
                    "canary_version": saga.version, "traffic_percent": percent,
                    "smoke_budget": (valid.spec.get("canary") or {}).get("smokeTest"),  # shown beside the numbers
                })
            smoke = await self._smoke(saga)
            if smoke is None:  # a person promoted or aborted it
                failed = self._aborted()
            elif not smoke.passed:
                failed = smoke.reason
            else:
                failed = await self._held(saga, "the canary passed", "the promotion")
        self._settled = True
        smoke_record = smoke.model_dump(mode="json") if smoke is not None else None
        if failed is not None:
            await self._remove_canary(saga)
            await self._phase(saga, Phase.ROLLED_BACK, failed, {
                "last_error": failed, "canary_version": None, "traffic_percent": 0, "smoke_test": smoke_record,
                **_NO_STEP,
            })
            return SagaResult(phase=Phase.ROLLED_BACK, reason=failed, version=saga.version)

        stable = await self._call("promote_release", ReleaseRef(saga=ref), Release, saga)
        message = f"{saga.version} promoted; {self._promoted_because(smoke)}"
        await self._phase(saga, Phase.READY, message, {
            "version": saga.version, "endpoint": stable.endpoint, "canary_version": None, "traffic_percent": 0,
            "smoke_test": smoke_record, "last_error": None, "deployed_spec": valid.spec,
            "deployed_fingerprint": saga.fingerprint, **_NO_STEP,
        })
        return SagaResult(phase=Phase.READY, reason=message, version=saga.version)

    async def _through_steps(self, saga: SagaInput, valid: ValidatedSpec) -> tuple[SmokeResult | None, str | None]:
        """Each step of a stepped canary: its share, its smoke test, its pause, its gates. Returns the
        last smoke test, and why the rollout rolls back (None: promote it)."""
        ref, version, steps = saga.ref(), saga.version, valid.canary_steps
        budget = (valid.spec.get("canary") or {}).get("smokeTest")
        n = len(steps)
        smoke: SmokeResult | None = None
        for i, step in enumerate(steps, 1):
            place = f"step {i}/{n}"
            if self._decision is not None:
                return smoke, self._aborted()
            if i > 1:
                await self._call("set_canary_traffic", CanaryStepInput(saga=ref, step=i), Release, saga)
            self._canary_at = (i, n)
            self._step_since = workflow.now().timestamp()  # the canary serves this step's share from now
            await self._phase(saga, Phase.CANARY, f"{place}: smoke-testing canary {version} with {step.weight}% of "
                              "traffic", {"canary_version": version, "traffic_percent": step.weight, "canary_step": i,
                                          "canary_steps": n, "smoke_budget": budget, "smoke_progress": None})
            tested = await self._smoke(saga)
            if tested is None:  # a person promoted or aborted it mid-test
                return smoke, self._aborted()
            smoke = tested
            if not smoke.passed:
                return smoke, f"{place} at {step.weight}%: {smoke.reason}"
            passed = f"{place} passed at {step.weight}%"
            after = "its gates" if step.gates else f"step {i + 1}" if i < n else "the promotion"
            # The pause is the step's soak: its gates judge what the canary did meanwhile.
            failed = await self._pause(saga, step, passed, after, smoke)
            if failed is None and step.gates and self._decision is None:
                failed = await self._gates(saga, step, i, passed)
            if failed is None:
                failed = await self._held(saga, passed, f"step {i + 1}" if i < n else "the promotion")
            if failed is not None or self._decision is not None:
                return smoke, failed
        return smoke, None

    async def _gates(self, saga: SagaInput, step: CanaryStepPlan, i: int, passed: str) -> str | None:
        """The step's gates; why the rollout rolls back (a gate failed, or a person aborted), or None."""
        await self._phase(saga, Phase.CANARY, f"{passed}; checking gates {', '.join(step.gates)}", {})
        results = await self._interruptible("check_gates", GateInput(saga=saga.ref(), step=i, since=self._step_since),
                                            GateResults, saga)
        if results is None:  # a person promoted or aborted meanwhile
            return self._aborted()
        failed = results.failure()
        return f"step {i}/{self._canary_at[1] if self._canary_at else i} at {step.weight}%: {failed}" if failed else None

    async def _smoke(self, saga: SagaInput) -> SmokeResult | None:
        """The smoke test, cancelled if a person promotes or aborts meanwhile (then None)."""
        return await self._interruptible("smoke_test", SmokeInput(saga=saga.ref()), SmokeResult, saga)

    async def _interruptible(self, activity: str, arg: Any, result_type: Any, saga: SagaInput) -> Any:
        """An activity, cancelled if a person promotes or aborts meanwhile (then None)."""
        if self._decision is not None:
            return None
        test = asyncio.ensure_future(self._call(activity, arg, result_type, saga))
        await workflow.wait_condition(lambda: test.done() or self._decision is not None)
        if test.done():
            return test.result()
        test.cancel()
        try:
            await test
        except (ActivityError, CancelledError, asyncio.CancelledError):
            pass
        return None

    async def _pause(self, saga: SagaInput, step: CanaryStepPlan, passed: str, after: str,
                     smoke: SmokeResult) -> str | None:
        """A step's pause: a durable timer, or until a person resumes. A promotion or an abort ends it."""
        if not (step.pause_s or step.manual) or self._decision is not None:
            return self._aborted()
        resumes = self._resumes
        if step.manual:
            self._waiting = "manual"
            await self._phase(saga, Phase.CANARY, f"{passed}; waiting for a person before {after}: plnt rollout "
                              f"resume {saga.run_name} (or promote, abort)", {"smoke_test": smoke.model_dump(mode="json")})
            await workflow.wait_condition(lambda: self._resumes > resumes or self._decision is not None)
        else:
            self._waiting = "timed"
            await self._phase(saga, Phase.CANARY, f"{passed}; pausing {_duration(step.pause_s)} before {after}",
                              {"smoke_test": smoke.model_dump(mode="json")})
            try:
                await workflow.wait_condition(lambda: self._resumes > resumes or self._decision is not None,
                                              timeout=timedelta(seconds=step.pause_s))
            except TimeoutError:
                pass
        self._waiting = None
        return self._aborted()

    async def _held(self, saga: SagaInput, passed: str, after: str) -> str | None:
        """While a person's pause holds, wait before `after`. Returns why to roll back (an abort), or None."""
        if self._paused_by is not None and self._decision is None:
            await self._phase(saga, Phase.CANARY, f"{passed}; paused by {self._paused_by} before {after}: plnt "
                              f"rollout resume {saga.run_name} (or promote, abort)", {})
            await workflow.wait_condition(lambda: self._paused_by is None or self._decision is not None)
        return self._aborted()

    def _aborted(self) -> str | None:
        """Why the rollout rolls back when a person aborted it (None: no abort)."""
        decision = self._decision
        if decision is None or decision.verb != "abort":
            return None
        why = f": {decision.reason}" if decision.reason else ""
        return f"aborted by {decision.by or 'someone'} at {self._where()}{why}"

    def _promoted_because(self, smoke: SmokeResult | None) -> str:
        decision = self._decision
        if decision is not None and self._saga is not None and self._saga.promote_at_once is not None:
            why = f": {decision.reason}" if decision.reason else ""
            return f"pinned by {decision.by or 'someone'} at once, without a smoke test{why}"
        if decision is not None and decision.verb == "promote":
            why = f": {decision.reason}" if decision.reason else ""
            return f"promoted by {decision.by or 'someone'} at {self._where()}, skipping what was left of its steps{why}"
        assert smoke is not None
        return smoke.reason

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


_ING = {"promote": "promoting", "abort": "aborting"}


def _action_refused(message: str) -> ApplicationError:
    """An update validator's refusal: the action is not recorded, the caller gets why."""
    return ApplicationError(f"refused: {message}", type="RolloutActionRefused", non_retryable=True)


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
