"""X-Plnt-Preview on the OpenAI-compatible chat and on /v1/models: a preview (`<name>--pr<N>`)
answers a model's name only with the header, and is no model of its own. The runners are fake
runners (FakeRunner, tests/gateway/fakes.py) standing in for plnt.runner; the gateway is real."""

from __future__ import annotations

import httpx
from plnt.core.routes import RouteTable
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

MESSAGES = [{"role": "user", "content": "say hello"}]


async def test_chat_reaches_a_preview_only_with_the_header(start_server: StartServer,
                                                           start_gateway: StartGateway) -> None:
    main, preview = FakeRunner("1.2.0", tokens=("main",)), FakeRunner("1.3.0", tokens=("preview",))
    main_server, preview_server = await start_server(main.app()), await start_server(preview.app())
    table = RouteTable([route("assistant", backend(main_server, "1.2.0")),
                        route("assistant--pr7", backend(preview_server, "1.3.0"))])
    gw = await start_gateway(Router(table))
    async with httpx.AsyncClient(trust_env=False, timeout=20) as client:
        async def chat(model: str, **headers: str) -> httpx.Response:
            return await client.post(f"{gw.url}/v1/chat/completions", json={"model": model, "messages": MESSAGES},
                                     headers=headers)

        regular = await chat("assistant")
        assert regular.status_code == 200 and regular.headers["x-plnt-version"] == "1.2.0"
        previewed = await chat("assistant", **{"X-Plnt-Preview": "7"})
        assert previewed.status_code == 200 and previewed.headers["x-plnt-version"] == "1.3.0", previewed.text
        assert previewed.json()["choices"][0]["message"]["content"] == "preview"

        missing = await chat("assistant", **{"X-Plnt-Preview": "8"})
        assert missing.status_code == 404 and "pull request 8" in missing.json()["error"]["message"]
        assert missing.json()["error"]["code"] == "model_not_found"
        by_name = await chat("assistant--pr7")  # no regular traffic to a preview
        assert by_name.status_code == 404 and by_name.json()["error"]["code"] == "model_not_found"
        models = (await client.get(f"{gw.url}/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["assistant"]
    assert len(preview.requests) == 1 and len(main.requests) == 1
