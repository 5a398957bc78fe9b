"""A TEST PEER: an OpenAI-compatible chat-completions server written for the tests, a STAND-IN
for a model server (OpenAI, vLLM, ...).

It is a real peer speaking the wire format (a FastAPI app served by uvicorn on 127.0.0.1, on a
free port, in a background thread with its own event loop), so it works from sync and async
tests alike. It is not a model: the reply is deterministic, like the runner's MockBackend.

    with OpenAIPeer() as peer:                       # or OpenAIPeer(...).start() / .stop()
        peer.url                                     # "http://127.0.0.1:PORT" (no /v1)
        peer.configure(token_delay=0.2)              # knobs, see `Behaviour`; reset() restores defaults
        ... POST {peer.url}/v1/chat/completions ...
        peer.requests[-1].json, .headers             # what it received

Endpoints:

- ``POST /v1/chat/completions``: body ``{"model", "messages", "max_tokens"?, "stream"?}``.
  The reply is `Behaviour.reply` if set, else the last non-blank line of the last user
  message (the MockBackend convention); tokens are its whitespace-separated words with their
  trailing whitespace, at most ``max_tokens``. Non-streaming: a ``chat.completion`` object
  (``choices[0].message.content``, ``finish_reason`` "stop" or "length", ``usage``).
  Streaming: ``text/event-stream`` of ``data: {"id", "object": "chat.completion.chunk",
  "created", "model", "choices": [{"index": 0, "delta": {...}, "finish_reason"}]}`` events: a
  first chunk with ``{"role": "assistant", "content": ""}``, one chunk per token, a last chunk
  with an empty delta and the finish_reason, then ``data: [DONE]``.
- ``GET /v1/models``: ``{"object": "list", "data": [{"id": <model>, "object": "model", ...}]}``.

Errors use OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

Malformed = Literal["json", "fields", "sse", "sse-json", "truncate"]


@dataclass(frozen=True)
class Behaviour:
    """The knobs of the peer (all off by default).

    token_delay   seconds before each streamed token (and per token before a whole reply)
    fail_status   answer every completion with this HTTP status and an OpenAI error body
    fail_message  the error message for fail_status
    hang_s        wait this long before answering (headers included): for timeouts
    stall_after   streaming: after this many tokens, stall for hang_s (mid-stream timeout)
    malformed     "json": a body that is not JSON (non-streaming) or `data: {broken` (streaming);
                  "fields": valid JSON without choices (a completion, or a chunk); "sse": lines that are not SSE and no
                  [DONE]; "sse-json": a valid first chunk, then `data: not json`;
                  "truncate": stream some tokens then close without [DONE] or finish_reason
    reply         fixed reply text instead of the echo
    api_key       if set, require `Authorization: Bearer <api_key>` (else 401)
    model         the model id /v1/models lists
    """

    token_delay: float = 0.0
    fail_status: int | None = None
    fail_message: str = "the peer was told to fail"
    hang_s: float = 0.0
    stall_after: int | None = None
    malformed: Malformed | None = None
    reply: str | None = None
    api_key: str | None = None
    model: str = "peer-model"


@dataclass
class ReceivedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any = None
    received_at: float = field(default_factory=time.monotonic)


def tokens_of(text: str, max_tokens: int | None = None) -> list[str]:
    import re

    words = re.findall(r"\S+\s*", text)
    return words if max_tokens is None else words[: max(max_tokens, 0)]


def echo_text(messages: Any) -> str:
    """The last non-blank line of the last user message (string or text parts)."""
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            lines = [line.strip() for line in str(content or "").splitlines() if line.strip()]
            return lines[-1] if lines else ""
    return ""


def _openai_error(status: int, message: str, type_: str = "invalid_request_error", code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "param": None, "code": code}}, status_code=status)


class OpenAIPeer:
    """The test peer; see the module docstring. Thread-safe enough for tests: knobs are one
    immutable `Behaviour` swapped atomically; `requests` is appended under a lock."""

    def __init__(self, behaviour: Behaviour | None = None, *, host: str = "127.0.0.1") -> None:
        self.behaviour = behaviour or Behaviour()
        self.host = host
        self.port = 0
        self._requests: list[ReceivedRequest] = []
        self._lock = threading.Lock()
        self._counter = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None
        self.app = self._make_app()

    # --- control --------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def configure(self, **knobs: Any) -> OpenAIPeer:
        self.behaviour = replace(self.behaviour, **knobs)
        return self

    def reset(self) -> OpenAIPeer:
        self.behaviour = Behaviour(model=self.behaviour.model)
        self.clear_requests()
        return self

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._lock:
            return list(self._requests)

    def clear_requests(self) -> None:
        with self._lock:
            self._requests.clear()

    def start(self, timeout: float = 10.0) -> OpenAIPeer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, timeout_graceful_shutdown=1,
                                lifespan="off")
        self._server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            self._release = asyncio.Event()
            loop.call_soon(started.set)
            try:
                loop.run_until_complete(self._server.serve(sockets=[sock]))  # type: ignore[union-attr]
            finally:
                loop.close()

        self._thread = threading.Thread(target=serve, name=f"openai-peer-{self.port}", daemon=True)
        self._thread.start()
        started.wait(timeout)
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the OpenAI test peer did not start")
            time.sleep(0.01)
        return self

    def release_hangs(self) -> None:
        """End every hang (hang_s, stall_after) in progress now; later ones wait their hang_s again.
        A test that stalls a stream can so prove what arrived before the rest was sent (an ordering)."""
        loop, current = self._loop, self._release
        assert loop is not None and current is not None, "start() the peer first"

        def swap() -> None:
            current.set()
            self._release = asyncio.Event()

        loop.call_soon_threadsafe(swap)

    def stop(self) -> None:
        if self._server is None:
            return
        if self._loop is not None and self._release is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._release.set)  # end every hang now
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = None

    def __enter__(self) -> OpenAIPeer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- the app ----------------------------------------------------------------------------

    async def _hang(self, seconds: float) -> None:
        if seconds <= 0:
            return
        assert self._release is not None
        try:
            await asyncio.wait_for(self._release.wait(), seconds)
        except TimeoutError:
            pass

    def _next_id(self) -> str:
        with self._lock:
            self._counter += 1
            return f"chatcmpl-peer-{self._counter}"

    def _make_app(self) -> FastAPI:
        app = FastAPI(title="OpenAI-compatible TEST PEER", docs_url=None, redoc_url=None, openapi_url=None)
        peer = self

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [
                {"id": peer.behaviour.model, "object": "model", "created": 0, "owned_by": "openai-peer"}]})

        @app.post("/v1/chat/completions")
        async def completions(request: Request) -> Response:
            raw = await request.body()
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            with peer._lock:
                peer._requests.append(ReceivedRequest("POST", request.url.path, dict(request.headers), raw, body))
            b = peer.behaviour
            if b.api_key is not None and request.headers.get("authorization") != f"Bearer {b.api_key}":
                return _openai_error(401, "Incorrect API key provided.", "invalid_request_error", "invalid_api_key")
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                return _openai_error(400, "body must be a JSON object with a list `messages`")
            await peer._hang(b.hang_s if b.stall_after is None else 0.0)
            if b.fail_status is not None:
                return _openai_error(b.fail_status, b.fail_message, "server_error" if b.fail_status >= 500 else "invalid_request_error")
            max_tokens = body.get("max_tokens")
            text = b.reply if b.reply is not None else echo_text(body["messages"])
            all_tokens = tokens_of(text)
            tokens = all_tokens if not isinstance(max_tokens, int) else all_tokens[:max_tokens]
            finish = "length" if len(tokens) < len(all_tokens) else "stop"
            model = str(body.get("model", b.model))
            if body.get("stream"):
                return StreamingResponse(peer._chunks(model, tokens, finish, b), media_type="text/event-stream",
                                         headers={"cache-control": "no-cache"})
            if b.token_delay:
                await asyncio.sleep(b.token_delay * len(tokens))
            if b.malformed == "json":
                return Response(b'{"id": "chatcmpl-broken", "choices": [', media_type="application/json")
            if b.malformed == "fields":
                return JSONResponse({"id": peer._next_id(), "object": "chat.completion", "model": model})
            content = "".join(tokens)
            prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in body["messages"] if isinstance(m, dict))
            return JSONResponse({
                "id": peer._next_id(),
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}],
                "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(tokens),
                          "total_tokens": prompt_tokens + len(tokens)},
            })

        return app

    async def _chunks(self, model: str, tokens: list[str], finish: str, b: Behaviour) -> AsyncIterator[bytes]:
        chunk_id = self._next_id()
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            data = {"id": chunk_id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}
            return f"data: {json.dumps(data)}\n\n".encode()

        if b.malformed == "sse":
            yield b"this is not server-sent events\n\n{\"choices\": []}\n\n"
            return
        if b.malformed == "json":
            yield b'data: {"id": "broken", "choices": [\n\n'
            return
        if b.malformed == "fields":
            yield f"data: {json.dumps({'id': chunk_id, 'object': 'chat.completion.chunk'})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            return
        yield chunk({"role": "assistant", "content": ""})
        if b.malformed == "sse-json":
            yield b"data: not json\n\n"
            return
        for index, token in enumerate(tokens):
            if b.stall_after is not None and index == b.stall_after:
                await self._hang(b.hang_s)
            if b.token_delay:
                await asyncio.sleep(b.token_delay)
            yield chunk({"content": token})
            if b.malformed == "truncate" and index >= len(tokens) // 2:
                return
        yield chunk({}, finish)
        yield b"data: [DONE]\n\n"


class UvicornThread:
    """Serve any ASGI app on 127.0.0.1 (a free port) in a background thread, like the peer.

        with UvicornThread(app) as server: server.url
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1") -> None:
        self.app = app
        self.host = host
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> UvicornThread:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, 0))
        self.port = sock.getsockname()[1]
        self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", access_log=False,
                                                     timeout_graceful_shutdown=1))
        server = self._server
        self._thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True,
                                        name=f"uvicorn-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
            self._server = None

    def __enter__(self) -> UvicornThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
