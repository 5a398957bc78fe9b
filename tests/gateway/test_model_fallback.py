"""A ModelDeployment's fallback at the gateway, with OpenAIPeer (tests/openai_peer.py) as a STAND-IN for the
model servers (tests/models/test_model_fallback.py does it with real llama.cpp servers): when the model is down,
refuses for its own limit or is over its GatewayPolicy capacity, its fallback answers, says so, and the call log
and metrics show it; a token's own limits, the caller's mistakes and a second hop are not fallen back on."""

from __future__ import annotations

import json

import pytest
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.specs.models import GatewayPolicySpec
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway
from tests.openai_peer import OpenAIPeer

pytestmark = pytest.mark.integration


def model_route(name: str, peer: OpenAIPeer | None, version: str, fallback: str | None = None,
                endpoint: str | None = None) -> Route:
    url = endpoint or (peer.url if peer is not None else None)
    stable = Backend(url, version, f"rel-{name}-{version}") if url else None
    return Route("default", name, stable=stable, protocol="openai", fallback=fallback)


def ask(model: str = "big", stream: bool = False) -> dict:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "say hello there"}]}


def dead_endpoint() -> str:
    from plnt.reconciler.drivers.processes import free_port

    return f"http://127.0.0.1:{free_port()}"  # nothing listens: connections are refused


def series(metrics: str, name: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
            if line.startswith(name + "{")}


async def test_a_down_model_is_answered_by_its_fallback(start_gateway: StartGateway) -> None:
    with OpenAIPeer() as big, OpenAIPeer() as small:
        table = RouteTable([model_route("big", big, "1.0.0", fallback="small"), model_route("small", small, "2.0.0")])
        router = Router(table)
        gw = await start_gateway(router)
        up = await gw.client.post("/v1/chat/completions", json=ask())
        assert up.status_code == 200 and up.json()["model"] == "big" and "x-plnt-fallback" not in up.headers

        # big's server is gone (connections refused): small answers, named in `model` and X-Plnt-Fallback.
        router.replace(RouteTable([model_route("big", None, "1.0.0", "small", endpoint=dead_endpoint()),
                                   model_route("small", small, "2.0.0")]))
        down = await gw.client.post("/v1/chat/completions", json=ask())
        assert down.status_code == 200, down.text
        assert down.json()["model"] == "small" and down.headers["x-plnt-fallback"] == "small"
        assert down.headers["x-plnt-version"] == "2.0.0" and down.json()["choices"][0]["message"]["content"]
        assert small.requests[-1].json["model"] == "small"  # the server was asked for the model it serves
        streamed = await gw.client.post("/v1/chat/completions", json=ask(stream=True))
        assert streamed.status_code == 200 and streamed.headers["x-plnt-fallback"] == "small"
        chunks = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: {")]
        assert chunks and {c["model"] for c in chunks} == {"small"}

        calls = (await gw.client.get("/calls")).json()
        answered = [c for c in calls if c["fallbackOf"] == "big"]
        assert len(answered) == 2 and {(c["workflow"], c["code"], c["retry"]["reason"]) for c in answered} == {
            ("small", 200, "connect_refused")}
        assert {c["retry"]["from"] for c in answered} == {"stable 1.0.0"}
        failed = [c for c in calls if c["workflow"] == "big" and c["code"] == 502]
        assert len(failed) == 2 and {c["retried"] for c in failed} == {"connect_refused"}
        fallbacks = series((await gw.client.get("/metrics")).text, "plnt_gateway_fallbacks_total")
        assert fallbacks == {'plnt_gateway_fallbacks_total{fallback="small",model="big",namespace="default",'
                             'reason="connect_refused"}': 2.0}

        # Nothing promoted for big: small answers too (reason not_ready).
        router.replace(RouteTable([model_route("big", None, "1.0.0", "small"), model_route("small", small, "2.0.0")]))
        unready = await gw.client.post("/v1/chat/completions", json=ask())
        assert unready.status_code == 200 and unready.headers["x-plnt-fallback"] == "small"
        last = next(c for c in (await gw.client.get("/calls")).json() if c["fallbackOf"] == "big")
        assert (last["workflow"], last["fallbackOf"], last["retry"]) == (
            "small", "big", {"from": "not sent", "reason": "not_ready"})


@pytest.mark.parametrize(("status", "reason"), [(429, "over_limit"), (503, "upstream_status"),
                                                (500, "upstream_status")])
async def test_the_models_own_refusal_or_5xx_goes_to_the_fallback(start_gateway: StartGateway, status: int,
                                                                  reason: str) -> None:
    with OpenAIPeer() as big, OpenAIPeer() as small:
        big.configure(fail_status=status)
        gw = await start_gateway(Router(RouteTable([model_route("big", big, "1.0.0", fallback="small"),
                                                    model_route("small", small, "2.0.0")])))
        answer = await gw.client.post("/v1/chat/completions", json=ask())
        assert answer.status_code == 200 and answer.headers["x-plnt-fallback"] == "small"
        assert len(big.requests) == 1 and len(small.requests) == 1
        assert f'reason="{reason}"' in "".join(series((await gw.client.get("/metrics")).text,
                                                      "plnt_gateway_fallbacks_total"))


async def test_what_is_not_fallen_back_on(start_gateway: StartGateway) -> None:
    """The caller's own mistake (a 400), a request that named its track, a fallback that is down too (its own
    fallback is not followed: one hop), a fallback the caller may not use."""
    with OpenAIPeer() as big, OpenAIPeer() as small, OpenAIPeer() as tiny:
        big.configure(fail_status=400)
        router = Router(RouteTable([model_route("big", big, "1.0.0", fallback="small"),
                                    model_route("small", small, "2.0.0", fallback="tiny"),
                                    model_route("tiny", tiny, "3.0.0")]))
        gw = await start_gateway(router)
        mistake = await gw.client.post("/v1/chat/completions", json=ask())
        assert mistake.status_code == 400 and small.requests == []

        big.configure(fail_status=503)
        forced = await gw.client.post("/v1/chat/completions", json=ask(), headers={"x-plnt-track": "stable"})
        assert forced.status_code == 503 and small.requests == []

        small.configure(fail_status=503)
        both_down = await gw.client.post("/v1/chat/completions", json=ask())
        assert both_down.status_code == 503 and len(small.requests) == 1 and tiny.requests == []  # one hop

    # A token that may chat with big only does not get small.
    with OpenAIPeer() as big, OpenAIPeer() as small:
        big.configure(fail_status=503)
        from plnt.core.auth import TokenSet

        tokens = TokenSet.parse("only-big default/big\n")
        gw = await start_gateway(Router(RouteTable([model_route("big", big, "1.0.0", fallback="small"),
                                                    model_route("small", small, "2.0.0")])), tokens=tokens)
        refused = await gw.client.post("/v1/chat/completions", json=ask(), headers={"authorization": "Bearer only-big"})
        assert refused.status_code == 503 and small.requests == []


async def test_a_models_capacity_is_escaped_by_its_fallback_a_tokens_limit_is_not(start_gateway: StartGateway) -> None:
    policy = GatewayPolicySpec.model_validate({"models": [{"model": "big", "requestsPerMinute": 2}],
                                               "default": {"requestsPerMinute": 5}})
    with OpenAIPeer() as big, OpenAIPeer() as small:
        gw = await start_gateway(Router(RouteTable([model_route("big", big, "1.0.0", fallback="small"),
                                                    model_route("small", small, "2.0.0")], policy)))
        answers = [await gw.client.post("/v1/chat/completions", json=ask()) for _ in range(6)]
        # big's capacity is 2 a minute: the next ones go to small, until the token's own 5 a minute is used up.
        assert [a.status_code for a in answers] == [200, 200, 200, 200, 200, 429]
        assert [a.headers.get("x-plnt-fallback") for a in answers[:5]] == [None, None, "small", "small", "small"]
        assert len(big.requests) == 2 and len(small.requests) == 3
        assert answers[5].json()["error"]["type"] == "requests"  # the token's limit: no fallback escapes it
        assert 'reason="over_limit"' in "".join(series((await gw.client.get("/metrics")).text,
                                                       "plnt_gateway_fallbacks_total"))

    # Without a fallback, a model over its capacity answers 429.
    with OpenAIPeer() as big:
        gw = await start_gateway(Router(RouteTable([model_route("big", big, "1.0.0")], policy)))
        statuses = [(await gw.client.post("/v1/chat/completions", json=ask())).status_code for _ in range(3)]
        assert statuses == [200, 200, 429] and len(big.requests) == 2
