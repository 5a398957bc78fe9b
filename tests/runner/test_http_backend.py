"""HTTPBackend against the OpenAI-compatible test peer (tests/openai_peer.py), over real HTTP.

The peer is a STAND-IN for a model server (vLLM, OpenAI, ...): it speaks the wire format, and its
reply is deterministic."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from plnt.reconciler.drivers.processes import free_port
from plnt.runner.adapters import HTTPBackend, RuntimeAdapter, UpstreamError

from tests.openai_peer import OpenAIPeer

# No module-wide mark: tests that request a server fixture are marked integration by tests/hygiene.py.

KEY = "sk-test-7f3a9c-do-not-log"


@pytest.fixture(scope="module")
def peer_server() -> Iterator[OpenAIPeer]:
    with OpenAIPeer() as server:
        yield server


@pytest.fixture
def peer(peer_server: OpenAIPeer) -> OpenAIPeer:
    return peer_server.reset()


async def test_complete_posts_a_chat_completion_and_returns_the_content(peer: OpenAIPeer) -> None:
    backend = HTTPBackend(peer.url + "/v1/", "my-model", api_key=KEY)  # an OpenAI-style base URL works too
    assert isinstance(backend, RuntimeAdapter)
    try:
        assert await backend.complete("context\nhello there world", system="Be brief.", max_tokens=50) == "hello there world"
        assert await backend.complete("one two three", max_tokens=2) == "one two "
        client = backend._client
        await backend.complete("again")
        assert backend._client is client, "one client per backend, reused"
    finally:
        await backend.aclose()
    assert backend._client is None
    request = peer.requests[0]
    assert request.path == "/v1/chat/completions"
    assert request.json == {
        "model": "my-model",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "context\nhello there world"}],
        "max_tokens": 50,
    }
    assert request.headers["authorization"] == f"Bearer {KEY}"


async def test_stream_yields_each_delta_as_it_arrives(peer: OpenAIPeer) -> None:
    """The peer sends one token, then holds the rest back until the test has that first token: a
    buffered stream never yields it (the give-up deadline fails the test). An ordering, not a rate."""
    peer.configure(stall_after=1, hang_s=600)
    backend = HTTPBackend(peer.url, "m")
    arrivals: list[str] = []

    async def read() -> None:
        async for token in backend.stream("say: a b c d e f"):
            if not arrivals:
                peer.release_hangs()  # only now may the peer send the rest
            arrivals.append(token)

    try:
        await asyncio.wait_for(read(), 30)  # give up waiting only: a buffered stream would hang here
    finally:
        await backend.aclose()
    assert arrivals == ["say: ", "a ", "b ", "c ", "d ", "e ", "f"]
    request = peer.requests[0]
    assert request.json["stream"] is True and "authorization" not in request.headers
    assert request.headers["accept"] == "text/event-stream"


async def test_upstream_that_refuses_the_connection_is_unavailable() -> None:
    backend = HTTPBackend(f"http://127.0.0.1:{free_port()}", "m")
    for call in (backend.complete("x"), _drain(backend, "x")):
        with pytest.raises(UpstreamError) as failure:
            await call
        assert failure.value.kind == "unavailable" and "unavailable" in failure.value.message
    await backend.aclose()


async def test_an_upstream_that_hangs_is_a_timeout(peer: OpenAIPeer) -> None:
    backend = HTTPBackend(peer.url, "m", timeout_s=0.3)
    try:
        peer.configure(hang_s=5)
        for call in (backend.complete("x"), _drain(backend, "x")):
            # The peer would answer after 5 s: "timeout" proves the 0.3 s timeout fired first.
            with pytest.raises(UpstreamError) as failure:
                await call
            assert failure.value.kind == "timeout"
        peer.configure(hang_s=5, stall_after=2)  # mid-stream: two tokens, then silence
        tokens: list[str] = []
        with pytest.raises(UpstreamError) as failure:
            async for token in backend.stream("a b c d"):
                tokens.append(token)
        assert failure.value.kind == "timeout" and tokens == ["a ", "b "]
    finally:
        await backend.aclose()


@pytest.mark.parametrize("status", [400, 401, 429, 500, 503])
async def test_a_non_2xx_answer_is_bad_status_with_the_upstreams_message(peer: OpenAIPeer, status: int) -> None:
    peer.configure(fail_status=status, fail_message=f"model overloaded ({status})")
    backend = HTTPBackend(peer.url, "m")
    try:
        for call in (backend.complete("x"), _drain(backend, "x")):
            with pytest.raises(UpstreamError) as failure:
                await call
            assert failure.value.kind == "bad_status" and failure.value.status == status
            assert f"HTTP {status}" in failure.value.message and f"model overloaded ({status})" in failure.value.message
    finally:
        await backend.aclose()


async def test_a_wrong_api_key_is_bad_status_401(peer: OpenAIPeer) -> None:
    peer.configure(api_key="the-right-key")
    backend = HTTPBackend(peer.url, "m", api_key=KEY)
    try:
        with pytest.raises(UpstreamError) as failure:
            await backend.complete("x")
    finally:
        await backend.aclose()
    assert failure.value.status == 401 and "Incorrect API key" in failure.value.message
    assert KEY not in failure.value.message


@pytest.mark.parametrize(
    ("malformed", "streaming", "problem"),
    [
        ("json", False, "not JSON"),
        ("fields", False, "no choices[0].message.content"),
        ("json", True, "SSE data is not JSON"),
        ("sse-json", True, "SSE data is not JSON"),
        ("fields", True, "no choices"),
        ("sse", True, "without data: [DONE]"),
        ("truncate", True, "without data: [DONE]"),
    ],
)
async def test_a_malformed_answer_is_bad_response(peer: OpenAIPeer, malformed: str, streaming: bool, problem: str) -> None:
    peer.configure(malformed=malformed)
    backend = HTTPBackend(peer.url, "m")
    try:
        with pytest.raises(UpstreamError) as failure:
            if streaming:
                await _drain(backend, "one two three four")
            else:
                await backend.complete("one two three four")
    finally:
        await backend.aclose()
    assert failure.value.kind == "bad_response" and problem in failure.value.message, failure.value.message


async def test_the_api_key_is_sent_as_bearer_and_never_logged(peer: OpenAIPeer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # httpx and httpcore log requests at DEBUG
    for name in ("httpx", "httpcore"):  # `plnt up` (CLI tests in the same session) quiets them
        caplog.set_level(logging.DEBUG, logger=name)
    backend = HTTPBackend(peer.url, "m", api_key=KEY, timeout_s=0.3)
    errors: list[str] = []
    try:
        assert await backend.complete("x y") == "x y"
        assert "".join([t async for t in backend.stream("x y")]) == "x y"
        for knobs in ({"fail_status": 500}, {"hang_s": 2}, {"malformed": "json"}):
            peer.configure(**knobs)
            with pytest.raises(UpstreamError) as failure:
                await backend.complete("x")
            errors.append(str(failure.value))
            peer.configure(fail_status=None, hang_s=0.0, malformed=None)
    finally:
        await backend.aclose()
    assert [r.headers["authorization"] for r in peer.requests] == [f"Bearer {KEY}"] * 5
    assert caplog.records, "expected some DEBUG logging from httpx to check"
    assert KEY not in caplog.text
    assert KEY not in repr(backend) and KEY not in str(backend)
    assert all(KEY not in error for error in errors)


async def _drain(backend: HTTPBackend, prompt: str) -> str:
    return "".join([token async for token in backend.stream(prompt)])
