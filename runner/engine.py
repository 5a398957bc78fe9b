"""Run a recipe's step DAG for one invocation.

Steps run level by level (`step_levels`); the steps of one level run concurrently. A step
is implemented by the recipe module's function named after the step id, if there is one
(sync or async, called with a `StepContext`; sync functions run in a worker thread),
otherwise by the default binding of its `tool`. The first step that raises fails the
invocation with `StepFailed`; its siblings still running are cancelled. Every step's
wall-clock time is in `WorkflowResult.timings_ms`.

Streaming (one mechanism: a per-invocation token sink)
------------------------------------------------------
`run_workflow(..., sink=callback)` streams the tokens of the workflow's OUTPUT step:
`callback(step_id, text)` is called once per token, in order, as it is produced. Only the
output step gets the sink (`ctx.sink`, `ctx.streaming`); other steps run as usual. Tokens
come from exactly three places:

1. the output step has no module function and its tool is `llm.generate`: the engine
   streams the adapter's tokens (its result is their concatenation, as without streaming);
2. a module function iterates ``async for token in ctx.stream("llm.generate", prompt=...)``:
   every token it receives is also sent to the sink (`ctx.stream` takes the step's params,
   overridden by keyword arguments, like `ctx.tools.call`). The function may return
   anything (a dict with the text and more): the sink only previews the text;
3. a module function returns an async iterator (or is an async generator function): the
   engine sends each item (as str) to the sink and the step's result is their concatenation.

`ctx.emit(text)` sends a piece of text of its own to the sink (safe from a sync step's worker
thread). Without a sink (a JSON invocation) the same code runs: `ctx.stream` still yields
tokens, `ctx.emit` does nothing. `ctx.tools.call("llm.generate", ...)` never streams.

Step cache
----------
`run_workflow(..., cache=StepCache)` looks every cacheable step up before running it (see
`plnt.runner.cache`); the per-invocation hits and misses and the cached step ids are in the
result. The output step of a streaming invocation is never looked up nor stored.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from plnt.core import telemetry
from plnt.core.specs.models import Step, Workflow, output_step, step_levels
from plnt.runner.adapters import SHADOW_RUN, RuntimeAdapter
from plnt.runner.cache import MISSING, StepCache, cache_key, is_cacheable
from plnt.runner.recipe import Recipe
from plnt.runner.tools import RENDERED_PARAMS, MissingField, Tools, template_fields

TokenCallback = Callable[[str, str], None]
"""`callback(step_id, text)`: receives the output step's tokens of a streaming invocation."""


class StepFailed(Exception):
    """A step raised: `step` is its id, `cause` the original exception."""

    def __init__(self, step: str, cause: BaseException) -> None:
        self.step = step
        self.cause = cause
        self.message = f"{type(cause).__name__}: {cause}"
        super().__init__(f"step {step!r} failed: {self.message}")


class InvalidInput(Exception):
    """The invocation's inputs do not fit the workflow: `field` is missing (a client mistake, 422)."""

    def __init__(self, field: str, message: str, step: str | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.step = step


def required_inputs(recipe: Recipe) -> tuple[str, ...]:
    """The inputs the workflow's templates name: every `{placeholder}` in a param that a step's
    default tool binding renders, other than a step id. Steps implemented by the recipe module
    are left out: what their code reads is not declared."""
    step_ids = {step.id for step in recipe.workflow.steps}
    names: list[str] = []
    for step in recipe.workflow.steps:
        if recipe.module is not None and callable(getattr(recipe.module, step.id, None)):
            continue
        for key in RENDERED_PARAMS.get(step.tool, ()):
            template = step.params.get(key)
            if isinstance(template, str):
                names.extend(n for n in template_fields(template) if n not in step_ids and n not in names)
    return tuple(names)


def check_inputs(required: tuple[str, ...], inputs: Mapping[str, Any]) -> None:
    """Raise InvalidInput naming the first required input missing from `inputs` (and all of them)."""
    missing = [name for name in required if name not in inputs]
    if missing:
        more = f" (missing: {', '.join(missing)})" if len(missing) > 1 else ""
        raise InvalidInput(missing[0], f"missing input {missing[0]!r}: the workflow's steps use {{{missing[0]}}}; "
                                       f"send it as a field of the JSON body{more}")


class TokenSink:
    """Sends one step's tokens to the invocation's callback; callable from any thread.

    Created on the event loop; a call from another thread (a sync step in its worker thread)
    is handed to the loop, so the callback always runs on the loop thread and in order."""

    def __init__(self, step_id: str, callback: TokenCallback) -> None:
        self.step_id = step_id
        self._callback = callback
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()

    def __call__(self, text: str) -> None:
        if not text:
            return
        if threading.get_ident() == self._thread:
            self._callback(self.step_id, text)
        else:
            self._loop.call_soon_threadsafe(self._callback, self.step_id, text)


@dataclass(frozen=True)
class StepContext:
    """What a step sees: the invocation inputs, the results of all finished steps (by id),
    its own params, the tool bindings, the adapter, and the recipe (workflow, directory).

    `sink` is set only for the output step of a streaming invocation (see the module doc)."""

    step_id: str
    inputs: Mapping[str, Any]
    results: Mapping[str, Any]
    params: Mapping[str, Any]
    tools: Tools
    adapter: RuntimeAdapter
    directory: Path
    workflow: Workflow
    sink: TokenSink | None = None

    @property
    def streaming(self) -> bool:
        """True when a client receives this step's tokens as they are produced."""
        return self.sink is not None

    def render(self, template: str) -> str:
        """Fill `{placeholders}` from the inputs and finished results (as the tools do)."""
        return self.tools.render(template)

    def stream(self, tool: str = "llm.generate", **params: Any) -> AsyncIterator[str]:
        """Yield the tool's completion token by token, sending each to the sink too."""
        return self.tools.stream(tool, **params)

    def emit(self, text: str) -> None:
        """Send `text` to the streaming client (nothing without one)."""
        if self.sink is not None:
            self.sink(text)


@dataclass
class WorkflowResult:
    output: Any
    timings_ms: dict[str, float] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    total_ms: float = 0.0
    cached: set[str] = field(default_factory=set)  # steps answered from the step cache
    cache_hits: int = 0
    cache_misses: int = 0


@dataclass
class _Invocation:
    recipe: Recipe
    inputs: Mapping[str, Any]
    adapter: RuntimeAdapter
    output_id: str
    callback: TokenCallback | None
    cache: StepCache | None
    max_tokens: int | None
    hits: int = 0
    misses: int = 0


async def _drain(iterator: Any, sink: TokenSink | None) -> str:
    """Consume an async iterator a step returned: each item to the sink, the result is the text."""
    parts: list[str] = []
    async for item in iterator:
        text = "" if item is None else str(item)
        if text:
            parts.append(text)
            if sink is not None:
                sink(text)
    return "".join(parts)


async def _execute(step: Step, ctx: StepContext, function: Any) -> Any:
    if callable(function):
        if inspect.isasyncgenfunction(function):
            value = function(ctx)
        elif inspect.iscoroutinefunction(function):
            value = await function(ctx)
        else:
            value = await asyncio.to_thread(function, ctx)
        if inspect.isawaitable(value):
            value = await value
        if hasattr(value, "__anext__"):
            value = await _drain(value, ctx.sink)
        return value
    if step.tool == "python":
        raise LookupError(f"tool python needs a function {step.id}(ctx) in the recipe module")
    if ctx.sink is not None and step.tool == "llm.generate":
        return "".join([token async for token in ctx.tools.stream(step.tool)])
    return await ctx.tools.call(step.tool)


async def _skipped() -> tuple[Any, float, bool]:
    """A side-effecting step of a shadow run: not run."""
    return None, 0.0, False


async def _run_step(run: _Invocation, step: Step, results: Mapping[str, Any]) -> tuple[Any, float, bool]:
    """(result, milliseconds, answered from the cache); a span of its own when tracing is on."""
    if not telemetry.ENABLED:
        return await _step(run, step, results)
    with telemetry.span(f"step {step.id}", {"plnt.step": step.id, "plnt.step.tool": step.tool}) as span:
        value, ms, hit = await _step(run, step, results)
        span.set_attribute("plnt.step.cached", hit)
        return value, ms, hit


async def _step(run: _Invocation, step: Step, results: Mapping[str, Any]) -> tuple[Any, float, bool]:
    started = time.perf_counter()
    recipe = run.recipe
    is_output = step.id == run.output_id
    sink = TokenSink(step.id, run.callback) if (is_output and run.callback is not None) else None
    key = None
    if run.cache is not None and run.cache.enabled and sink is None and is_cacheable(step):
        deps = {dep: results[dep] for dep in step.deps if dep in results}
        key = cache_key(recipe.digest, step.id, run.inputs, deps, run.max_tokens if is_output else None)
        if key is not None:
            value = run.cache.get(key)
            if value is not MISSING:
                run.hits += 1
                return value, (time.perf_counter() - started) * 1000, True
            run.misses += 1
    tools = Tools(
        run.adapter,
        recipe.directory,
        MappingProxyType({**run.inputs, **results}),
        digest=recipe.digest,
        step_tool=step.tool,
        step_params=step.params,
        deps=step.deps,
        sink=sink,
        max_tokens_cap=run.max_tokens if is_output else None,
    )
    ctx = StepContext(
        step.id, run.inputs, results, MappingProxyType(dict(step.params)), tools, run.adapter, recipe.directory,
        recipe.workflow, sink,
    )
    function = getattr(recipe.module, step.id, None) if recipe.module is not None else None
    try:
        value = await _execute(step, ctx, function)
    except MissingField as exc:
        # A template names something that is neither a step nor among the inputs: the
        # client's body lacks it (a recipe's own mistakes name step ids and stay step_failed).
        if any(exc.field == other.id for other in recipe.workflow.steps):
            raise StepFailed(step.id, exc) from exc
        raise InvalidInput(exc.field, f"missing input {exc.field!r}: step {step.id!r} uses {{{exc.field}}}; "
                                      "send it as a field of the JSON body", step.id) from exc
    except Exception as exc:  # not CancelledError: a cancelled sibling is not a failure
        raise StepFailed(step.id, exc) from exc
    if key is not None and run.cache is not None:
        run.cache.put(key, value)
    return value, (time.perf_counter() - started) * 1000, False


async def run_workflow(
    recipe: Recipe,
    inputs: dict[str, Any],
    adapter: RuntimeAdapter,
    *,
    sink: TokenCallback | None = None,
    cache: StepCache | None = None,
    max_tokens: int | None = None,
    shadow: bool = False,
) -> WorkflowResult:
    """Run every step of `recipe` on `inputs`; returns the output step's result and timings.

    `sink(step_id, text)` receives the output step's tokens (a streaming invocation);
    `cache` is the runner's step cache; `max_tokens` caps the output step's `llm.generate`
    calls (a chat client's max_tokens); `shadow`: a mirrored request whose answer nobody reads,
    so a step declared `sideEffects` is not run (its result is None)."""
    started = time.perf_counter()
    steps = {step.id: step for step in recipe.workflow.steps}
    run = _Invocation(recipe, MappingProxyType(dict(inputs)), adapter, output_step(recipe.workflow), sink, cache, max_tokens)
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    cached: set[str] = set()
    # The steps' LLM calls say whether this is a mirror (adapters.SHADOW_RUN): the gateway does not mirror
    # a mirror's calls again. Their tasks copy this context; reset after, for the caller's next run.
    shadow_run = SHADOW_RUN.set(shadow)
    try:
        for level in step_levels(recipe.workflow.steps):
            finished = MappingProxyType(dict(results))
            tasks = [asyncio.ensure_future(_skipped() if shadow and steps[step_id].side_effects
                                           else _run_step(run, steps[step_id], finished)) for step_id in level]
            try:
                outcomes = await asyncio.gather(*tasks)
            except BaseException:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                raise
            for step_id, (value, ms, hit) in zip(level, outcomes, strict=True):
                results[step_id] = value
                timings[step_id] = round(ms, 3)
                if hit:
                    cached.add(step_id)
    finally:
        SHADOW_RUN.reset(shadow_run)
    return WorkflowResult(
        output=results[run.output_id],
        timings_ms=timings,
        results=results,
        total_ms=round((time.perf_counter() - started) * 1000, 3),
        cached=cached,
        cache_hits=run.hits,
        cache_misses=run.misses,
    )
