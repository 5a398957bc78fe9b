"""The runner's answer on its way back to the caller: as the runner gave it (invoke, a ModelDeployment's
chat), with its end-to-end headers (upstream.UpstreamResponse.relayed_headers) and X-Plnt-Version and
X-Plnt-Track; a stream chunk by chunk as it arrives, never buffered (`X-Accel-Buffering: no`). A
caller hanging up closes the runner's connection, so the runner can stop working.
"""

from __future__ import annotations

import asyncio

from plnt.core.upstream import UpstreamError, UpstreamResponse, UpstreamTimeout
from plnt.gateway.forward import SSE, Exchange, Outcome, StreamShape, runner_error_type
from plnt.gateway.openai_compat import dumps
from plnt.gateway.replies import JSON, ErrorShape, Receive, Send, respond


def _at_event_boundary(chunk: bytes) -> bool:
    return chunk.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


def _runner_failure_event(kind: str, failure: str, last: bytes) -> bytes | None:
    # A partial event cannot be cancelled in SSE; only after a complete one can an error event
    # follow. Otherwise the stream just ends without a `result`.
    if not _at_event_boundary(last):
        return None
    error = {"error": {"type": kind, "message": f"runner stream failed: {failure}", "step": None}}
    return b"event: error\ndata: " + dumps(error) + b"\n\n"


# A runner's stream (POST /invoke, POST /chat): every event but a comment (keepalive) counts for the
# time to first token.
RUNNER_STREAM = StreamShape(is_token=lambda chunk: not chunk.startswith(b":"), failure_event=_runner_failure_event,
                            error_marker=b"event: error")


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
            if said.prompt_tokens is not None:
                outcome.prompt_tokens = said.prompt_tokens(body)
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
    clock = stream.clock()
    try:
        async for chunk in response.chunks():
            stream.observe(chunk, outcome, clock)
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
