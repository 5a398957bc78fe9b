"""smoke_test: the canary invoked with the recipe's golden inputs (a model: the spec's prompts),
measured (saga/smoke.py) and judged against the spec's budgets. Its heartbeats carry the numbers so
far, which the reconciler shows live."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from plnt.core.recipe import RecipeError, load_golden
from plnt.core.specs.models import ModelDeployment, WorkflowRun, run_key
from plnt.core.status import Phase
from plnt.reconciler.errors import InvalidRecipe, ModelNotServing
from plnt.reconciler.saga.activities.base import SagaStep, boundary, with_heartbeats
from plnt.reconciler.saga.io import SmokeInput
from plnt.reconciler.saga.smoke import Sample, SmokeResult, judge, measure, progress_of, summarise
from plnt.reconciler.state import Release
from temporalio import activity

MODEL_WAIT_POLL_S = 0.5  # a bound WorkflowRun's smoke test waits for its model's promotion this often


class SmokeTestStep(SagaStep):
    @activity.defn(name="smoke_test")
    @boundary
    async def smoke_test(self, request: SmokeInput) -> SmokeResult:
        _, run = await self._deploy(request.saga)
        canary = await self._release_of(run, "canary")
        wake = getattr(self._driver, "wake", None)  # a canary that parked (scale to zero) since its install
        if wake is not None and (woken := await wake(run.metadata.namespace, run.metadata.name,
                                                     canary.release_id)) is not None:
            canary = woken
        budget = run.spec.canary.smoke_test
        if isinstance(run, WorkflowRun) and run.spec.model is not None:
            await with_heartbeats(self._model_promoted(run.metadata.namespace, run.spec.model))
        done: list[Sample] = []  # heartbeats carry the numbers so far: the reconciler shows them live
        protocol: Literal["runner", "openai-chat"]
        if isinstance(run, ModelDeployment):
            inputs, protocol, stream = _chats(run), "openai-chat", False
        else:
            inputs, protocol = await self._golden_inputs(run, canary), "runner"
            # Streamed when a TTFT or TPOT budget is set, so the tokens can be timed.
            stream = budget.ttft_budget_ms is not None or budget.tpot_budget_ms is not None
        samples = await with_heartbeats(measure(
            canary.endpoint, inputs, invocations=budget.invocations, concurrency=budget.concurrency,
            timeout_s=self._smoke_timeout_s, stream=stream, samples=done, protocol=protocol,
        ), details=lambda: progress_of(done, budget.invocations))
        return judge(summarise(samples), budget)

    async def _golden_inputs(self, run: WorkflowRun, canary: Release) -> list[dict[str, Any]]:
        """The recipe's golden cases, read as data from plnt's verified copy."""
        recipe_dir = self._verified_recipe(run, canary.recipe_digest)
        try:
            cases = await asyncio.to_thread(load_golden, recipe_dir)  # data: golden.yaml, bounded YAML
        except RecipeError as exc:
            raise InvalidRecipe(f"recipe {run.spec.workflow.ref}: {exc.problem}") from exc
        return [case.input for case in cases]

    async def _model_promoted(self, namespace: str, model: str) -> None:
        """A WorkflowRun bound to a model is smoke-tested once that model serves (its first rollout
        may run beside this one): until then its LLM calls would get 503s. A model whose rollout
        ended without a promoted release fails this at once, naming why."""
        while (live := await self._live(namespace, model)) is None or live.stable is None:
            status = self._statuses.get(run_key(namespace, model)) if self._statuses is not None else None
            if status is not None and status.phase in (Phase.ROLLED_BACK, Phase.FAILED):
                raise ModelNotServing(
                    f"spec.model: ModelDeployment {namespace}/{model} has no promoted release (its rollout ended "
                    f"{status.phase.value}: {status.last_error or status.message}); fix it, then commit a change to "
                    "this WorkflowRun to try again")
            await asyncio.sleep(MODEL_WAIT_POLL_S)


def _chats(run: ModelDeployment) -> list[dict[str, Any]]:
    """One chat request per prompt of the spec, answered deterministically (temperature 0)."""
    canary = run.spec.canary
    return [{"model": run.metadata.name, "max_tokens": canary.max_tokens, "temperature": 0,
             "messages": [{"role": "user", "content": prompt}]} for prompt in canary.prompts]
