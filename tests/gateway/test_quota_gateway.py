"""Quotas and usage through a real gateway app (uvicorn on loopback): 429 with Retry-After in plnt's and
OpenAI's error shapes, one token limited while another is not, the usage in /metrics and `GET /usage`.

The runners are FakeRunner (tests/gateway/fakes.py) and the model server the OpenAI TEST PEER
(tests/openai_peer.py): stand-ins for plnt.runner and a model server."""

from __future__ import annotations

import pytest
from plnt.core.auth import TokenSet
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.specs.models import GatewayPolicySpec
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner
from tests.openai_peer import Behaviour, OpenAIPeer

pytestmark = pytest.mark.integration

TOKENS = TokenSet.parse("""\
app-secret name=app scopes=invoke,read
other-secret name=other scopes=invoke,read
admin-secret name=ops
""")
APP, OTHER, ADMIN = ({"authorization": f"Bearer {t}"} for t in ("app-secret", "other-secret", "admin-secret"))
CHAT = {"model": "smollm", "messages": [{"role": "user", "content": "one two three"}]}


def policy(**limits: object) -> GatewayPolicySpec:
    return GatewayPolicySpec.model_validate({
        "currency": "EUR",
        "prices": [{"model": "smollm", "inputPerMillion": 1e6, "outputPerMillion": 2e6}],  # 1 and 2 per token
        "tokens": [{"name": "app", **limits}],
    })


async def test_a_token_over_its_request_rate_gets_429_and_another_token_does_not(
        start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = await start_server(FakeRunner("1.0.0").app())
    router = Router(RouteTable([route("assistant", backend(runner, "1.0.0"))], policy(requestsPerMinute=2)))
    gw = await start_gateway(router, tokens=TOKENS)
    c = gw.client

    for _ in range(2):
        assert (await c.post("/workflows/assistant/invoke", json={}, headers=APP)).status_code == 200
    refused = await c.post("/workflows/assistant/invoke", json={}, headers=APP)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "30"  # 2 per minute: one back every 30 s
    error = refused.json()["error"]
    assert (error["type"], error["limit"], error["token"]) == ("rate_limited", "requestsPerMinute", "app")
    assert "token 'app' is over its 2 requests per minute" in error["message"]
    assert "app-secret" not in refused.text

    chat = await c.post("/v1/chat/completions", json={**CHAT, "model": "assistant"}, headers=APP)
    assert chat.status_code == 429 and chat.headers["retry-after"]
    assert chat.json()["error"]["type"] == "requests" and chat.json()["error"]["code"] == "rate_limit_exceeded"

    for _ in range(5):  # another token: its own (unlimited) quota
        assert (await c.post("/workflows/assistant/invoke", json={}, headers=OTHER)).status_code == 200

    usage = (await c.get("/usage", headers=ADMIN)).json()
    rows = {row["token"]: row["requests"] for row in usage["usage"]}
    assert rows == {"app": 2, "other": 5}  # refused requests reach no workflow: not usage
    assert usage["limits"] == [{"token": "app", "requestsPerMinute": 2, "tokensPerMinute": None, "budget": None}]
    metrics = (await c.get("/metrics", headers=ADMIN)).text
    assert 'plnt_gateway_quota_denials_total{limit="requestsPerMinute",token="app"} 2.0' in metrics
    own = (await c.get("/usage", headers=OTHER)).json()  # a read token sees its own name only
    assert [row["token"] for row in own["usage"]] == ["other"] and own["limits"] == []


async def test_llm_tokens_and_cost_are_counted_and_limited(start_gateway: StartGateway) -> None:
    with OpenAIPeer(Behaviour(reply="a b c d")) as peer:
        model = Route(namespace="default", name="smollm", stable=Backend(peer.url, "1", "rel-1"), protocol="openai")
        router = Router(RouteTable([model], policy(tokensPerMinute=10, budget={"amount": 100, "per": "day"})))
        gw = await start_gateway(router, tokens=TOKENS)
        c = gw.client

        first = await c.post("/v1/chat/completions", json=CHAT, headers=APP)  # 3 prompt + 4 completion tokens
        assert first.status_code == 200, first.text
        second = await c.post("/v1/chat/completions", json={**CHAT, "stream": True,
                                                             "stream_options": {"include_usage": True}}, headers=APP)
        assert second.status_code == 200 and "[DONE]" in second.text  # 11 tokens now: over 10, answered
        third = await c.post("/v1/chat/completions", json=CHAT, headers=APP)
        assert third.status_code == 429
        assert third.json()["error"]["type"] == "tokens"
        assert int(third.headers["retry-after"]) >= 1

        usage = (await c.get("/usage", headers=ADMIN)).json()
        assert usage["currency"] == "EUR"
        # The peer's stream sends no usage chunk: its prompt tokens are unknown (the gateway counts what an
        # answer says); its 4 completion tokens are counted from the stream's chunks.
        assert usage["usage"] == [{"token": "app", "namespace": "default", "workflow": "smollm", "requests": 2,
                                   "promptTokens": 3, "completionTokens": 8, "cost": 3 + 8 * 2.0}]


async def test_a_spent_budget_is_429_insufficient_quota_until_the_period_ends(start_gateway: StartGateway) -> None:
    with OpenAIPeer(Behaviour(reply="a b")) as peer:
        model = Route(namespace="default", name="smollm", stable=Backend(peer.url, "1", "rel-1"), protocol="openai")
        router = Router(RouteTable([model], policy(budget={"amount": 5, "per": "month"})))
        gw = await start_gateway(router, tokens=TOKENS)
        c = gw.client
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=APP)).status_code == 200  # costs 3 + 4
        spent = await c.post("/v1/chat/completions", json=CHAT, headers=APP)
        assert spent.status_code == 429
        assert spent.json()["error"]["code"] == "insufficient_quota"
        assert "spent its budget of 5 EUR per month" in spent.json()["error"]["message"]
        assert int(spent.headers["retry-after"]) <= 31 * 86400
        plnt_shape = await c.post("/workflows/smollm/invoke", json={}, headers=APP)
        assert plnt_shape.status_code == 429 and plnt_shape.json()["error"]["type"] == "budget_exhausted"
        assert (await c.post("/v1/chat/completions", json=CHAT, headers=OTHER)).status_code == 200


async def test_each_gateway_process_enforces_its_share(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = await start_server(FakeRunner("1.0.0").app())
    router = Router(RouteTable([route("assistant", backend(runner, "1.0.0"))], policy(requestsPerMinute=4)))
    gw = await start_gateway(router, tokens=TOKENS, gateway_processes=2)
    codes = [(await gw.client.post("/workflows/assistant/invoke", json={}, headers=APP)).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    assert "its share, 2" in (await gw.client.post("/workflows/assistant/invoke", json={}, headers=APP)).text
