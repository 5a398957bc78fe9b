"""STAND-INS for runner processes in the gateway tests: small FastAPI apps speaking the runner's
HTTP protocol (no recipe, no model, no `plnt.runner` code).

They mimic `plnt.runner` (see runner/app.py for the real contract) closely enough for the
gateway: `POST /invoke` and `POST /chat` answering JSON, or SSE (`event: token` per token,
then `event: result`, or `event: error`) with `Accept: text/event-stream` (or `"stream": true`
for /chat); `GET /stats`; `GET /healthz`. Knobs make them slow, stall, fail or hold a stream
open until the test says so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


@dataclass
class FakeRunner:
    """One fake runner release, standing in for a `plnt.runner` process. Mutate the knobs between
    requests as needed."""

    version: str
    workflow: str = "assistant"
    tokens: tuple[str, ...] = ("Hello", " from", " plnt")
    output: Any = None  # default: the tokens joined
    token_delay_s: float = 0.0
    delay_s: float = 0.0  # before answering at all
    hold: asyncio.Event | None = None  # streams: after the first token, wait for this before the rest
    fail_after_tokens: int | None = None  # streams: send an `error` event after this many tokens
    fail_status: int | None = None  # answer /invoke and /chat with this status and an error body
    requests: list[dict[str, Any]] = field(default_factory=list)
    stream_cancelled: list[bool] = field(default_factory=list)  # a stream was cut by the client
    stream_finished: list[bool] = field(default_factory=list)

    def result(self) -> dict[str, Any]:
        output = self.output if self.output is not None else "".join(self.tokens)
        return {
            "workflow": self.workflow,
            "version": self.version,
            "output": output,
            "steps": {"reply": {"ms": 0.1, "cached": False}},
            "release": f"rel-{self.version}",
            "cache": {"hits": 1, "misses": 1},
        }

    async def _events(self) -> AsyncIterator[bytes]:
        try:
            for i, token in enumerate(self.tokens):
                if self.fail_after_tokens is not None and i == self.fail_after_tokens:
                    yield sse("error", {"error": {"type": "step_failed", "message": "tool exploded", "step": "reply"}})
                    return
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                yield sse("token", {"step": "reply", "text": token})
                if i == 0 and self.hold is not None:
                    yield b": ping\n\n"
                    await self.hold.wait()
            yield sse("result", self.result())
            self.stream_finished.append(True)
        except (asyncio.CancelledError, GeneratorExit):
            self.stream_cancelled.append(True)
            raise

    def app(self) -> FastAPI:
        app = FastAPI()

        async def answer(request: Request, stream: bool) -> Response:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.fail_status is not None:
                kind = "invalid_request" if self.fail_status < 500 else "step_failed"
                return JSONResponse({"error": {"type": kind, "message": f"told to fail with {self.fail_status}",
                                               "step": None}}, status_code=self.fail_status)
            if stream:
                return StreamingResponse(self._events(), media_type="text/event-stream",
                                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
            return JSONResponse(self.result())

        @app.post("/invoke")
        async def invoke(request: Request) -> Response:
            body = json.loads(await request.body())
            self.requests.append({"path": "/invoke", "headers": dict(request.headers), "body": body})
            return await answer(request, "text/event-stream" in request.headers.get("accept", ""))

        @app.post("/chat")
        async def chat(request: Request) -> Response:
            body = json.loads(await request.body())
            self.requests.append({"path": "/chat", "headers": dict(request.headers), "body": body})
            if not body.get("messages"):
                return JSONResponse({"error": {"type": "invalid_request", "message": "messages: required",
                                               "step": None, "field": "messages"}}, status_code=422)
            return await answer(request, bool(body.get("stream")) or "text/event-stream" in request.headers.get("accept", ""))

        @app.get("/stats")
        async def stats() -> dict[str, Any]:
            return {"stepCache": {"hits": 3, "misses": 1, "hitRate": 0.75, "size": 1, "capacity": 100},
                    "invocations": len(self.requests)}

        @app.get("/healthz")
        async def healthz() -> dict[str, str]:
            return {"status": "ok", "version": self.version}

        return app
