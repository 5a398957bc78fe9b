"""Smoke test of a canary: N invocations straight to the canary's endpoint, judged against budgets.

`measure` does the I/O; `summarise` and `judge` are pure and table-tested.
Inputs come from the recipe's golden cases (round robin), or `{}` when it has none.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
from plnt.core import telemetry
from plnt.core.specs.models import SmokeTest
from plnt.core.upstream import UpstreamClient, UpstreamError
from plnt.reconciler.tls_context import default_tls_context
from pydantic import BaseModel, ConfigDict


class Sample(BaseModel):
    model_config = ConfigDict(frozen=True)

    latency_ms: float
    ok: bool
    error: str | None = None
    ttft_ms: float | None = None   # streamed: time to the first token (or to the result if none came)
    tpot_ms: float | None = None   # streamed: mean time per output token after the first


class SmokeMetrics(BaseModel):
    model_config = ConfigDict(frozen=True)

    invocations: int
    errors: int
    error_percent: float
    p50_ms: float
    p95_ms: float
    max_ms: float
    first_error: str | None = None
    ttft_p95_ms: float | None = None
    tpot_p95_ms: float | None = None


class SmokeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    passed: bool
    reason: str
    metrics: SmokeMetrics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarise(samples: Sequence[Sample]) -> SmokeMetrics:
    latencies = [s.latency_ms for s in samples]
    errors = [s for s in samples if not s.ok]
    ttfts = [s.ttft_ms for s in samples if s.ok and s.ttft_ms is not None]
    tpots = [s.tpot_ms for s in samples if s.ok and s.tpot_ms is not None]
    return SmokeMetrics(
        invocations=len(samples),
        errors=len(errors),
        error_percent=round(100 * len(errors) / len(samples), 2) if samples else 100.0,
        p50_ms=round(percentile(latencies, 50), 2),
        p95_ms=round(percentile(latencies, 95), 2),
        max_ms=round(max(latencies, default=0.0), 2),
        first_error=errors[0].error if errors else None,
        ttft_p95_ms=round(percentile(ttfts, 95), 2) if ttfts else None,
        tpot_p95_ms=round(percentile(tpots, 95), 2) if tpots else None,
    )


def judge(metrics: SmokeMetrics, budget: SmokeTest) -> SmokeResult:
    """Pass only if every budget holds; the reason names each budget that did not."""
    failures = []
    if metrics.error_percent > budget.error_budget_percent:
        detail = f" (first: {metrics.first_error})" if metrics.first_error else ""
        failures.append(
            f"error rate {metrics.error_percent:g}% over budget {budget.error_budget_percent:g}% "
            f"({metrics.errors}/{metrics.invocations} failed{detail})"
        )
    if metrics.p95_ms > budget.p95_budget_ms:
        failures.append(f"p95 latency {metrics.p95_ms:g} ms over budget {budget.p95_budget_ms:g} ms")
    if budget.ttft_budget_ms is not None and metrics.ttft_p95_ms is not None and metrics.ttft_p95_ms > budget.ttft_budget_ms:
        failures.append(f"TTFT p95 {metrics.ttft_p95_ms:g} ms over budget {budget.ttft_budget_ms:g} ms")
    if budget.tpot_budget_ms is not None and metrics.tpot_p95_ms is not None and metrics.tpot_p95_ms > budget.tpot_budget_ms:
        failures.append(f"TPOT p95 {metrics.tpot_p95_ms:g} ms over budget {budget.tpot_budget_ms:g} ms")
    if failures:
        return SmokeResult(passed=False, reason="smoke test failed: " + "; ".join(failures), metrics=metrics)
    tokens = "".join(f", {name} p95 {value:g} ms (budget {limit:g})" for name, value, limit in (
        ("TTFT", metrics.ttft_p95_ms, budget.ttft_budget_ms), ("TPOT", metrics.tpot_p95_ms, budget.tpot_budget_ms))
        if value is not None and limit is not None)
    return SmokeResult(
        passed=True,
        reason=(f"smoke test passed: {metrics.invocations} invocations, p95 {metrics.p95_ms:g} ms "
                f"(budget {budget.p95_budget_ms:g}){tokens}, errors {metrics.error_percent:g}% "
                f"(budget {budget.error_budget_percent:g}%)"),
        metrics=metrics,
    )


async def measure(
    endpoint: str,
    inputs: Sequence[dict[str, Any]],
    *,
    invocations: int,
    concurrency: int,
    timeout_s: float,
    stream: bool = False,
    samples: list[Sample] | None = None,
    protocol: Literal["runner", "openai-chat"] = "runner",
) -> list[Sample]:
    """Invoke the canary `invocations` times; each sample is appended to `samples` (a list the caller
    may read while this runs, for live progress) as it completes.

    `protocol`: a plnt runner (`POST /invoke`), or a model server speaking the OpenAI API (`POST
    /v1/chat/completions`, each input a chat request; always streamed, so that real tokens are timed)."""
    payloads = list(inputs) or [{}]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(invocations):
        queue.put_nowait(index)
    samples = [] if samples is None else samples

    async def worker(invoke: Callable[[dict[str, Any]], Awaitable[Sample]]) -> None:
        while not queue.empty():
            index = queue.get_nowait()
            samples.append(await invoke(payloads[index % len(payloads)]))

    workers = min(concurrency, invocations)
    # Tracing on: each smoke call continues the smoke_test activity's span, so the canary's runner
    # spans sit in the rollout's trace.
    trace = telemetry.inject({}) if telemetry.ENABLED else {}
    if not stream and protocol == "runner" and urlsplit(endpoint).scheme == "http":
        # A local runner (or a pod's plain-HTTP port): the gateway's own client for its runner hop,
        # a tenth of httpx's CPU per request; at 1,000 WorkflowRuns the smoke tests' httpx calls
        # were 14 % of plnt's event loop (bench/many_workflowruns.py, py-spy).
        upstream = UpstreamClient(read_timeout_s=timeout_s, connect_timeout_s=min(timeout_s, 5.0))
        try:
            await asyncio.gather(*(worker(lambda payload: _invoke_upstream(upstream, endpoint, payload, trace))
                                   for _ in range(workers)))
        finally:
            await upstream.aclose()
        return samples
    async with httpx.AsyncClient(trust_env=False, timeout=timeout_s, verify=default_tls_context()) as client:
        invoke = _invoke_chat if protocol == "openai-chat" else _invoke_streaming if stream else _invoke
        await asyncio.gather(*(worker(lambda payload: invoke(client, endpoint, payload, trace)) for _ in range(workers)))
    return samples


def progress_of(samples: Sequence[Sample], invocations: int) -> dict[str, Any]:
    """A running smoke test's numbers so far (heartbeat details; the status's smokeProgress)."""
    done = list(samples)  # a snapshot: the measuring task appends meanwhile
    progress: dict[str, Any] = {"done": len(done), "of": invocations}
    if done:
        progress["metrics"] = summarise(done).model_dump(mode="json")
    return progress


async def _invoke(client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any], trace: dict[str, str]) -> Sample:
    started = time.perf_counter()
    try:
        response = await client.post(f"{endpoint}/invoke", json=payload, headers=trace)
    except httpx.HTTPError as exc:
        return Sample(latency_ms=(time.perf_counter() - started) * 1000, ok=False, error=f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    if response.status_code != 200:
        try:
            message = response.json().get("error", {}).get("message", "")
        except ValueError:
            message = response.text[:200]
        return Sample(latency_ms=latency, ok=False, error=f"HTTP {response.status_code}: {message}"[:300])
    return Sample(latency_ms=latency, ok=True)


async def _invoke_upstream(client: UpstreamClient, endpoint: str, payload: dict[str, Any],
                           trace: dict[str, str]) -> Sample:
    started = time.perf_counter()
    try:
        response = await client.request(endpoint, "POST", "/invoke", body=json.dumps(payload).encode(),
                                        headers=(("content-type", "application/json"), *trace.items()))
    except UpstreamError as exc:
        return Sample(latency_ms=(time.perf_counter() - started) * 1000, ok=False, error=f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    if response.status != 200:
        try:
            message = json.loads(response.body).get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            message = response.body[:200].decode(errors="replace")
        return Sample(latency_ms=latency, ok=False, error=f"HTTP {response.status}: {message}"[:300])
    return Sample(latency_ms=latency, ok=True)


async def _invoke_streaming(client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any],
                            trace: dict[str, str]) -> Sample:
    """One invocation as SSE (`event: token` ... `event: result` | `event: error`), timing the tokens."""
    started = time.perf_counter()
    token_times: list[float] = []
    event, outcome, error = "", None, None
    try:
        async with client.stream("POST", f"{endpoint}/invoke", json=payload,
                                 headers={"accept": "text/event-stream", **trace}) as response:
            if response.status_code != 200:
                return await _http_failure(response, started)
            async for line in response.aiter_lines():
                if line.startswith("event:"):
                    event = line.removeprefix("event:").strip()
                elif line.startswith("data:"):
                    if event == "token":
                        token_times.append(time.perf_counter())
                    elif event in ("result", "error"):
                        outcome = event
                        if event == "error":
                            error = line.removeprefix("data:").strip()[:300]
                        if not token_times:
                            token_times.append(time.perf_counter())  # no tokens: the result is the first byte
    except httpx.HTTPError as exc:
        return Sample(latency_ms=(time.perf_counter() - started) * 1000, ok=False, error=f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    if outcome != "result":
        return Sample(latency_ms=latency, ok=False, error=f"stream error: {error or 'ended without a result'}")
    return _timed(latency, started, token_times)


async def _invoke_chat(client: httpx.AsyncClient, endpoint: str, payload: dict[str, Any], trace: dict[str, str]) -> Sample:
    """One streamed chat completion from an OpenAI-compatible model server: `data: {chunk}` lines up
    to `data: [DONE]`; a chunk whose delta carries content is a token (llama.cpp, vLLM and TGI send
    one per token)."""
    started = time.perf_counter()
    token_times: list[float] = []
    done, error = False, None
    try:
        async with client.stream("POST", f"{endpoint}/v1/chat/completions", json={**payload, "stream": True},
                                 headers={"accept": "text/event-stream", **trace}) as response:
            if response.status_code != 200:
                return await _http_failure(response, started)
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line.removeprefix("data:").strip()
                if data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(data)
                except ValueError:
                    error = f"not a JSON chunk: {data[:100]}"
                    break
                if isinstance(chunk, dict) and chunk.get("error"):
                    error = json.dumps(chunk["error"])[:300]
                    break
                choices = chunk.get("choices") if isinstance(chunk, dict) else None
                delta = (choices[0].get("delta") or {}) if isinstance(choices, list) and choices else {}
                if isinstance(delta, dict) and delta.get("content"):
                    token_times.append(time.perf_counter())
    except httpx.HTTPError as exc:
        return Sample(latency_ms=(time.perf_counter() - started) * 1000, ok=False, error=f"{type(exc).__name__}: {exc}")
    latency = (time.perf_counter() - started) * 1000
    if not done or not token_times:
        return Sample(latency_ms=latency, ok=False,
                      error=f"stream error: {error or ('ended before [DONE]' if not done else 'no token generated')}")
    return _timed(latency, started, token_times)


async def _http_failure(response: httpx.Response, started: float) -> Sample:
    body = (await response.aread()).decode(errors="replace")[:200]
    return Sample(latency_ms=(time.perf_counter() - started) * 1000, ok=False, error=f"HTTP {response.status_code}: {body}")


def _timed(latency_ms: float, started: float, token_times: list[float]) -> Sample:
    """A streamed answer: TTFT to the first token, TPOT the mean gap between the tokens after it."""
    ttft = (token_times[0] - started) * 1000 if token_times else None
    tpot = ((token_times[-1] - token_times[0]) * 1000 / (len(token_times) - 1)) if len(token_times) > 1 else None
    return Sample(latency_ms=latency_ms, ok=True, ttft_ms=ttft, tpot_ms=tpot)
