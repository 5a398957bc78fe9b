"""The web UI's usage view (#/usage) in a real headless Chromium against a real gateway app (uvicorn on
loopback) with a GatewayPolicy: the table of what each token used and the limits, as the signed-in
token may see them. The runner is FakeRunner (tests/gateway/fakes.py), a STAND-IN for plnt.runner."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.auth import TokenSet
from plnt.core.routes import RouteTable
from plnt.core.specs.models import GatewayPolicySpec
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.conftest import start_gateway as start_gateway  # noqa: F401 (fixtures)
from tests.gateway.conftest import start_server as start_server  # noqa: F401
from tests.gateway.fakes import FakeRunner
from tests.ui.test_browser import browser as browser  # noqa: F401 (fixtures)
from tests.ui.test_browser import page as page  # noqa: F401
from tests.ui.test_browser import shot, tab_to

pytestmark = pytest.mark.integration


async def test_the_usage_view_shows_each_tokens_use_and_limits(
        start_server: StartServer, start_gateway: StartGateway, page: Any) -> None:  # noqa: F811
    runner = await start_server(FakeRunner("1.0.0").app())
    policy = GatewayPolicySpec.model_validate({"currency": "EUR", "tokens": [
        {"name": "app", "requestsPerMinute": 2, "budget": {"amount": 5, "per": "day"}}]})
    router = Router(RouteTable([route("assistant", backend(runner, "1.0.0"))], policy))
    tokens = TokenSet.parse("ops-secret name=ops\napp-secret name=app scopes=invoke,read\n")
    gw = await start_gateway(router, tokens=tokens)
    for token, times in (("app-secret", 3), ("ops-secret", 1)):
        for _ in range(times):
            await gw.client.post("/workflows/assistant/invoke", json={}, headers={"authorization": f"Bearer {token}"})

    await page.goto(f"{gw.url}/ui#/usage")
    await page.get_by_label("Gateway token").fill("ops-secret")
    await page.keyboard.press("Enter")
    await tab_to(page, "Usage")
    await page.keyboard.press("Enter")
    app_row = page.locator('#usage-table tr[data-token="app"]')
    await app_row.wait_for()
    assert (await app_row.inner_text()).split("\t")[:3] == ["app", "default/assistant", "2"]  # the 3rd was refused
    assert await page.locator('#usage-table tr[data-token="ops"]').count() == 1
    limits = await page.locator('#limits-table tr[data-token="app"]').inner_text()
    assert limits.split("\t") == ["app", "2", "–", "5 EUR per day"], limits
    await shot(page, "usage.png")

    # A read token sees its own name's rows only.
    await page.get_by_role("button", name="Sign out").click()
    await page.get_by_label("Gateway token").fill("app-secret")
    await page.keyboard.press("Enter")
    await page.evaluate("() => { location.hash = '#/usage'; }")
    await page.locator('#usage-table tr[data-token="app"]').wait_for()
    assert await page.locator('#usage-table tr[data-token="ops"]').count() == 0
