"""The runner's answer on its way back to the caller: as the runner gave it (invoke, a ModelDeployment's
chat), with its end-to-end headers (upstream.UpstreamResponse.relayed_headers) and X-Plnt-Version and
X-Plnt-Track; a stream chunk by chunk as it arrives, never buffered (`X-Accel-Buffering: no`). A
caller hanging up closes the runner's connection, so the runner can stop working.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

from plnt.core.upstream import UpstreamError, UpstreamResponse, UpstreamTimeout
from plnt.gateway.forward import SSE, Exchange, Outcome
from plnt.gateway.replies import JSON, ErrorShape, Receive, Send, respond


@dataclass(frozen=True, slots=True)
class StreamShape:
    """What a relayed stream's bytes mean to the relay."""

    is_token: Callable[[bytes], bool]  # this chunk carries the first token (time to first token)
    failure_event: Callable[[str, str, bytes], bytes | None]  # (error type, failure, last chunk) -> event or None
    error_marker: bytes | None = None  # a chunk holding it is the upstream's own error event
    # How many token events a chunk holds (time per output token, completion tokens); None: not counted.
    count_tokens: Callable[[bytes], int] | None = None
    # The completion tokens an answer (a stream's usage chunk, or a whole body) says it generated, if it says.
    completion_tokens: Callable[[bytes], int | None] | None = None


class TokenClock:
    """A stream's tokens as they pass: the first's and last's time and how many, for TPOT."""

    __slots__ = ("count", "first", "last", "reported")

    def __init__(self) -> None:
        self.count = 0
        self.first = self.last = 0.0
        self.reported: int | None = None  # what the answer's usage said

    def tokens(self, n: int, now: float) -> None:
        if n <= 0:
            return
        if self.count == 0:
            self.first = now
        self.last = now
        self.count += n

    def into(self, outcome: Outcome) -> None:
        if self.count >= 2:
            outcome.tpot = (self.last - self.first) / (self.count - 1)
        tokens = self.reported if self.reported is not None else self.count
        outcome.tokens = tokens if tokens or self.reported is not None else None


def runner_error_type(body: bytes) -> str:
    """The `error.type` of a runner's (or model server's) error answer, for the metrics."""
    try:
        error = json.loads(body).get("error")
        kind = error.get("type") if isinstance(error, dict) else None
    except (ValueError, AttributeError, RecursionError):
        kind = None
    return kind if isinstance(kind, str) and kind else "runner_error"


async def whole_body(response: UpstreamResponse, errors: ErrorShape) -> bytes:
    """A streamed answer read to its end (502 when the runner breaks off)."""
    try:
        return b"".join([chunk async for chunk in response.chunks()])
    except UpstreamError as exc:
        raise errors.upstream(502, "upstream_error", f"runner failed: {exc}") from None


async def watch_disconnect(receive: Receive, response: UpstreamResponse, gone: list[bool]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.append(True)
            response.close()  # the runner sees the hang-up and can stop working
            return


async def relay(exchange: Exchange, receive: Receive, send: Send, outcome: Outcome, errors: ErrorShape,
                stream: StreamShape | None, *, whole: StreamShape | None = None) -> None:
    """The runner's answer as it gave it, with its end-to-end headers and X-Plnt-Version/-Track. `stream`:
    it was asked to stream; an answer that does stream (200, text/event-stream) is relayed chunk by chunk
    as it arrives; any other (an error, a runner that does not stream) as one body, whose completion
    tokens `whole.completion_tokens` reads (a model's answer says them)."""
    response = exchange.response
    content_type = response.header(b"content-type", JSON) or JSON
    if stream is None or response.status != 200 or not content_type.startswith(SSE):
        body = response.body if stream is None else await whole_body(response, errors)
        outcome.code = response.status
        said = (stream or whole)
        if response.status == 200 and said is not None and said.completion_tokens is not None:
            outcome.tokens = said.completion_tokens(body)
        if response.status >= 400:
            outcome.error_type = runner_error_type(body)
        await respond(send, response.status, body, [*response.relayed_headers(), *exchange.plnt_headers()],
                      content_type)
        return
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type),
                (b"cache-control", response.stream_cache_control()),
                (b"x-accel-buffering", b"no"),
                *response.relayed_headers(stream=True),
                *exchange.plnt_headers(),
            ],
        }
    )
    outcome.started = True
    outcome.code = 200
    gone: list[bool] = []
    watcher = asyncio.create_task(watch_disconnect(receive, response, gone))
    last = b"\n\n"
    clock = TokenClock() if stream.count_tokens is not None else None
    try:
        async for chunk in response.chunks():
            if outcome.ttft is None and stream.is_token(chunk):
                outcome.ttft = time.perf_counter() - outcome.t0
            if clock is not None:
                assert stream.count_tokens is not None
                clock.tokens(stream.count_tokens(chunk), time.perf_counter())
                if stream.completion_tokens is not None and (said := stream.completion_tokens(chunk)) is not None:
                    clock.reported = said
            if stream.error_marker is not None and stream.error_marker in chunk:
                outcome.error_type = "stream_error"
            last = chunk
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except UpstreamError as exc:
        if gone:
            outcome.code, outcome.error_type = 499, "client_disconnected"
            return
        outcome.error_type = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
        event = stream.failure_event(outcome.error_type, str(exc), last)
        if event is not None:
            await send({"type": "http.response.body", "body": event, "more_body": True})
    finally:
        watcher.cancel()
        if clock is not None:
            clock.into(outcome)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
