"""Smoke-test judgement: pure functions, table-tested; and `measure` over real HTTP."""

from __future__ import annotations

import pytest
from plnt.core.server import GatewayServer
from plnt.core.specs.models import SmokeTest
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.saga.smoke import Sample, SmokeMetrics, judge, measure, percentile, summarise

from tests.gateway.fakes import FakeRunner


@pytest.mark.parametrize(("values", "q", "expected"), [
    ([], 95, 0.0), ([5.0], 95, 5.0), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 95, 10), ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 50, 5),
    (list(range(1, 101)), 95, 95), ([10, 1, 5], 50, 5),
])
def test_percentile_is_nearest_rank(values: list[float], q: float, expected: float) -> None:
    assert percentile(values, q) == expected


def test_summarise_streaming_percentiles_ignore_failed_samples() -> None:
    samples = [Sample(latency_ms=100, ok=True, ttft_ms=float(i), tpot_ms=10.0) for i in range(1, 21)]
    samples.append(Sample(latency_ms=5, ok=False, ttft_ms=9999.0, error="boom"))
    metrics = summarise(samples)
    assert metrics.ttft_p95_ms == 19 and metrics.tpot_p95_ms == 10
    assert summarise([Sample(latency_ms=1, ok=True)]).ttft_p95_ms is None


def test_summarise_counts_errors_and_keeps_the_first() -> None:
    samples = [Sample(latency_ms=10, ok=True)] * 8 + [Sample(latency_ms=50, ok=False, error="HTTP 500: boom"),
                                                       Sample(latency_ms=70, ok=False, error="later")]
    metrics = summarise(samples)
    assert (metrics.invocations, metrics.errors, metrics.error_percent) == (10, 2, 20.0)
    assert metrics.p95_ms == 70 and metrics.p50_ms == 10 and metrics.first_error == "HTTP 500: boom"


def metrics(p95: float = 100, errors: int = 0, n: int = 100) -> SmokeMetrics:
    return SmokeMetrics(invocations=n, errors=errors, error_percent=100 * errors / n, p50_ms=p95 / 2, p95_ms=p95, max_ms=p95)


@pytest.mark.parametrize(("m", "budget", "passed", "reason_parts"), [
    (metrics(), SmokeTest(), True, ["passed", "p95 100 ms"]),
    (metrics(p95=2500), SmokeTest(), True, ["passed"]),                          # at the budget passes
    (metrics(p95=2501), SmokeTest(), False, ["p95 latency 2501 ms over budget 2500 ms"]),
    (metrics(errors=1), SmokeTest(), True, ["passed"]),                          # 1% of 100 is within 1%
    (metrics(errors=2), SmokeTest(), False, ["error rate 2% over budget 1%", "2/100 failed"]),
    (metrics(errors=1), SmokeTest(error_budget_percent=0), False, ["error rate 1% over budget 0%"]),
    (metrics(p95=900, errors=50), SmokeTest(p95_budget_ms=300), False, ["error rate", "p95 latency"]),
    (metrics().model_copy(update={"ttft_p95_ms": 900.0}), SmokeTest(ttft_budget_ms=300), False, ["TTFT p95 900 ms over budget 300 ms"]),
    (metrics().model_copy(update={"ttft_p95_ms": 200.0}), SmokeTest(ttft_budget_ms=300), True, ["passed"]),
    (metrics().model_copy(update={"tpot_p95_ms": 80.0}), SmokeTest(tpot_budget_ms=50), False, ["TPOT p95 80 ms over budget 50 ms"]),
    (metrics(), SmokeTest(ttft_budget_ms=1), True, ["passed"]),  # nothing streamed: no TTFT to judge
], ids=["fast", "at-budget", "slow", "errors-within", "errors-over", "zero-budget", "both",
        "ttft-over", "ttft-within", "tpot-over", "not-streamed"])
def test_judge_names_every_budget_missed(m: SmokeMetrics, budget: SmokeTest, passed: bool, reason_parts: list[str]) -> None:
    result = judge(m, budget)
    assert result.passed is passed
    for part in reason_parts:
        assert part in result.reason


def test_progress_of_a_running_smoke_test() -> None:
    from plnt.reconciler.saga.smoke import Sample, progress_of
    from plnt.reconciler.saga.smoke_progress import progress_from

    assert progress_of([], 10) == {"done": 0, "of": 10}
    samples = [Sample(latency_ms=ms, ok=ms < 100, error=None if ms < 100 else "HTTP 500") for ms in (10, 20, 30, 400)]
    progress = progress_of(samples, 10)
    assert (progress["done"], progress["of"]) == (4, 10)
    assert progress["metrics"]["errors"] == 1 and progress["metrics"]["error_percent"] == 25.0
    assert progress["metrics"]["max_ms"] == 400
    # What the reconciler reads back from the heartbeat details: the newest, and only a progress record.
    assert progress_from([{"done": 1, "of": 10}, progress]) == progress
    assert progress_from([]) is None and progress_from([7]) is None and progress_from([{"done": "x", "of": 1}]) is None


@pytest.mark.integration
async def test_measure_over_http_counts_answers_errors_and_an_unreachable_runner() -> None:
    """Real HTTP to a STAND-IN runner (tests/gateway/fakes.py FakeRunner served by uvicorn): the
    plain-HTTP path (the gateway's upstream client) sends each input and reads each answer."""
    runner = FakeRunner("1.0.0", workflow="review-responder")
    server = GatewayServer(runner.app(), "127.0.0.1", 0)
    await server.start()
    try:
        inputs = [{"review": "one"}, {"review": "two"}]
        samples = await measure(server.url, inputs, invocations=6, concurrency=3, timeout_s=5)
        assert len(samples) == 6 and all(s.ok and s.latency_ms > 0 for s in samples), samples
        assert sorted(r["body"]["review"] for r in runner.requests) == ["one"] * 3 + ["two"] * 3
        assert all(r["headers"]["content-type"] == "application/json" for r in runner.requests)

        runner.fail_status = 500
        failed = await measure(server.url, inputs, invocations=2, concurrency=1, timeout_s=5)
        assert [s.error for s in failed] == ["HTTP 500: told to fail with 500"] * 2

        runner.fail_status, runner.delay_s = None, 2.0
        slow = await measure(server.url, inputs, invocations=1, concurrency=1, timeout_s=0.3)
        assert not slow[0].ok and slow[0].error.startswith("UpstreamTimeout"), slow
    finally:
        await server.stop()
    gone = await measure(f"http://127.0.0.1:{free_port()}", [], invocations=2, concurrency=2, timeout_s=2)
    assert all(not s.ok and s.error.startswith("UpstreamConnectError") for s in gone), gone


def stand_in_model_server(tokens: list[str], gap_s: float, *, first_after_s: float = 0.0,
                          fail: str | None = None) -> object:
    """A STAND-IN OpenAI-compatible model server (an ASGI app): streams `tokens` as chat chunks,
    `gap_s` apart after `first_after_s`, then `data: [DONE]`; `fail` ends the stream with an error
    chunk after the first token instead. What it was asked is kept in `.requests`."""
    import asyncio
    import json

    requests: list[dict] = []

    async def app(scope: dict, receive: object, send: object) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()  # type: ignore[operator]
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        requests.append({"path": scope["path"], "body": json.loads(body)})
        await send({"type": "http.response.start", "status": 200,  # type: ignore[operator]
                    "headers": [(b"content-type", b"text/event-stream")]})
        await asyncio.sleep(first_after_s)
        for index, token in enumerate(tokens):
            if index:
                await asyncio.sleep(gap_s)
            chunk = {"choices": [{"index": 0, "delta": {"content": token}}]}
            await send({"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(),  # type: ignore[operator]
                        "more_body": True})
            if fail:
                await send({"type": "http.response.body",  # type: ignore[operator]
                            "body": f"data: {json.dumps({'error': {'message': fail}})}\n\n".encode(), "more_body": True})
                break
        else:
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    app.requests = requests  # type: ignore[attr-defined]
    return app


@pytest.mark.integration
async def test_a_model_server_is_timed_on_its_streamed_tokens() -> None:
    """Real HTTP to a STAND-IN OpenAI-compatible model server: TTFT is the time to the first token,
    TPOT the mean gap between tokens after it; the request is streamed whatever it says."""
    app = stand_in_model_server(["Hel", "lo", " there", "!"], gap_s=0.05, first_after_s=0.2)
    server = GatewayServer(app, "127.0.0.1", 0)  # type: ignore[arg-type]
    await server.start()
    try:
        chat = {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": False}
        (sample,) = await measure(server.url, [chat], invocations=1, concurrency=1, timeout_s=5, protocol="openai-chat")
        assert sample.ok, sample
        assert 190 <= sample.ttft_ms < sample.latency_ms, sample  # the first token, not the response headers
        assert sample.tpot_ms is not None and 40 <= sample.tpot_ms < 200, sample
        (asked,) = app.requests  # type: ignore[attr-defined]
        assert asked["path"] == "/v1/chat/completions" and asked["body"]["stream"] is True
    finally:
        await server.stop()
    broken = GatewayServer(stand_in_model_server(["a", "b"], 0.0, fail="out of memory"), "127.0.0.1", 0)  # type: ignore[arg-type]
    await broken.start()
    try:
        (sample,) = await measure(broken.url, [{}], invocations=1, concurrency=1, timeout_s=5, protocol="openai-chat")
        assert not sample.ok and "out of memory" in (sample.error or ""), sample
    finally:
        await broken.stop()
    summary = judge(summarise([Sample(latency_ms=900, ok=True, ttft_ms=800, tpot_ms=30)]),
                    SmokeTest(p95_budget_ms=2000, ttft_budget_ms=500, tpot_budget_ms=50))
    assert not summary.passed and "TTFT p95 800 ms over budget 500 ms" in summary.reason


def test_a_pass_names_the_token_budgets_it_met_and_only_those() -> None:
    timed = SmokeMetrics(invocations=5, errors=0, error_percent=0, p50_ms=300, p95_ms=400, max_ms=410,
                         ttft_p95_ms=55.5, tpot_p95_ms=29.5)
    both = judge(timed, SmokeTest(ttft_budget_ms=2000, tpot_budget_ms=500))
    assert both.passed and "TTFT p95 55.5 ms (budget 2000), TPOT p95 29.5 ms (budget 500)" in both.reason
    only_ttft = judge(timed, SmokeTest(ttft_budget_ms=2000))
    assert "TTFT p95 55.5 ms" in only_ttft.reason and "TPOT" not in only_ttft.reason
    assert "TTFT" not in judge(timed, SmokeTest()).reason
