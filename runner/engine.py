"""Run a recipe's step DAG for one invocation.

Steps run level by level (`step_levels`); the steps of one level run concurrently. A step
is implemented by the recipe module's function named after the step id, if there is one
(sync or async, called with a `StepContext`; sync functions run in a worker thread),
otherwise by the default binding of its `tool`. The first step that raises fails the
invocation with `StepFailed`; its siblings still running are cancelled.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plnt.reconciler.specs import Step, Workflow, output_step, step_levels
from plnt.runner.adapters import RuntimeAdapter
from plnt.runner.recipe import Recipe
from plnt.runner.tools import Tools


class StepFailed(Exception):
    """A step raised: `step` is its id, `cause` the original exception."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        self.cause = cause
        self.message = f"{type(cause).__name__}: {cause}"
        super().__init__(f"step {step!r} failed: {self.message}")


@dataclass(frozen=True)
class StepContext:
    """What a step sees: the invocation inputs, the results of all finished steps (by id),
    its own params, the tool bindings, the adapter, and the recipe (workflow, directory)."""

    step_id: str
    inputs: Mapping[str, Any]
    results: Mapping[str, Any]
    params: Mapping[str, Any]
    tools: Tools
    adapter: RuntimeAdapter
    directory: Path
    workflow: Workflow

    def render(self, template: str) -> str:
        """Fill `{placeholders}` from the inputs and finished results (as the tools do)."""
        return self.tools.render(template)


@dataclass
class WorkflowResult:
    output: Any
    timings_ms: dict[str, float] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    total_ms: float = 0.0


async def _run_step(
    recipe: Recipe, step: Step, inputs: Mapping[str, Any], results: Mapping[str, Any], adapter: RuntimeAdapter
) -> tuple[Any, float]:
    started = time.perf_counter()
    tools = Tools(
        adapter,
        recipe.directory,
        MappingProxyType({**inputs, **results}),
        digest=recipe.digest,
        step_tool=step.tool,
        step_params=step.params,
        deps=step.deps,
    )
    ctx = StepContext(
        step.id, inputs, results, MappingProxyType(dict(step.params)), tools, adapter, recipe.directory, recipe.workflow
    )
    function = getattr(recipe.module, step.id, None) if recipe.module is not None else None
    try:
        if callable(function):
            if inspect.iscoroutinefunction(function):
                value = await function(ctx)
            else:
                value = await asyncio.to_thread(function, ctx)
                if inspect.isawaitable(value):
                    value = await value
        elif step.tool == "python":
            raise LookupError(f"tool python needs a function {step.id}(ctx) in the recipe module")
        else:
            value = await tools.call(step.tool)
    except Exception as exc:  # not CancelledError: a cancelled sibling is not a failure
        raise StepFailed(step.id, exc) from exc
    return value, (time.perf_counter() - started) * 1000


async def run_workflow(recipe: Recipe, inputs: dict[str, Any], adapter: RuntimeAdapter) -> WorkflowResult:
    """Run every step of `recipe` on `inputs`; returns the output step's result and timings."""
    started = time.perf_counter()
    steps = {step.id: step for step in recipe.workflow.steps}
    frozen_inputs = MappingProxyType(dict(inputs))
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for level in step_levels(recipe.workflow.steps):
        finished = MappingProxyType(dict(results))
        tasks = [
            asyncio.ensure_future(_run_step(recipe, steps[step_id], frozen_inputs, finished, adapter))
            for step_id in level
        ]
        try:
            outcomes = await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        for step_id, (value, ms) in zip(level, outcomes, strict=True):
            results[step_id] = value
            timings[step_id] = round(ms, 3)
    return WorkflowResult(
        output=results[output_step(recipe.workflow)],
        timings_ms=timings,
        results=results,
        total_ms=round((time.perf_counter() - started) * 1000, 3),
    )
