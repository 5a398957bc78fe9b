"""What headers the gateway answers with: a runner's or model server's end-to-end headers relayed
(x-request-id reaches the official `openai` client), hop-by-hop ones and the gateway's own not; and
`Retry-After` on a `/healthz` that is not ready yet.

Stand-ins, declared: the model servers and runners behind the gateway are `RawServer`s
(tests/core/test_upstream.py) answering hand-written HTTP bytes, the header set of an
OpenAI-compatible server (llama.cpp, OpenAI) plus hop-by-hop and spoofing ones no library server
would send on cue. The gateway, its HTTP client and the `openai` client are the real ones.
tests/models/test_llama_headers.py does the same through a real llama.cpp server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import httpx
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.upstream import UpstreamResponse
from plnt.gateway.role import GatewayRole, GatewayRoleConfig
from plnt.gateway.route_watch import RouteTableDoc, routes_doc
from plnt.gateway.router import Router

from tests.core.test_upstream import RawServer, Responder, raw_server  # noqa: F401 - the fixture
from tests.gateway.conftest import StartGateway

StartRaw = Callable[[Responder], Awaitable[RawServer]]
REQUEST_ID = "req_7f3a9c0e5b1d"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "say hello"}]

# What an OpenAI-compatible server answers with, end to end: all of it must reach the caller.
END_TO_END = (b"x-request-id: " + REQUEST_ID.encode() + b"\r\nopenai-processing-ms: 42\r\nvary: Origin, Accept-Encoding\r\n"
              b"x-ratelimit-remaining-requests: 99\r\n")
# What must not: hop-by-hop (one named by Connection), the gateway's own, origin-wide ones.
NOT_RELAYED = (b"Connection: keep-alive, X-Hop-Secret\r\nX-Hop-Secret: for-the-gateway-only\r\n"
               b"Keep-Alive: timeout=5, max=100\r\nTrailer: x-checksum\r\nServer: standin-model-server\r\n"
               b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\nSet-Cookie: session=from-a-backend; Path=/\r\n"
               b"X-Plnt-Version: 6.6.6-spoofed\r\nX-Plnt-Track: canary\r\n"
               b"Access-Control-Allow-Origin: https://evil.example\r\nStrict-Transport-Security: max-age=31536000\r\n")
LEAKS = ("x-hop-secret", "keep-alive", "trailer", "x-checksum", "set-cookie", "access-control-allow-origin", "strict-transport-security")


def completion_json() -> bytes:
    return json.dumps({"id": "chatcmpl-standin", "object": "chat.completion", "created": 0, "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}}).encode()


def chunk_json(delta: dict[str, str], finish: str | None = None) -> bytes:
    return b"data: " + json.dumps({"id": "chatcmpl-standin", "object": "chat.completion.chunk", "created": 0,
                                   "model": "m", "choices": [{"index": 0, "delta": delta,
                                                              "finish_reason": finish}]}).encode() + b"\n\n"


def chunked(*pieces: bytes) -> bytes:
    # With the trailer field the Trailer header announces: not merged into the relayed headers.
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\nx-checksum: abc\r\n\r\n"


def answering(content_type: bytes, pieces: tuple[bytes, ...], extra: bytes = b"") -> Responder:
    """A server that answers every request with these headers and a chunked body."""
    async def respond(_request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type + b"\r\ntransfer-encoding: chunked\r\n"
                     + END_TO_END + NOT_RELAYED + extra + b"\r\n" + chunked(*pieces))
        await writer.drain()
        return True
    return respond


def model_server(stream: bool) -> Responder:
    if stream:
        return answering(b"text/event-stream", (chunk_json({"role": "assistant", "content": ""}),
                                                chunk_json({"content": "hello"}), chunk_json({}, "stop"),
                                                b"data: [DONE]\n\n"),
                         b"Cache-Control: no-store\r\nX-Accel-Buffering: yes\r\n")
    return answering(b"application/json", (completion_json(),), b"Cache-Control: no-store\r\n")


def runner(stream: bool) -> Responder:
    result = {"workflow": "wf", "version": "1.0.0", "output": "hello"}
    if stream:
        return answering(b"text/event-stream", (b'event: token\ndata: {"text":"hello"}\n\n',
                                                b"event: result\ndata: " + json.dumps(result).encode() + b"\n\n"),
                         b"Cache-Control: no-store\r\n")
    return answering(b"application/json", (json.dumps(result).encode(),))


def gateway_router(server: RawServer, protocol: str) -> Router:
    backend = Backend(endpoint=server.url, version="1.0.0", release_id="rel-1.0.0")
    name = "smollm2" if protocol == "openai" else "wf"
    return Router(RouteTable([Route("default", name, stable=backend, protocol=protocol)]))  # type: ignore[arg-type]


def assert_relayed_not_leaked(headers: httpx.Headers, *, stream: bool) -> None:
    assert headers["x-request-id"] == REQUEST_ID
    assert headers["openai-processing-ms"] == "42" and headers["vary"] == "Origin, Accept-Encoding"
    assert headers["x-ratelimit-remaining-requests"] == "99"
    for name in LEAKS:
        assert name not in headers, (name, headers)
    assert "x-hop-secret" not in headers.get("connection", "").lower()
    assert headers.get_list("x-plnt-version") == ["1.0.0"] and headers.get_list("x-plnt-track") == ["stable"]
    assert headers.get_list("server") == ["uvicorn"] and len(headers.get_list("date")) == 1  # the gateway's own
    assert headers.get_list("cache-control") == ["no-store"]  # stricter than the gateway's no-cache: it wins
    if stream:
        assert headers.get_list("x-accel-buffering") == ["no"]  # the gateway's, or a proxy in front buffers
        assert headers.get_list("transfer-encoding") == ["chunked"]  # the gateway's own framing, once
    else:  # re-framed by the gateway: its length, not the runner's chunks
        assert "transfer-encoding" not in headers and len(headers.get_list("content-length")) == 1


async def test_the_openai_client_gets_the_model_servers_request_id_streamed_and_not(
        raw_server: StartRaw, start_gateway: StartGateway) -> None:  # noqa: F811
    for stream in (False, True):
        gw = await start_gateway(gateway_router(await raw_server(model_server(stream)), "openai"))
        async with AsyncOpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=20) as client:
            if not stream:
                completion = await client.chat.completions.create(model="smollm2", messages=MESSAGES)
                assert completion.choices[0].message.content == "hello"
                assert completion._request_id == REQUEST_ID
            else:
                chunks = await client.chat.completions.create(model="smollm2", messages=MESSAGES, stream=True)
                assert "".join([c.choices[0].delta.content or "" async for c in chunks]) == "hello"
                assert chunks.response.headers["x-request-id"] == REQUEST_ID
            raw = await client.chat.completions.with_raw_response.create(model="smollm2", messages=MESSAGES,
                                                                         stream=stream)
            assert raw.request_id == REQUEST_ID
            assert_relayed_not_leaked(raw.headers, stream=stream)
            if stream:
                await raw.parse().close()


async def test_invoke_relays_a_runners_end_to_end_headers_streamed_and_not(
        raw_server: StartRaw, start_gateway: StartGateway) -> None:  # noqa: F811
    buffered = await start_gateway(gateway_router(await raw_server(runner(stream=False)), "runner"))
    answer = await buffered.client.post("/workflows/wf/invoke", json={"text": "hi"})
    assert answer.status_code == 200 and answer.json()["output"] == "hello"
    assert answer.headers["x-request-id"] == REQUEST_ID
    for name in LEAKS:
        assert name not in answer.headers, name
    assert answer.headers.get_list("x-plnt-version") == ["1.0.0"] and "transfer-encoding" not in answer.headers

    streamed = await start_gateway(gateway_router(await raw_server(runner(stream=True)), "runner"))
    async with streamed.client.stream("POST", "/workflows/wf/invoke", json={"text": "hi"},
                                      headers={"accept": "text/event-stream"}) as answer:
        body = b"".join([piece async for piece in answer.aiter_bytes()])
        assert answer.status_code == 200 and b"event: result" in body
        assert_relayed_not_leaked(answer.headers, stream=True)


def relayed(*headers: tuple[bytes, bytes], stream: bool = False) -> list[tuple[bytes, bytes]]:
    return UpstreamResponse(None, 200, list(headers), b"").relayed_headers(stream=stream)


def cache_control(value: bytes | None) -> bytes:
    return UpstreamResponse(None, 200, [] if value is None else [(b"cache-control", value)], b"").stream_cache_control()


def test_connection_named_headers_are_dropped_wherever_they_come() -> None:
    # Named before or after the Connection header, in any case, with spaces.
    assert relayed((b"x-a", b"1"), (b"connection", b"X-A ,  x-b"), (b"x-b", b"2"), (b"x-c", b"3")) == [(b"x-c", b"3")]
    assert relayed((b"connection", b"close"), (b"keep-alive", b"timeout=5"), (b"x-request-id", b"r")) == [
        (b"x-request-id", b"r")]
    # A stream's cache-control and x-accel-buffering are the gateway's; a buffered answer's are relayed.
    both = ((b"cache-control", b"private"), (b"x-accel-buffering", b"no"))
    assert relayed(*both, stream=True) == [] and relayed(*both) == list(both)


def test_a_streams_cache_control_is_the_runners_only_when_at_least_as_strict() -> None:
    assert cache_control(None) == b"no-cache"
    assert cache_control(b"no-store") == b"no-store"
    assert cache_control(b"private, No-Store") == b"private, No-Store"
    assert cache_control(b"no-cache, private") == b"no-cache, private"
    assert cache_control(b"max-age=3600") == b"no-cache"  # a stream is never cacheable
    assert cache_control(b'no-cache="set-cookie"') == b"no-cache"  # field-scoped: weaker than no-cache


async def test_healthz_before_the_first_route_table_says_when_to_ask_again() -> None:
    role = GatewayRole(GatewayRoleConfig(control_url="http://control.test:8000", internal_token="internal-t", port=0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=role.app), base_url="http://127.0.0.1") as client:
        waiting = await client.get("/healthz")
        assert waiting.status_code == 503 and waiting.json()["status"] == "waiting-for-routes"
        assert waiting.headers["retry-after"] == "2"
        # Its other requests meanwhile say the same.
        assert (await client.get("/workflows")).headers["retry-after"] == waiting.headers["retry-after"]
        role.follower.take(RouteTableDoc(epoch="e1", version=1, routes=routes_doc(RouteTable()), workflows=()))
        ready = await client.get("/healthz")
        assert ready.status_code == 200 and "retry-after" not in ready.headers

