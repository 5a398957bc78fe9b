"""check_gates: after a canary step's smoke test, the Gates the step names (canary.gates and its own),
read at the saga's commit, each giving a verdict: quality (golden cases on canary and stable),
compare (the canary's real traffic against the stable's, from the control plane's traffic ledger), metric (a
PromQL query), webhook (a signed HTTP check). A gate whose source did not answer is
retried (GateUnavailable); one that cannot give a verdict fails the step (GateUnusable)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from plnt.core.recipe import RecipeError, load_golden
from plnt.core.specs.models import GATE_SECRET_PREFIX, Gate, JudgeRubric, WorkflowRun
from plnt.reconciler.errors import GateUnusable, InvalidRecipe, UntrustedSagaInput
from plnt.reconciler.gates.compare import compare_gate
from plnt.reconciler.gates.judge import Judge, model_judge
from plnt.reconciler.gates.promql import compare, query_value
from plnt.reconciler.gates.quality import Ask, judge_quality, model_asker, model_cases, run_cases, runner_asker
from plnt.reconciler.gates.webhook import webhook_gate
from plnt.reconciler.saga.activities.base import SagaStep, boundary, with_heartbeats
from plnt.reconciler.saga.io import GateInput, GateResults, GateVerdict
from plnt.reconciler.state import Release
from temporalio import activity


class GatesStep(SagaStep):
    @activity.defn(name="check_gates")
    @boundary
    async def check_gates(self, request: GateInput) -> GateResults:
        trusted, run = await self._deploy(request.saga)
        steps = run.spec.canary.plan_steps()
        step = self._step_at(run, request.step)
        canary = await self._release_of(run, "canary")
        live = await self._live_of(run)
        stable = live.stable if live is not None else None
        context = {"namespace": run.metadata.namespace, "name": run.metadata.name, "commit": request.saga.commit,
                   "canary_version": run.version, "stable_version": stable.version if stable else "",
                   "step": request.step, "steps": len(steps), "weight": step.weight, "since": request.since}
        verdicts = []
        for name in run.spec.canary.step_gates(step):
            gate = trusted.gates.get(name)
            if gate is None:  # the loader refuses such a commit; a saga never gets here with one
                raise UntrustedSagaInput(f"commit {request.saga.commit[:12]} has no Gate {name} in {run.metadata.namespace}")
            started = time.perf_counter()
            verdict = await with_heartbeats(self._verdict(gate, run, canary, stable, context))
            verdicts.append(verdict.model_copy(update={"duration_ms": round((time.perf_counter() - started) * 1000, 1)}))
        return GateResults(verdicts=verdicts)

    async def _judge(self, gate: str, run: Any, rubric: JudgeRubric | None) -> tuple[Judge | None, int]:
        """The judge model's promoted server, called directly (its answers are the gate's, not a user's)."""
        if rubric is None:
            return None, 0
        live = await self._live(run.metadata.namespace, rubric.model)
        if live is None or live.stable is None:
            raise GateUnusable(f"Gate {gate}: its judge, ModelDeployment {run.metadata.namespace}/{rubric.model}, has "
                               "no promoted release (dependsOn on it orders the rollouts)")
        serving = live.stable.model
        alias = serving.alias if serving is not None else rubric.model
        return model_judge(live.stable.endpoint, alias, rubric.rubric, runtime=serving.runtime if serving else None,
                           timeout_s=self._smoke_timeout_s), rubric.min_score

    async def _verdict(self, gate: Gate, run: Any, canary: Release, stable: Release | None,
                       context: dict[str, Any]) -> GateVerdict:
        name, spec = gate.metadata.name, gate.spec
        if spec.quality is not None:
            if isinstance(run, WorkflowRun):
                recipe_dir = self._verified_recipe(run, canary.recipe_digest)
                try:
                    cases = await asyncio.to_thread(load_golden, recipe_dir)
                except RecipeError as exc:
                    raise InvalidRecipe(f"recipe {run.spec.workflow.ref}: {exc.problem}") from exc

                def asker(release: Release) -> Ask:
                    return runner_asker(release.endpoint)
            else:  # a ModelDeployment's canary.golden, asked of each release's model server directly
                cases = model_cases(run.spec.canary.golden)

                def asker(release: Release) -> Ask:
                    return model_asker(release.endpoint, release.model.alias if release.model else run.metadata.name)
            judge, min_score = await self._judge(name, run, spec.quality.judge)
            on_canary = await run_cases(asker(canary), cases, timeout_s=self._smoke_timeout_s, judge=judge,
                                        min_score=min_score)
            # The stable release on the same cases (its own recipe answers them as it was built to):
            # a case both fail is the cases' fault, not the canary's.
            on_stable = await run_cases(asker(stable), cases, timeout_s=self._smoke_timeout_s, judge=judge,
                                        min_score=min_score) \
                if stable is not None and spec.quality.max_drop_vs_stable is not None else None
            quality = judge_quality(spec.quality, on_canary, on_stable)
            return GateVerdict(name=name, type="quality", passed=quality.passed, reason=quality.reason,
                               failing=quality.failing)
        if spec.compare is not None:
            if self._traffic is None:
                raise GateUnusable(f"Gate {name}: a compare gate reads the gateways' traffic from the control plane "
                                   "with the internal token, which this worker was not given (plnt worker "
                                   "--internal-token-file)")
            if stable is None:
                raise GateUnusable(f"Gate {name}: {run.key} has no stable release to compare its canary with "
                                   "(a first install): leave the compare gate out of the first rollout")
            read = self._traffic(run.metadata.namespace, run.metadata.name, canary.version, stable.version,
                                 float(context.get("since") or 0.0))
            passed, reason = await compare_gate(spec.compare, read)
            return GateVerdict(name=name, type="compare", passed=passed, reason=reason)
        if spec.metric is not None:
            query = spec.metric.query
            for key in ("canary_version", "stable_version", "namespace", "name"):  # longest first
                query = query.replace(f"${key}", str(context[key]))
            value = await query_value(spec.metric.prometheus, query, timeout_s=30.0)
            passed, reason = compare(value, max=spec.metric.max, min=spec.metric.min)
            return GateVerdict(name=name, type="metric", passed=passed, reason=reason)
        assert spec.webhook is not None
        variable = GATE_SECRET_PREFIX + spec.webhook.secret
        secret = os.environ.get(variable)
        if not secret:
            raise GateUnusable(f"Gate {name}: plnt has no {variable} in its environment (the webhook's HMAC key); "
                               "set it where plnt (its worker) runs")
        verdict = await webhook_gate(spec.webhook.url, secret.encode(), {"gate": name, **context},
                                     timeout_s=spec.webhook.timeout_s)
        return GateVerdict(name=name, type="webhook", passed=verdict.passed, reason=verdict.reason or
                           ("passed" if verdict.passed else "failed (no reason given)"))
