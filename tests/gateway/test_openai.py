"""The official `openai` client, sync and async, streaming and not, against the gateway.

The runners behind the gateway are fake runners (FakeRunner, tests/gateway/fakes.py) standing in
for plnt.runner, except in test_against_the_real_runner (plnt.runner itself, with MockBackend
standing in for the model server)."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from plnt.core.auth import Grant, TokenSet
from plnt.core.routes import Backend, RouteTable
from plnt.gateway.router import Router
from plnt.reconciler.drivers.processes import free_port

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

# No module-wide mark: tests that request a server fixture are marked integration by tests/hygiene.py.

TOKEN = "sk-plnt-test-token"
ONLY_OTHER = "sk-plnt-only-other"
TOKENS = TokenSet([(TOKEN, Grant()), (ONLY_OTHER, Grant(frozenset({"other"})))])
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say hello"}]


async def serve(start_server: StartServer, start_gateway: StartGateway, runner: FakeRunner, **kwargs):  # type: ignore[no-untyped-def]
    server = await start_server(runner.app())
    table = RouteTable([route("assistant", backend(server, runner.version)), route("other", backend(server, "o1"))])
    return await start_gateway(Router(table), tokens=TOKENS, **kwargs)


def sync_client(url: str, key: str = TOKEN) -> OpenAI:
    # max_retries=0: every error status must reach the test as it was answered.
    return OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


def async_client(url: str, key: str = TOKEN) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=20)


async def test_sync_client_non_streaming_and_streaming(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.4.0", tokens=("Hello", " from", " plnt"))
    gw = await serve(start_server, start_gateway, runner)

    def use_client() -> tuple[object, list[object]]:
        # The servers run on the test's loop: the blocking client runs in a thread.
        with sync_client(gw.url) as client:
            completion = client.chat.completions.create(model="assistant", messages=MESSAGES, max_tokens=50)
            chunks = list(client.chat.completions.create(model="assistant", messages=MESSAGES, stream=True))
        return completion, chunks

    completion, chunks = await asyncio.to_thread(use_client)

    assert completion.object == "chat.completion"
    assert completion.id.startswith("chatcmpl-")
    assert completion.model == "assistant"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].message.content == "Hello from plnt"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.total_tokens == completion.usage.prompt_tokens + 3
    # The runner got the chat in its own shape.
    assert runner.requests[0]["path"] == "/chat"
    assert runner.requests[0]["body"] == {"messages": MESSAGES, "stream": False, "max_tokens": 50}

    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Hello from plnt"
    assert [c.choices[0].finish_reason for c in chunks][-1] == "stop"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])


async def test_async_client_non_streaming_and_streaming(start_server: StartServer, start_gateway: StartGateway) -> None:
    # An object output: the reply is its "reply" field.
    runner = FakeRunner("2.0.0", tokens=("Bon", "jour"), output={"reply": "Bonjour", "lang": "fr"})
    gw = await serve(start_server, start_gateway, runner)

    async with async_client(gw.url) as client:
        completion = await client.chat.completions.create(model="assistant", messages=MESSAGES)
        assert completion.choices[0].message.content == "Bonjour"
        assert completion.system_fingerprint == "plnt-2.0.0"

        stream = await client.chat.completions.create(
            model="assistant", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        chunks = [chunk async for chunk in stream]
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Bonjour"
    assert chunks[0].choices[0].delta.role == "assistant"
    stop = [c for c in chunks if c.choices and c.choices[0].finish_reason == "stop"]
    assert len(stop) == 1
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2  # two token events streamed


async def test_reply_not_streamed_as_tokens_is_sent_whole(start_server: StartServer, start_gateway: StartGateway) -> None:
    # A workflow whose output step does not stream: no token events, only the result.
    runner = FakeRunner("1.0.0", tokens=(), output={"reply": "all at once"})
    gw = await serve(start_server, start_gateway, runner)
    async with async_client(gw.url) as client:
        stream = await client.chat.completions.create(model="assistant", messages=MESSAGES, stream=True)
        chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "all at once"
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_models_list_and_retrieve(start_server: StartServer, start_gateway: StartGateway) -> None:
    gw = await serve(start_server, start_gateway, FakeRunner("1.0.0"))
    async with async_client(gw.url) as client:
        models = await client.models.list()
        assert sorted(m.id for m in models.data) == ["assistant", "other"]
        assert (await client.models.retrieve("assistant")).owned_by == "default"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("nope")
    # A restricted key sees only its workflows.
    async with async_client(gw.url, ONLY_OTHER) as client:
        assert [m.id for m in (await client.models.list()).data] == ["other"]


async def test_openai_errors(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0")
    gw = await serve(start_server, start_gateway, runner, max_body_bytes=4096)

    async with async_client(gw.url) as client:
        with pytest.raises(openai.NotFoundError) as not_found:
            await client.chat.completions.create(model="missing", messages=MESSAGES)
        assert not_found.value.status_code == 404
        assert not_found.value.code == "model_not_found" and not_found.value.param == "model"

        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="assistant", messages=[{"role": "wizard", "content": "hi"}])
        assert bad.value.param == "messages[0].role"
        assert bad.value.type == "invalid_request_error"

        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="assistant", messages=[])
        assert bad.value.param == "messages"

        with pytest.raises(openai.APIStatusError) as too_big:
            await client.chat.completions.create(model="assistant", messages=[{"role": "user", "content": "x" * 5000}])
        assert too_big.value.status_code == 413

    async with async_client(gw.url, "sk-wrong") as client:
        with pytest.raises(openai.AuthenticationError) as unauthorized:
            await client.chat.completions.create(model="assistant", messages=MESSAGES)
        assert unauthorized.value.status_code == 401
        assert unauthorized.value.response.headers["www-authenticate"].startswith("Bearer")
        assert unauthorized.value.body == {"message": "invalid bearer token", "type": "invalid_request_error",
                                           "param": None, "code": "invalid_api_key"}

    async with async_client(gw.url, ONLY_OTHER) as client:
        with pytest.raises(openai.PermissionDeniedError) as forbidden:
            await client.chat.completions.create(model="assistant", messages=MESSAGES)
        assert forbidden.value.status_code == 403


async def test_openai_upstream_errors(start_server: StartServer, start_gateway: StartGateway) -> None:
    slow = FakeRunner("1.0.0", delay_s=2.0)
    slow_server = await start_server(slow.app(), graceful_timeout_s=0.5)
    dead = Backend(f"http://127.0.0.1:{free_port()}", "9.9.9", "rel-dead")
    table = RouteTable([
        route("slow", backend(slow_server, "1.0.0")),
        route("dead", dead),
        route("fresh", None),
    ])
    gw = await start_gateway(Router(table), request_timeout_s=0.3)
    async with async_client(gw.url) as client:
        for model, status, code in [("slow", 504, "upstream_timeout"), ("dead", 502, "upstream_unavailable"),
                                    ("fresh", 503, "model_not_ready")]:
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model=model, messages=MESSAGES)
            assert info.value.status_code == status, model
            assert info.value.code == code
            assert set(info.value.response.json()["error"]) == {"message", "type", "param", "code"}


async def test_stream_error_event_raises_in_client(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0", tokens=("one", " two", " three"), fail_after_tokens=2)
    gw = await serve(start_server, start_gateway, runner)
    got: list[str] = []
    async with async_client(gw.url) as client:
        stream = await client.chat.completions.create(model="assistant", messages=MESSAGES, stream=True)
        with pytest.raises(openai.APIError) as info:
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content or "")
    assert "".join(got) == "one two"
    assert "tool exploded" in info.value.message


async def test_runner_errors_and_bad_json(start_server: StartServer, start_gateway: StartGateway) -> None:
    runner = FakeRunner("1.0.0")
    gw = await serve(start_server, start_gateway, runner)
    async with async_client(gw.url) as client:
        # The runner's own refusal (422) is OpenAI's 400; its failure (500) stays a 500; both in OpenAI's shape.
        runner.fail_status = 422
        with pytest.raises(openai.BadRequestError) as bad:
            await client.chat.completions.create(model="assistant", messages=MESSAGES)
        assert bad.value.code == "invalid_request" and "told to fail with 422" in bad.value.message
        runner.fail_status = 500
        with pytest.raises(openai.InternalServerError) as failed:
            await client.chat.completions.create(model="assistant", messages=MESSAGES, stream=True)
        assert failed.value.status_code == 500 and failed.value.code == "step_failed"

    resp = await gw.client.post("/v1/chat/completions", content=b'{"model": "assistant", "messages": [}',
                                headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "invalid_json" and "line 1 column 37" in error["message"]


async def test_session_header_via_openai_client(start_server: StartServer, start_gateway: StartGateway) -> None:
    stable, canary = FakeRunner("1.0.0"), FakeRunner("2.0.0", tokens=("canary",))
    s1, s2 = await start_server(stable.app()), await start_server(canary.app())
    router = Router(RouteTable([route("assistant", backend(s1, "1.0.0"), backend(s2, "2.0.0"), percent=50)]))
    gw = await start_gateway(router)
    async with async_client(gw.url) as client:
        for session in ("signer-a", "signer-b", "session-c"):
            replies = set()
            for _ in range(4):
                completion = await client.chat.completions.create(
                    model="assistant", messages=MESSAGES, extra_headers={"X-Session-Id": session})
                replies.add(completion.choices[0].message.content)
            assert len(replies) == 1, session


def test_models_body_shape() -> None:
    from plnt.gateway.openai_compat import models_body

    assert json.loads(models_body([("a", "default")])) == {
        "object": "list", "data": [{"id": "a", "object": "model", "created": 0, "owned_by": "default"}]}


async def test_against_the_real_runner(start_server: StartServer, start_gateway: StartGateway, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """plnt.runner itself behind the gateway; MockBackend stands in for the model server (the reply
    echoes the prompt's last line)."""
    from plnt.runner.adapters import MockBackend
    from plnt.runner.app import create_app as create_runner
    from plnt.runner.recipe import load_recipe_dir

    (tmp_path / "workflow.yaml").write_text(
        "apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {name: echo, version: 0.3.0}\n"
        "steps:\n  - id: reply\n    tool: llm.generate\n    params: {prompt: \"{message}\", maxTokens: 50}\n"
    )
    runner = create_runner(load_recipe_dir(tmp_path), MockBackend(), "rel-echo")
    server = await start_server(runner)
    gw = await start_gateway(Router(RouteTable([route("echo", backend(server, "0.3.0"))])), tokens=TOKENS)
    auth = {"authorization": f"Bearer {TOKEN}"}

    resp = await gw.client.post("/workflows/echo/invoke", json={"message": "hi there"}, headers=auth)
    assert resp.status_code == 200 and resp.json()["output"] == "hi there"
    resp = await gw.client.post("/workflows/echo/invoke", json={"message": "hi there"},
                                headers={**auth, "accept": "text/event-stream"})
    assert resp.content.count(b"event: token") == 2 and b"event: result" in resp.content

    async with async_client(gw.url) as client:
        messages = [{"role": "user", "content": "well hello"}]
        completion = await client.chat.completions.create(model="echo", messages=messages)
        assert completion.choices[0].message.content == "well hello"
        stream = await client.chat.completions.create(model="echo", messages=messages, stream=True)
        chunks = [chunk async for chunk in stream]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == "well hello"
        assert len([c for c in chunks if c.choices[0].delta.content]) == 2  # token by token
