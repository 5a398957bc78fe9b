"""The gateway's API for the web UI: GET /workflows/events (SSE), GET /calls (the invocation log),
X-Plnt-Track, and the scopes of the new paths. Real gateways on 127.0.0.1; the runners are fake
runners (FakeRunner, tests/gateway/fakes.py) standing in for plnt.runner."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from plnt.core.auth import READ, required_scope, rollout_path
from plnt.core.routes import BadTrack, RouteTable, forced_track
from plnt.gateway.calls import CallLog, CallsHub, call_json
from plnt.gateway.router import Router
from plnt.gateway.sse import SSEParser

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

pytestmark = pytest.mark.integration

TOKENS = "reader scopes=read\ninvoker invoke=assistant\n"


async def _events(client: httpx.AsyncClient, url: str, want: int, headers: dict[str, str] | None = None,
                  timeout_s: float = 10.0) -> tuple[list[Any], httpx.Response]:
    """The first `want` SSE events (comments included, as None) of GET url."""
    parser = SSEParser()
    got: list[Any] = []

    async def read() -> httpx.Response:
        async with client.stream("GET", url, headers=headers or {}) as response:
            if response.status_code != 200:
                await response.aread()
                return response
            async for chunk in response.aiter_raw():
                for event in parser.feed(chunk):
                    got.append(json.loads(event.data) if event.event == "workflows" else (event.event, event.data))
                if len(got) >= want:
                    return response
        return response

    response = await asyncio.wait_for(read(), timeout_s)
    return got, response


async def test_workflow_events_send_rows_on_connect_and_on_change_only(start_gateway: StartGateway) -> None:
    rows: list[dict[str, Any]] = [{"name": "assistant", "namespace": "default", "phase": "Ready",
                                   "endpoint": "http://127.0.0.1:9/"}]
    gw = await start_gateway(Router(), list_workflows=lambda: [dict(r) for r in rows], events_poll_s=0.05,
                             events_keepalive_s=0.3)

    async def change_later() -> None:
        await asyncio.sleep(0.2)
        rows[0]["phase"] = "Canary"

    changer = asyncio.create_task(change_later())
    got, response = await _events(gw.client, "/workflows/events", 3)
    await changer
    assert response.headers["content-type"].startswith("text/event-stream")
    first, second, third = got
    assert first == {"workflows": [{"name": "assistant", "namespace": "default", "phase": "Ready",
                                    "endpoint": "http://127.0.0.1:9/"}]}  # open gateway: admin rows
    assert second["workflows"][0]["phase"] == "Canary"
    # Nothing changed since: no rows again, only the keepalive comment (polled 6 times meanwhile).
    assert third == ("", "keepalive")


async def streams_closed(gw: Any) -> None:
    """Until the gateway counts no open event stream (a closed client is noticed on its next poll)."""
    for _ in range(200):
        if gw.app.state.open_event_streams() == 0:
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"{gw.app.state.open_event_streams()} event streams still open after 5 s")


async def test_workflow_events_filter_rows_per_token_and_are_bounded(start_gateway: StartGateway) -> None:
    from plnt.core.auth import TokenSet

    rows = [{"name": "assistant", "namespace": "default", "endpoint": "http://127.0.0.1:9"},
            {"name": "other", "namespace": "default", "endpoint": "http://127.0.0.1:9"}]
    gw = await start_gateway(Router(), list_workflows=lambda: rows, tokens=TokenSet.parse(TOKENS),
                             events_poll_s=0.05, max_event_streams=1)
    no_token = await gw.client.get("/workflows/events")
    assert no_token.status_code == 401
    got, _ = await _events(gw.client, "/workflows/events", 1, {"authorization": "Bearer invoker"})
    # An invoke-only token sees its workflow, without the runner's address.
    assert got[0] == {"workflows": [{"name": "assistant", "namespace": "default"}]}

    # One stream open: a second is refused with 503 naming the bound, and allowed again once it closes.
    await streams_closed(gw)  # the first stream's end is noticed
    opened = asyncio.Event()

    async def hold() -> None:
        async with gw.client.stream("GET", "/workflows/events", headers={"authorization": "Bearer reader"}) as r:
            assert r.status_code == 200
            opened.set()
            await asyncio.sleep(30)

    holder = asyncio.create_task(hold())
    await asyncio.wait_for(opened.wait(), 5)
    refused = await gw.client.get("/workflows/events", headers={"authorization": "Bearer reader"})
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["type"] == "too_many_streams" and "1 event streams" in refused.text
    holder.cancel()
    await asyncio.gather(holder, return_exceptions=True)
    await streams_closed(gw)
    got, _ = await _events(gw.client, "/workflows/events", 1, {"authorization": "Bearer reader"})
    assert [r["name"] for r in got[0]["workflows"]] == ["assistant", "other"]


def test_scopes_of_the_ui_paths() -> None:
    assert required_scope("/workflows/events") is None
    for path in ("/calls", "/plan", "/plan/revisions", "/workflows/x/rollouts", "/workflows/x/history"):
        assert required_scope(path) == READ, path
    assert required_scope("/plan/other") == "admin"
    # A rollout: looking needs read, acting admin; a workflow named `rollout` is not one.
    assert required_scope("/workflows/x/rollout") == READ
    for path in ("/workflows/x/rollout/pause", "/workflows/x/rollout/abort", "/workflows/x/rollout/anything"):
        assert required_scope(path) == "admin", path
    assert rollout_path("/workflows/rollout/invoke") is None and rollout_path("/workflows//rollout") is None
    assert rollout_path("/workflows/x/rollout/pause/more") is None


async def test_calls_log_the_newest_first_without_bodies(start_server: StartServer,
                                                         start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0")
    server = await start_server(runner.app())
    gw = await start_gateway(Router(RouteTable([route("assistant", backend(server, "1.0.0"))])))
    ok = await gw.client.post("/workflows/assistant/invoke", json={"secret": "do-not-log"},
                              headers={"authorization": "Bearer not-a-real-one"})
    assert ok.status_code == 200
    missing = await gw.client.post("/workflows/nope/invoke", json={})
    assert missing.status_code == 404
    chat = await gw.client.post("/v1/chat/completions", json={"model": "assistant",
                                                               "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200
    calls = (await gw.client.get("/calls", params={"limit": 2})).json()
    assert [c["api"] for c in calls] == ["chat", "invoke"]
    assert calls[0]["workflow"] == "assistant" and calls[0]["version"] == "1.0.0" and calls[0]["track"] == "stable"
    assert calls[0]["code"] == 200 and calls[0]["errorType"] is None and calls[0]["latencyMs"] > 0
    assert calls[1] == {**calls[1], "workflow": "", "version": "", "track": "", "code": 404, "errorType": "not_found"}
    every = (await gw.client.get("/calls")).json()
    assert len(every) == 3 and every[0]["at"] >= every[1]["at"] >= every[2]["at"]
    assert "do-not-log" not in json.dumps(every) and "not-a-real-one" not in json.dumps(every)


def test_call_log_is_bounded_and_hands_out_what_is_new() -> None:
    log = CallLog(size=3)
    for code in (200, 201, 202, 203, 204):
        log.add("invoke", ("default", "a", "1.0.0", "stable"), code, 0.001, None)
    assert [c[6] for c in log.calls] == [202, 203, 204] and log.count == 5
    assert [c[6] for c in log.since(3)] == [203, 204]
    assert [c[6] for c in log.since(0)] == [202, 203, 204]  # only what is still kept
    assert log.since(5) == []
    hub = CallsHub(CallLog(size=3))
    taken = hub.take("w1", [list(c) for c in log.calls] + [["bogus"], [1, "delete", "", "", "", "", 200, 0.1, None]])
    assert taken == 3
    assert [r["code"] for r in hub.rows(10)] == [204, 203, 202]
    assert call_json(log.calls[0])["latencyMs"] == 1.0


def test_forced_track_values() -> None:
    assert forced_track(None) is None
    assert forced_track(b"stable") == "stable" and forced_track(b"Canary ") == "canary"
    with pytest.raises(BadTrack, match="'blue'"):
        forced_track(b"blue")


async def test_x_plnt_track_forces_stable_or_canary(start_server: StartServer, start_gateway: StartGateway) -> None:
    stable, canary = FakeRunner("1.0.0", tokens=("old",)), FakeRunner("1.1.0", tokens=("new",))
    s_server, c_server = await start_server(stable.app()), await start_server(canary.app())
    router = Router(RouteTable([route("assistant", backend(s_server, "1.0.0"), backend(c_server, "1.1.0"), percent=0),
                                route("solo", backend(s_server, "1.0.0"))]))
    gw = await start_gateway(router)

    async def invoke(name: str, track: str) -> httpx.Response:
        return await gw.client.post(f"/workflows/{name}/invoke", json={}, headers={"x-plnt-track": track})

    for _ in range(3):  # 0 % of traffic goes to the canary, yet the header reaches it
        forced = await invoke("assistant", "canary")
        assert forced.status_code == 200 and forced.headers["x-plnt-track"] == "canary"
        assert forced.headers["x-plnt-version"] == "1.1.0"
    kept = await invoke("assistant", "stable")
    assert kept.headers["x-plnt-track"] == "stable" and kept.headers["x-plnt-version"] == "1.0.0"

    none = await invoke("solo", "canary")
    assert none.status_code == 409 and none.json()["error"]["type"] == "no_canary"
    assert "no canary of default/solo is under test" in none.json()["error"]["message"]
    bad = await invoke("assistant", "blue")
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_track"

    chat = await gw.client.post("/v1/chat/completions", headers={"x-plnt-track": "canary"},
                                json={"model": "assistant", "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 200 and chat.headers["x-plnt-track"] == "canary"
    assert chat.json()["choices"][0]["message"]["content"] == "new"
    chat_none = await gw.client.post("/v1/chat/completions", headers={"x-plnt-track": "canary"},
                                     json={"model": "solo", "messages": [{"role": "user", "content": "hi"}]})
    assert chat_none.status_code == 409 and chat_none.json()["error"]["type"] == "no_canary"
    calls = (await gw.client.get("/calls", params={"limit": 1})).json()
    assert calls[0]["code"] == 409 and calls[0]["errorType"] == "no_canary"


async def test_an_open_event_stream_does_not_hold_up_the_server_stopping() -> None:
    """A UI tab left open keeps GET /workflows/events open: stopping the gateway ends the stream at
    once instead of waiting out uvicorn's graceful timeout (30 s) for it."""
    from plnt.core.server import GatewayServer
    from plnt.gateway.app import create_app

    app = create_app(Router(), list_workflows=lambda: [{"name": "a", "namespace": "default"}], events_poll_s=0.05)
    server = GatewayServer(app, graceful_timeout_s=30.0)
    await server.start()
    first = asyncio.Event()

    async def hold_stream() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            async with client.stream("GET", "/workflows/events") as response:
                async for chunk in response.aiter_raw():
                    if b"event: workflows" in chunk:
                        first.set()

    reader = asyncio.create_task(hold_stream())
    try:
        await asyncio.wait_for(first.wait(), 10)
        loop = asyncio.get_running_loop()
        began = loop.time()
        await asyncio.wait_for(server.stop(), 20)  # without the fix: about 30 s, so this times out
        assert loop.time() - began < 10
        await asyncio.wait_for(reader, 10)  # the stream ended cleanly, from the server's side
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)


async def test_streams_of_one_token_share_one_rows_computation_per_poll(start_gateway: StartGateway) -> None:
    """Ten UI tabs on one token: the rows are listed and serialised about once per poll, not ten times."""
    listed = [0]

    def list_workflows() -> list[dict[str, Any]]:
        listed[0] += 1
        return [{"name": "assistant", "namespace": "default", "phase": "Ready"}]

    poll_s = 0.2
    gw = await start_gateway(Router(), list_workflows=list_workflows, events_poll_s=poll_s, events_keepalive_s=60)
    stop = asyncio.Event()
    opened = [0]

    async def tab() -> None:
        async with gw.client.stream("GET", "/workflows/events") as response:
            assert response.status_code == 200
            opened[0] += 1
            async for _ in response.aiter_raw():
                if stop.is_set():
                    return

    tabs = [asyncio.create_task(tab()) for _ in range(10)]
    try:
        await asyncio.wait_for(_until(lambda: opened[0] == 10), 10)
        before, began = listed[0], asyncio.get_running_loop().time()
        await asyncio.sleep(2.0)
        polls = (asyncio.get_running_loop().time() - began) / poll_s
        # Each stream polls every 0.2 s: unshared that is 10 x 10 = 100 listings in 2 s.
        assert listed[0] - before <= 2 * polls + 2, (listed[0] - before, polls)
    finally:
        stop.set()
        for task in tabs:
            task.cancel()
        await asyncio.gather(*tabs, return_exceptions=True)


async def _until(check: Any) -> None:
    while not check():
        await asyncio.sleep(0.01)
