"""The runner over real HTTP (uvicorn on 127.0.0.1): unbuffered SSE, upstream failures, the
process with `--backend http`, against the MockBackend and the OpenAI-compatible test peer
(tests/openai_peer.py): both are STAND-INS for a model server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from plnt.runner.adapters import HTTPBackend, MockBackend
from plnt.runner.app import create_app
from plnt.runner.recipe import load_recipe_dir

from tests.openai_peer import OpenAIPeer, UvicornThread
from tests.runner.helpers import EXAMPLE_RECIPES, GENERATE_STEPS, TEN_TOKENS, parse_sse, write_recipe
from tests.runner.test_app import runner_command, wait_healthy

pytestmark = pytest.mark.integration

SSE = {"accept": "text/event-stream"}


@pytest.fixture(scope="module")
def peer_server() -> Iterator[OpenAIPeer]:
    with OpenAIPeer() as server:
        yield server


@pytest.fixture
def peer(peer_server: OpenAIPeer) -> OpenAIPeer:
    return peer_server.reset()


async def timed_events(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None,
                       on_token: Callable[[], None] | None = None) -> list[tuple[float, str, Any]]:
    """[(seconds since the request, event, data)] of an SSE answer, timed as each event arrives.
    `on_token` runs as each token event arrives (to let a held-back backend send the next one); the
    whole answer is given up on after 60 s (a buffered stream that waits for it never finishes)."""
    out: list[tuple[float, str, Any]] = []
    started = time.perf_counter()

    async def read() -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            async with client.stream("POST", url + path, json=body, headers={**SSE, **(headers or {})}) as response:
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/event-stream")
                event = None
                async for line in response.aiter_lines():
                    if line.startswith("event: "):
                        event = line[len("event: "):]
                    elif line.startswith("data: "):
                        out.append((time.perf_counter() - started, event, json.loads(line[len("data: "):])))
                        if event == "token" and on_token is not None:
                            on_token()

    await asyncio.wait_for(read(), 60)  # give up waiting only
    return out


class LockstepBackend(MockBackend):
    """The MockBackend stand-in, except that each token after the first is produced only once the
    client has received the one before (`received`, released by the test). A stream buffered anywhere
    between backend and client deadlocks, and the test gives up: an ordering, not a rate."""

    def __init__(self, token_delay: float) -> None:
        super().__init__(token_delay)
        self.received = threading.Semaphore(0)

    async def stream(self, prompt: str, *, system: str | None = None, max_tokens: int = 256) -> AsyncIterator[str]:
        first = True
        async for token in super().stream(prompt, system=system, max_tokens=max_tokens):
            if not first and not await asyncio.to_thread(self.received.acquire, True, 60):
                raise RuntimeError("the client never received the previous token: the stream is buffered")
            first = False
            yield token


async def test_first_token_reaches_the_client_long_before_the_workflow_finishes(tmp_path: Path) -> None:
    """MockBackend: 10 tokens, 0.2 s each, each sent only after the client received the one before."""
    recipe = load_recipe_dir(write_recipe(tmp_path, GENERATE_STEPS))
    backend = LockstepBackend(token_delay=0.2)
    with UvicornThread(create_app(recipe, backend, "rel-s")) as server:
        events = await timed_events(server.url, "/invoke", {}, on_token=backend.received.release)
    kinds = [event for _, event, _ in events]
    assert kinds == ["token"] * 10 + ["result"]
    assert events[-1][0] >= 1.9, "ten tokens at 0.2 s cannot take less"  # a lower bound: the waits were honoured
    assert "".join(data["text"] for _, event, data in events if event == "token") == TEN_TOKENS
    assert events[-1][2]["output"] == TEN_TOKENS and events[-1][2]["steps"]["words"]["ms"] >= 1900


async def test_chat_streams_an_upstream_peer_token_by_token(tmp_path: Path, peer: OpenAIPeer) -> None:
    """HTTPBackend -> peer (0.1 s per token) -> runner /chat SSE: each token as it arrives."""
    # The peer sends one token and holds the rest back until the client has that one (an ordering).
    peer.configure(token_delay=0.1, stall_after=1, hang_s=600)
    recipe = load_recipe_dir(write_recipe(tmp_path, "- {id: answer, tool: llm.generate, params: {prompt: '{message}'}}"))
    backend = HTTPBackend(peer.url, "peer-model", api_key="k-123")
    with UvicornThread(create_app(recipe, backend, None)) as server:
        events = await timed_events(server.url, "/chat", {"messages": [{"role": "user", "content": TEN_TOKENS}], "stream": True},
                                    on_token=peer.release_hangs)
    tokens = [(at, data["text"]) for at, event, data in events if event == "token"]
    assert "".join(text for _, text in tokens) == TEN_TOKENS and len(tokens) == 10
    assert events[-1][0] >= 1.0  # a lower bound: ten tokens at 0.1 s
    assert events[-1][1] == "result" and events[-1][2]["output"] == TEN_TOKENS
    assert peer.requests[-1].json["stream"] is True and peer.requests[-1].headers["authorization"] == "Bearer k-123"


@pytest.mark.parametrize(
    ("knobs", "status", "type_"),
    [
        ({"fail_status": 503, "fail_message": "no GPUs left"}, 502, "upstream_bad_status"),
        ({"hang_s": 3}, 504, "upstream_timeout"),
        ({"malformed": "json"}, 502, "upstream_bad_response"),
        (None, 502, "upstream_unavailable"),
    ],
)
async def test_upstream_failures_name_their_kind_in_json_and_in_streams(
    tmp_path: Path, peer: OpenAIPeer, knobs: dict[str, Any] | None, status: int, type_: str
) -> None:
    recipe = load_recipe_dir(write_recipe(tmp_path, "- {id: answer, tool: llm.generate, params: {prompt: '{message}'}}"))
    url = peer.url if knobs is not None else f"http://127.0.0.1:{free_port()}"
    peer.configure(**(knobs or {}))
    backend = HTTPBackend(url, "m", timeout_s=0.5)
    body = {"messages": [{"role": "user", "content": "hello"}]}
    with UvicornThread(create_app(recipe, backend, None)) as server:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            response = await client.post(server.url + "/chat", json=body)
            streamed = await client.post(server.url + "/chat", json={**body, "stream": True})
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == type_ and error["step"] == "answer"
    if knobs and "fail_message" in knobs:
        assert "HTTP 503" in error["message"] and "no GPUs left" in error["message"]
    assert streamed.status_code == 200
    [(event, data)] = parse_sse(streamed.text)
    assert event == "error" and set(data) == {"error"} and set(data["error"]) == {"type", "message", "step"}
    assert (data["error"]["type"], data["error"]["step"]) == (type_, "answer")


async def test_a_client_that_goes_away_cancels_the_invocation(tmp_path: Path) -> None:
    recipe = load_recipe_dir(write_recipe(
        tmp_path,
        "- {id: out, tool: python}",
        """
        import asyncio
        STATE = []
        async def out(ctx):
            try:
                for n in range(100):
                    await asyncio.sleep(0.05)
                    yield f"t{n} "
                STATE.append("finished")
            except BaseException:
                STATE.append("cancelled")
                raise
        """,
    ))
    with UvicornThread(create_app(recipe, MockBackend(), None)) as server:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            async with client.stream("POST", server.url + "/invoke", json={}, headers=SSE) as response:
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("event: token")
                    if seen == 2:
                        break
        deadline = time.monotonic() + 3
        while not recipe.module.STATE and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    assert recipe.module.STATE == ["cancelled"]


@pytest.mark.parametrize("name", ["post-generator", "booking-triage", "trend-monitor"])
async def test_example_recipes_stream_through_chat(name: str) -> None:
    recipe = load_recipe_dir(EXAMPLE_RECIPES / name / "1.0.0")
    content = {"post-generator": "code review", "booking-triage": "Do you allow dogs on the terrace?",
               "trend-monitor": "@acme is down again #outage\n@acme support is great"}[name]
    with UvicornThread(create_app(recipe, MockBackend(token_delay=0.01), None)) as server:
        events = await timed_events(server.url, "/chat", {"messages": [{"role": "user", "content": content}], "stream": True})
    tokens = "".join(data["text"] for _, event, data in events if event == "token")
    assert len(events) > 5 and events[-1][1] == "result"
    output = events[-1][2]["output"]
    assert tokens.strip() == (output if isinstance(output, str) else output.get("reply", output.get("summary")))


def test_runner_process_with_the_http_backend(tmp_path: Path, peer: OpenAIPeer) -> None:
    recipe = write_recipe(tmp_path, "- {id: answer, tool: llm.generate, params: {prompt: '{message}'}}")
    port = free_port()
    env = {**os.environ, "PEER_KEY": "sk-from-env", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        runner_command(recipe, port, "--backend", "http", "--upstream-url", peer.url, "--model", "peer-model",
                       "--api-key-env", "PEER_KEY", "--upstream-timeout", "5", "--step-cache-size", "0"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    try:
        wait_healthy(process, port)
        response = httpx.post(f"http://127.0.0.1:{port}/chat", json={"messages": [{"role": "user", "content": "hi there"}]},
                              timeout=10, trust_env=False)
        assert response.status_code == 200 and response.json()["output"] == "hi there"
        stats = httpx.get(f"http://127.0.0.1:{port}/stats", timeout=5, trust_env=False).json()
        assert stats["stepCache"]["capacity"] == 0 and stats["invocations"] == 1
        process.terminate()
        _, stderr = process.communicate(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert peer.requests[-1].json["model"] == "peer-model"
    assert peer.requests[-1].headers["authorization"] == "Bearer sk-from-env"
    assert b"sk-from-env" not in stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "http", "--model", "m"], "--backend http needs --upstream-url"),
        (["--backend", "http", "--upstream-url", "http://127.0.0.1:9"], "needs --model"),
        (["--backend", "http", "--upstream-url", "ftp://x", "--model", "m"], "must start with http"),
        (["--backend", "http", "--upstream-url", "http://127.0.0.1:9", "--model", "m", "--api-key-env", "PLNT_NO_SUCH_VAR_XYZ"],
         "PLNT_NO_SUCH_VAR_XYZ: that environment variable is not set"),
        (["--step-cache-size", "-1"], "--step-cache-size must be >= 0"),
    ],
)
def test_runner_process_refuses_bad_backend_options(tmp_path: Path, args: list[str], message: str) -> None:
    recipe = write_recipe(tmp_path, "- {id: answer, tool: llm.generate, params: {prompt: 'x'}}")
    result = subprocess.run(runner_command(recipe, free_port(), *args), capture_output=True, timeout=20)
    assert result.returncode == 2
    assert message in result.stderr.decode()
