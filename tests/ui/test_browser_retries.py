"""The playground's invocation log (#/playground) in a real headless Chromium against a real gateway app
(uvicorn on loopback): a call whose canary refused the connection and that the stable release answered
shows as retried (after which backend, why), its failed attempt as sent again, and a chat answered by
a ModelDeployment's fallback names the model it stands in for. The runner is FakeRunner
(tests/gateway/fakes.py) and the model server OpenAIPeer (tests/openai_peer.py), STAND-INS for
plnt.runner and llama.cpp; the canary and the model that are down are ports nothing listens on."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.routes import Backend, RouteTable
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.conftest import start_gateway as start_gateway  # noqa: F401 (fixtures)
from tests.gateway.conftest import start_server as start_server  # noqa: F401
from tests.gateway.fakes import FakeRunner
from tests.gateway.test_model_fallback import ask, dead_endpoint, model_route
from tests.openai_peer import OpenAIPeer
from tests.ui.test_browser import browser as browser  # noqa: F401 (fixtures)
from tests.ui.test_browser import page as page  # noqa: F401

pytestmark = pytest.mark.integration


async def test_the_invocation_log_shows_a_retried_call_and_a_fallback(
        start_server: StartServer, start_gateway: StartGateway, page: Any) -> None:  # noqa: F811
    stable = await start_server(FakeRunner("1.0.0").app())
    with OpenAIPeer() as small:
        canary = Backend(dead_endpoint(), "1.1.0", "rel-1.1.0")
        router = Router(RouteTable([
            route("assistant", backend(stable, "1.0.0"), canary, percent=100),  # every call tries the canary first
            model_route("big", None, "3.0.0", fallback="small", endpoint=dead_endpoint()),
            model_route("small", small, "2.0.0"),
        ]))
        gw = await start_gateway(router)
        invoked = await gw.client.post("/workflows/assistant/invoke", json={})
        assert invoked.status_code == 200 and invoked.headers["x-plnt-track"] == "stable", invoked.text
        chatted = await gw.client.post("/v1/chat/completions", json=ask("big"))
        assert chatted.status_code == 200 and chatted.headers["x-plnt-fallback"] == "small", chatted.text

        await page.goto(f"{gw.url}/ui#/playground")
        rows = page.locator("#calls-table tbody tr")
        await rows.first.wait_for()
        texts = [" ".join(text.split()) for text in await rows.all_inner_texts()]
        retried = [t for t in texts if "default/assistant" in t and "after canary 1.1.0: connect_refused" in t]
        assert len(retried) == 1 and "stable" in retried[0] and "200" in retried[0], texts
        attempt = [t for t in texts if "default/assistant" in t and "sent again: connect_refused" in t]
        assert len(attempt) == 1 and "canary" in attempt[0] and "502" in attempt[0], texts
        fallback = [t for t in texts if "small (fallback of big)" in t]
        assert len(fallback) == 1 and "after stable 3.0.0: connect_refused" in fallback[0] and "200" in fallback[0], texts
        big_attempt = [t for t in texts if "default/big" in t and "sent again: connect_refused" in t]
        assert len(big_attempt) == 1 and "502" in big_attempt[0], texts
