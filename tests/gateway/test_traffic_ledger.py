"""The compare gate's data path with real parts: a real `plnt gateway` role (GatewayRole) follows a real
control app (the same pieces `plnt reconcile` mounts: the route watch, the CallsHub and its ledger), relays
streamed chat to two model servers, records each call's TTFT, TPOT and completion tokens, pushes them
to the control app, and a worker's reader (ControlTraffic) gets the reading over HTTP with the internal
token; a wrong token and a control plane that is gone give the errors that say what happens next.

Stand-ins, declared: the two model servers are small Starlette apps streaming OpenAI chunks with a set
delay between tokens (the canary's slower per token), so the measured figures are known."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.traffic import TrafficLedger, TrafficReading
from plnt.gateway.app import create_app
from plnt.gateway.calls import CallsHub
from plnt.gateway.role import GatewayRole, GatewayRoleConfig
from plnt.gateway.route_watch import RoutePublisher, add_control_routes
from plnt.gateway.router import Router
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from plnt.reconciler.gates.compare import ControlTraffic
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route as HttpRoute

from tests.gateway.conftest import StartServer

TOKEN = "internal-token-for-the-ledger-test"


def model_server(first_s: float, per_token_s: float, tokens: int) -> Starlette:
    """A stand-in OpenAI-compatible server: a role chunk, then `tokens` content chunks, `per_token_s` apart."""

    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        return b"data: " + json.dumps({"object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": finish}]}).encode() + b"\n\n"

    async def completions(request: Request) -> StreamingResponse | JSONResponse:
        if not (await request.json()).get("stream"):
            return JSONResponse({"object": "chat.completion", "choices": [{"index": 0, "message": {
                "role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}})

        async def events() -> AsyncIterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})  # no token: not the first token
            await asyncio.sleep(first_s)
            for i in range(tokens):
                if i:
                    await asyncio.sleep(per_token_s)
                yield chunk({"content": f" t{i}"})
            yield chunk({}, "stop") + b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[HttpRoute("/v1/chat/completions", completions, methods=["POST"])])


async def test_a_gateway_pushes_each_calls_figures_and_a_worker_reads_them(start_server: StartServer) -> None:
    stable = await start_server(model_server(0.02, 0.01, 6))
    canary = await start_server(model_server(0.02, 0.06, 6))
    route = Route("default", "m", stable=Backend(stable.url, "1.0.0", "rel-1"), canary=Backend(canary.url, "1.1.0", "rel-2"),
                  traffic_percent=50, protocol="openai")
    control = create_app(Router(RouteTable([route])), list_workflows=list, on_git_hook=None)
    publisher = RoutePublisher()
    add_control_routes(control, publisher, TOKEN)
    control.gateway.calls.ledger = TrafficLedger()
    CallsHub(control.gateway.calls).mount(control, TOKEN)
    control_server = await start_server(control)
    publisher.publish(RouteTable([route]), [])
    since = time.time()

    role = GatewayRole(GatewayRoleConfig(control_url=control_server.url, internal_token=TOKEN, port=0))
    await role.start(wait_for_table_s=10)
    try:
        async with httpx.AsyncClient(base_url=role.url, trust_env=False, timeout=30) as client:
            for track in ("stable", "canary") * 3:
                answer = await client.post("/v1/chat/completions", headers={"x-plnt-track": track},
                                           json={"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]})
                assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
            whole = await client.post("/v1/chat/completions", headers={"x-plnt-track": "stable"},
                                      json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert whole.status_code == 200
            rows = (await client.get("/calls")).json()  # this gateway's own log shows the figures too
        streamed = [r for r in rows if r["ttftMs"] is not None]
        assert len(streamed) == 6 and all(r["tokens"] == 6 and r["tpotMs"] > 0 for r in streamed), rows

        read = ControlTraffic(control_server.url, TOKEN).reader("default", "m", "1.1.0", "1.0.0", since)
        reading: TrafficReading | None = None
        for _ in range(100):  # pushed every 0.25 s
            reading = await read()
            if reading.stable.count == 4 and reading.canary.count == 3:
                break
            await asyncio.sleep(0.05)
        assert reading is not None and (reading.canary.count, reading.stable.count) == (3, 4), reading
        assert reading.gateways == 2 and reading.silent == ()  # the control app itself and the pushing gateway
        # Measured at the gateway: the canary's tokens come 60 ms apart, the stable's 10 ms.
        assert reading.canary.tpot_count == 3 and 50 <= reading.canary.tpot_p95_ms <= 120, reading
        assert reading.stable.tpot_count == 3 and 5 <= reading.stable.tpot_p95_ms <= 40, reading
        assert reading.canary.ttft_p95_ms >= 20 and reading.stable.ttft_count == 3
        # The whole answer's usage says its tokens; it has no TTFT.
        assert (reading.stable.tokens_count, reading.stable.tokens_mean) == (4, 6.0)

        with pytest.raises(GateUnusable, match="internal-token-file"):
            await ControlTraffic(control_server.url, "not-the-token").reader("default", "m", "1.1.0", "1.0.0", since)()
    finally:
        await role.stop()
    await control_server.stop()
    with pytest.raises(GateUnavailable, match="did not answer: ConnectError; asked again"):
        await read()
