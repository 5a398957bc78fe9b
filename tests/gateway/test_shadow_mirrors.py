"""canary.shadowPercent beyond plain invocations: streamed invocations and OpenAI chat completions
(a ModelDeployment's, and a workflow's) mirrored to the canary, their answers discarded, recorded as
track "shadow"; a request marked X-Plnt-Shadow is not mirrored again; at most MAX_SHADOWS in flight.

Stand-ins: fake runners (tests/gateway/fakes.py) for runner releases, and the OpenAI test peer
(tests/openai_peer.py) for a model's two releases (a llama.cpp server each in production). The
gateway is the real one."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from plnt.core.routes import Backend, Route, RouteTable
from plnt.gateway.forward import MAX_SHADOWS
from plnt.gateway.router import Router

from tests.gateway.conftest import Gateway, StartGateway, StartServer, backend
from tests.gateway.fakes import FakeRunner
from tests.openai_peer import Behaviour, OpenAIPeer


async def until(check: Callable[[], Awaitable[Any]], what: str, timeout_s: float = 15.0) -> Any:
    """`check()`'s first truthy value, polled; fails naming `what` after `timeout_s`."""
    async with asyncio.timeout(timeout_s):
        while not (value := await check()):
            await asyncio.sleep(0.02)
    assert value, what
    return value


async def shadow_calls(gw: Gateway, n: int) -> list[dict[str, Any]]:
    """The gateway's shadow calls once there are `n` of them (a mirror is recorded when its answer ended)."""
    async def enough() -> list[dict[str, Any]] | None:
        calls = (await gw.client.get("/calls", params={"limit": 1000})).json()
        mirrored = [c for c in calls if c["track"] == "shadow"]
        return mirrored if len(mirrored) >= n else None

    return await until(enough, f"{n} shadow calls")


def model_route(stable: OpenAIPeer, canary: OpenAIPeer, shadow_percent: int = 100) -> Route:
    """A ModelDeployment's route as plnt builds it for a canary at 0% with a shadow share."""
    return Route(namespace="default", name="smollm2", stable=Backend(stable.url, "1.0.0", "rel-1.0.0"),
                 canary=Backend(canary.url, "1.0.1", "rel-1.0.1"), traffic_percent=0,
                 shadow_percent=shadow_percent, protocol="openai")


def chat(i: int, stream: bool = False) -> dict[str, Any]:
    return {"model": "smollm2", "stream": stream, "messages": [{"role": "user", "content": f"question {i}"}]}


def streamed_text(body: str) -> str:
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]", events[-3:]
    return "".join(json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1])


async def test_streamed_invocations_are_mirrored_and_the_canary_stream_read_to_its_end(
        start_server: StartServer, start_gateway: StartGateway) -> None:
    """Accept: text/event-stream: every caller's stream comes from the stable; the canary gets the same
    requests marked X-Plnt-Shadow, streamed, and each of its streams is read to its end before the
    mirror is recorded (with its time to first token). Fake runners stand in for the releases."""
    stable, canary = FakeRunner("v1"), FakeRunner("v2", token_delay_s=0.02)
    v1, v2 = await start_server(stable.app()), await start_server(canary.app())
    mirrored = Route(namespace="default", name="assistant", stable=backend(v1, "v1"), canary=backend(v2, "v2"),
                     traffic_percent=0, shadow_percent=100)
    gw = await start_gateway(Router(RouteTable([mirrored])))
    for i in range(6):
        async with gw.client.stream("POST", "/workflows/assistant/invoke", json={"i": i},
                                    headers={"accept": "text/event-stream"}) as answer:
            body = (await answer.aread()).decode()
        assert (answer.status_code, answer.headers["x-plnt-version"], answer.headers["x-plnt-track"]) == \
            (200, "v1", "stable")
        assert "event: result" in body and '"version":"v2"' not in body
    calls = await shadow_calls(gw, 6)
    assert {(c["api"], c["version"], c["code"], c["errorType"]) for c in calls} == {("invoke", "v2", 200, None)}
    assert len(canary.requests) == 6 and {r["headers"].get("x-plnt-shadow") for r in canary.requests} == {"1"}
    assert {r["headers"].get("accept") for r in canary.requests} == {"text/event-stream"}
    assert len(canary.stream_finished) == 6 and not canary.stream_cancelled, "each mirror read its stream to the end"
    # Three tokens 20 ms apart: a mirror recorded before the end of its stream would be faster.
    assert min(c["latencyMs"] for c in calls) >= 60, calls
    metrics = (await gw.client.get("/metrics")).text
    assert 'plnt_gateway_ttft_seconds_count{api="invoke",namespace="default",track="shadow",version="v2",' \
           'workflow="assistant"} 6.0' in metrics


async def test_a_models_chat_completions_are_mirrored_to_its_canary_and_never_answered_by_it(
        start_gateway: StartGateway) -> None:
    """A ModelDeployment canary at trafficPercent 0 with shadowPercent 100: every completion, streamed
    or not, is answered by the stable model server; the canary server gets the same body, marked
    X-Plnt-Shadow; the mirrors are chat calls on track "shadow" in /calls and the metrics. Two OpenAI
    test peers stand in for the two model servers."""
    with OpenAIPeer(Behaviour(reply="stable says hi")) as stable, \
            OpenAIPeer(Behaviour(reply="canary says hi", token_delay=0.01)) as canary:
        gw = await start_gateway(Router(RouteTable([model_route(stable, canary)])))
        for i in range(8):
            stream = i % 2 == 1
            answer = await gw.client.post("/v1/chat/completions", json=chat(i, stream))
            assert (answer.status_code, answer.headers["x-plnt-version"], answer.headers["x-plnt-track"]) == \
                (200, "1.0.0", "stable"), answer.text
            text = streamed_text(answer.text) if stream else answer.json()["choices"][0]["message"]["content"]
            assert text == "stable says hi"
        calls = await shadow_calls(gw, 8)
        assert {(c["api"], c["workflow"], c["version"], c["code"]) for c in calls} == {("chat", "smollm2", "1.0.1", 200)}
        received = canary.requests
        assert len(received) == 8 and {r.headers.get("x-plnt-shadow") for r in received} == {"1"}
        assert sorted(r.body for r in received) == sorted(r.body for r in stable.requests), "the body as sent"
        assert "x-plnt-shadow" not in stable.requests[0].headers
        live = (await gw.client.get("/calls", params={"limit": 100})).json()
        assert {c["track"] for c in live} == {"stable", "shadow"}, "no caller was answered by the canary"
        metrics = (await gw.client.get("/metrics")).text
        assert 'plnt_gateway_ttft_seconds_count{api="chat",namespace="default",track="shadow",version="1.0.1",' \
               'workflow="smollm2"} 4.0' in metrics, "the streamed mirrors' first tokens"
        # What the compare gate reads of a mirror: the streamed ones' tokens and time per token too.
        streamed = [c for c in calls if c["ttftMs"] is not None]
        assert len(streamed) == 4 and all(c["tokens"] == 3 and c["tpotMs"] is not None for c in streamed), streamed


async def test_a_mirrored_stream_is_recorded_only_once_the_canary_ended_it(start_gateway: StartGateway) -> None:
    """The canary's stream stalls after its first token: the caller has its whole answer from the stable
    meanwhile, and the mirror is recorded once the canary finished, not before. OpenAI test peers stand
    in for the model servers."""
    with OpenAIPeer(Behaviour(reply="stable says hi")) as stable, \
            OpenAIPeer(Behaviour(reply="canary says hi there", stall_after=1, hang_s=60)) as canary:
        gw = await start_gateway(Router(RouteTable([model_route(stable, canary)])))
        answer = await gw.client.post("/v1/chat/completions", json=chat(0, stream=True))
        assert streamed_text(answer.text) == "stable says hi"
        await until(lambda: asyncio.sleep(0, canary.requests), "the canary got the mirror")
        await asyncio.sleep(0.3)  # the first token is out; the rest is held
        calls = (await gw.client.get("/calls")).json()
        assert not [c for c in calls if c["track"] == "shadow"], "recorded before the canary's stream ended"
        canary.release_hangs()
        (mirror,) = await shadow_calls(gw, 1)
        assert mirror["code"] == 200 and mirror["errorType"] is None and mirror["latencyMs"] >= 300


async def test_a_request_marked_shadow_is_not_mirrored_again(start_gateway: StartGateway) -> None:
    """A runner's LLM call during a mirrored invocation carries X-Plnt-Shadow: 1 (runner/adapters.py):
    the gateway answers it from the stable as usual and does not mirror it to the model's canary.
    OpenAI test peers stand in for the model servers."""
    with OpenAIPeer() as stable, OpenAIPeer() as canary:
        gw = await start_gateway(Router(RouteTable([model_route(stable, canary)])))
        marked = await gw.client.post("/v1/chat/completions", json=chat(1), headers={"x-plnt-shadow": "1"})
        assert marked.status_code == 200 and marked.headers["x-plnt-version"] == "1.0.0"
        plain = await gw.client.post("/v1/chat/completions", json=chat(2))
        assert plain.status_code == 200
        await shadow_calls(gw, 1)
        assert [r.json["messages"][0]["content"] for r in canary.requests] == ["question 2"]


async def test_a_workflows_chat_completions_are_mirrored_as_runner_chats(
        start_server: StartServer, start_gateway: StartGateway) -> None:
    """A WorkflowRun served at /v1/chat/completions: the mirror is the runner's POST /chat, the body the
    stable got, marked X-Plnt-Shadow (so its sideEffects steps do not run). Fake runners stand in."""
    stable, canary = FakeRunner("v1"), FakeRunner("v2")
    v1, v2 = await start_server(stable.app()), await start_server(canary.app())
    gw = await start_gateway(Router(RouteTable([Route(
        namespace="default", name="assistant", stable=backend(v1, "v1"), canary=backend(v2, "v2"),
        traffic_percent=0, shadow_percent=100)])))
    for stream in (False, True):
        answer = await gw.client.post("/v1/chat/completions", json={**chat(0, stream), "model": "assistant"})
        assert answer.status_code == 200 and answer.headers["x-plnt-version"] == "v1", answer.text
    calls = await shadow_calls(gw, 2)
    assert {(c["api"], c["version"], c["code"]) for c in calls} == {("chat", "v2", 200)}
    assert [r["path"] for r in canary.requests] == ["/chat", "/chat"]
    assert [r["body"] for r in canary.requests] == [r["body"] for r in stable.requests]
    assert {r["headers"].get("x-plnt-shadow") for r in canary.requests} == {"1"}


async def test_mirrors_beyond_max_shadows_in_flight_are_skipped_not_queued(start_gateway: StartGateway) -> None:
    """The canary holds every answer: MAX_SHADOWS mirrors wait on it, the requests after them are
    answered by the stable and not mirrored, now or later. OpenAI test peers stand in."""
    with OpenAIPeer() as stable, OpenAIPeer(Behaviour(hang_s=60)) as canary:
        gw = await start_gateway(Router(RouteTable([model_route(stable, canary)])))
        extra = 8
        for i in range(MAX_SHADOWS + extra):
            answer = await gw.client.post("/v1/chat/completions", json=chat(i))
            assert answer.status_code == 200 and answer.headers["x-plnt-version"] == "1.0.0"
        await until(lambda: asyncio.sleep(0, len(canary.requests) == MAX_SHADOWS), "the mirrors reached the canary")
        await asyncio.sleep(0.5)  # the peer records a request before it starts to hold it: let the last ones hold
        canary.configure(hang_s=0).release_hangs()
        await shadow_calls(gw, MAX_SHADOWS)
        after = await gw.client.post("/v1/chat/completions", json=chat(99))  # in flight again: mirrored
        assert after.status_code == 200
        await shadow_calls(gw, MAX_SHADOWS + 1)
        assert [r.json["messages"][0]["content"] for r in canary.requests] == \
            [f"question {i}" for i in range(MAX_SHADOWS)] + ["question 99"], "the skipped ones never came"


async def test_no_shadow_share_no_mirror(start_gateway: StartGateway) -> None:
    """shadowPercent 0 (the default): a model's canary at 0% gets nothing at all. OpenAI test peers stand in."""
    with OpenAIPeer() as stable, OpenAIPeer() as canary:
        gw = await start_gateway(Router(RouteTable([model_route(stable, canary, shadow_percent=0)])))
        for i in range(5):
            assert (await gw.client.post("/v1/chat/completions", json=chat(i))).status_code == 200
        await asyncio.sleep(0.2)
        assert canary.requests == [] and len(stable.requests) == 5
        assert not [c for c in (await gw.client.get("/calls")).json() if c["track"] != "stable"]
