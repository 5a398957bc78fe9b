"""The runner's HTTP API: one recipe, served.

Endpoints
=========

``GET /healthz``
    ``{"status": "ok", "workflow", "version", "digest", "release"}``.

``GET /stats``
    ``{"stepCache": {"hits", "misses", "hitRate", "size", "capacity"}, "invocations": N}``;
    `invocations` counts every invocation that started running (JSON or SSE, /invoke or
    /chat, successful or not).

``POST /invoke``
    Body: a JSON object, the workflow's inputs. JSON answer (200)::

        {"workflow": NAME, "version": V, "output": <output step's result>,
         "steps": {STEP_ID: {"ms": float, "cached": bool}, ...},   # in execution order
         "release": ID|null, "cache": {"hits": h, "misses": m}}

    With ``Accept: text/event-stream`` the answer is a stream (below).

``POST /chat``
    Body: ``{"messages": [{"role", "content"}, ...], "stream"?: bool, "max_tokens"?: int}``
    (OpenAI chat shape; other fields, e.g. ``model``, are ignored). The messages become the
    workflow's inputs: ``chat_inputs(messages) -> dict`` of the recipe module if it defines
    one, else ``{"message": <last user message's content>, "messages": messages}`` (content
    given as a list of parts is joined from its ``text`` parts). ``max_tokens`` caps the
    output step's ``llm.generate`` calls. The answer is exactly /invoke's: JSON, or the stream
    below when ``stream`` is true or ``Accept`` includes ``text/event-stream``.

Streams (``Content-Type: text/event-stream``, status 200, sent unbuffered)
--------------------------------------------------------------------------
Each event is ``event: <name>\\ndata: <one-line JSON>\\n\\n``::

    event: token    data: {"step": STEP_ID, "text": TOKEN}   # each token of the output step, as produced
    event: result   data: <the JSON object /invoke answers>   # once, last
    event: error    data: {"error": {"type", "message", "step"}}  # instead of result, last

Tokens come only from the output step, when it is `llm.generate` or a module function that
streams (see `plnt.runner.engine`); the steps before it run first, without events. The
concatenated tokens preview the text; `result` is authoritative. ``: ping`` comment lines
(``: ping\\n\\n``) are sent after every 15 s without an event. Request errors found before the
stream starts (bad JSON, bad messages) are JSON answers with their status, never streams.

Errors
------
JSON: ``{"error": {"type", "message", "step"}}`` (`step` is null when no step is to blame;
/chat validation errors add ``"field"``). Types and statuses (a stream's ``error`` event
carries the same object; its status would have been):

======================  ======  =====================================================
type                    status  when
======================  ======  =====================================================
unsupported_media_type  415     /invoke, /chat: body not sent as JSON (Content-Type)
misdirected_request     421     served on loopback: a Host that is not a loopback name
invalid_request         422     body is not a JSON object (or nests deeper than 100); bad /chat fields
invalid_input           422     an input the workflow's templates use is missing (`field` names it)
step_failed             500     a step raised (`step` names it)
upstream_unavailable    502     the model server refused the connection / DNS failed
upstream_bad_status     502     the model server answered non-2xx (its message included)
upstream_bad_response   502     the model server's answer was malformed
upstream_timeout        504     the model server did not answer in time
internal                500     the output is not JSON-serialisable; an engine bug
======================  ======  =====================================================
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, Response, StreamingResponse
from plnt.core import telemetry
from plnt.core.auth import LoopbackHostGuard, TokenSet, is_json_media, open_gateway_hosts
from plnt.core.limits import JSONTooDeep
from plnt.core.limits import loads as bounded_loads
from plnt.core.routes import SHADOW_HEADER
from plnt.runner.adapters import RuntimeAdapter, UpstreamError
from plnt.runner.cache import DEFAULT_CAPACITY, StepCache
from plnt.runner.engine import InvalidInput, StepFailed, WorkflowResult, check_inputs, required_inputs, run_workflow
from plnt.runner.recipe import Recipe

log = logging.getLogger("plnt.runner")

PING_INTERVAL_S = 15.0
SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
UPSTREAM_STATUS = {"unavailable": 502, "bad_status": 502, "bad_response": 502, "timeout": 504}


class RequestError(Exception):
    """A request the runner refuses before running anything (422)."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def _error_body(type_: str, message: str, step: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message, "step": step, **extra}}


def _failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """(status, error body) for an invocation that failed."""
    if isinstance(exc, InvalidInput):
        return 422, _error_body("invalid_input", exc.message, exc.step, field=exc.field)
    if isinstance(exc, StepFailed):
        if isinstance(exc.cause, UpstreamError):
            cause = exc.cause
            return UPSTREAM_STATUS.get(cause.kind, 502), _error_body(f"upstream_{cause.kind}", cause.message, exc.step)
        return 500, _error_body("step_failed", exc.message, exc.step)
    return 500, _error_body("internal", f"{type(exc).__name__}: {exc}")


def _last_user_content(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    raise RequestError("messages has no message with role 'user'", "messages")


def message_text(content: Any) -> str:
    """The text of an OpenAI message `content`: a string, or a list of parts (`text` ones joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"] for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text" and isinstance(part.get("text"), str)
        )
    raise RequestError("message content must be a string or a list of content parts", "messages")


def _parse_chat(body: Any) -> tuple[list[dict[str, Any]], bool, int | None]:
    if not isinstance(body, dict):
        raise RequestError(f"body must be a JSON object, got {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {role, content} objects", "messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError(f"messages[{index}] must be an object with a string role", f"messages[{index}]")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise RequestError("stream must be a boolean", "stream")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1):
        raise RequestError("max_tokens must be a positive integer", "max_tokens")
    return messages, stream, max_tokens


def _sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def wants_event_stream(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "").lower()


def create_app(
    recipe: Recipe,
    adapter: RuntimeAdapter,
    release_id: str | None,
    *,
    step_cache_size: int = DEFAULT_CAPACITY,
    ping_interval_s: float = PING_INTERVAL_S,
    host: str | None = None,
) -> FastAPI:
    """`host`: the address served on; on a loopback one, requests must name a loopback Host
    (the runner has no auth: this keeps web pages using DNS rebinding out)."""
    workflow = recipe.workflow.metadata
    cache = StepCache(step_cache_size)
    chat_inputs = getattr(recipe.module, "chat_inputs", None) if recipe.module is not None else None
    counters = {"invocations": 0}
    required = required_inputs(recipe)  # checked before anything runs: a missing one is a 422

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            close = getattr(adapter, "aclose", None)
            if close is not None:
                await close()

    app = FastAPI(
        title=f"plnt runner: {workflow.name}@{workflow.version}", docs_url=None, redoc_url=None, openapi_url=None,
        lifespan=lifespan,
    )
    app.state.step_cache = cache
    app.state.adapter = adapter
    allowed_hosts = open_gateway_hosts(host, TokenSet()) if host is not None else None
    if allowed_hosts is not None:
        app.add_middleware(LoopbackHostGuard, allowed=allowed_hosts)

    health = {
        "status": "ok",
        "workflow": workflow.name,
        "version": workflow.version,
        "digest": recipe.digest,
        "release": release_id,
    }

    def result_body(result: WorkflowResult) -> dict[str, Any]:
        return {
            "workflow": workflow.name,
            "version": workflow.version,
            "output": jsonable_encoder(result.output),  # TypeError/ValueError if it cannot be
            "steps": {step_id: {"ms": ms, "cached": step_id in result.cached} for step_id, ms in result.timings_ms.items()},
            "release": release_id,
            "cache": {"hits": result.cache_hits, "misses": result.cache_misses},
        }

    trace_attributes = {"plnt.recipe": workflow.name, "plnt.version": workflow.version, "plnt.release": release_id}

    async def run(inputs: dict[str, Any], max_tokens: int | None, sink: Any = None,
                  trace: Any = None) -> dict[str, Any]:
        """Run once; returns the result body. Raises StepFailed, or anything for `internal`.
        `trace`: the request's headers, read for its W3C traceparent when tracing is on, and for
        X-Plnt-Shadow: 1 (the gateway's mirror of a live request: sideEffects steps are not run)."""
        counters["invocations"] += 1
        shadow = trace is not None and trace.get(SHADOW_HEADER) == "1"
        if telemetry.ENABLED:  # the gateway's trace goes on: this invocation, its steps, their LLM calls
            with telemetry.span("runner invoke", trace_attributes, parent=telemetry.extract(trace or {}), kind="server"):
                result = await run_workflow(recipe, inputs, adapter, sink=sink, cache=cache, max_tokens=max_tokens,
                                            shadow=shadow)
        else:
            result = await run_workflow(recipe, inputs, adapter, sink=sink, cache=cache, max_tokens=max_tokens,
                                        shadow=shadow)
        try:
            return result_body(result)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"output of the workflow is not JSON-serialisable: {exc}") from exc

    def log_failure(exc: BaseException) -> None:
        if isinstance(exc, InvalidInput):
            log.info("%s@%s: %s", workflow.name, workflow.version, exc)
        elif isinstance(exc, StepFailed):
            log.warning("%s@%s: %s", workflow.name, workflow.version, exc)
        else:
            log.error("%s@%s: invocation failed", workflow.name, workflow.version, exc_info=exc)

    async def answer_json(inputs: dict[str, Any], max_tokens: int | None, trace: Any = None) -> Response:
        try:
            body = await run(inputs, max_tokens, trace=trace)
        except Exception as exc:
            log_failure(exc)
            status, error = _failure(exc)
            return JSONResponse(error, status_code=status)
        return JSONResponse(body)

    def answer_stream(inputs: dict[str, Any], max_tokens: int | None, trace: Any = None) -> Response:
        async def events() -> AsyncIterator[bytes]:
            queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

            def on_token(step_id: str, text: str) -> None:
                queue.put_nowait(("token", {"step": step_id, "text": text}))

            async def work() -> None:
                try:
                    body = await run(inputs, max_tokens, sink=on_token, trace=trace)
                except Exception as exc:
                    log_failure(exc)
                    queue.put_nowait(("error", _failure(exc)[1]))
                else:
                    queue.put_nowait(("result", body))

            task = asyncio.create_task(work())
            try:
                while True:
                    if queue.empty():
                        try:
                            async with asyncio.timeout(ping_interval_s):
                                event, data = await queue.get()
                        except TimeoutError:
                            yield b": ping\n\n"
                            continue
                    else:
                        event, data = queue.get_nowait()
                    yield _sse(event, data)
                    if event != "token":
                        return
            finally:
                if not task.done():  # the client went away: stop the invocation (and its upstream calls)
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)

        return StreamingResponse(events(), media_type="text/event-stream", headers=SSE_HEADERS)

    async def read_json(request: Request) -> Any:
        try:
            return bounded_loads(await request.body())
        except JSONTooDeep as exc:
            raise RequestError(f"body is not accepted: {exc}") from exc
        except (ValueError, UnicodeDecodeError) as exc:
            raise RequestError(f"body is not valid JSON: {exc}") from exc

    def not_json(request: Request) -> JSONResponse | None:
        content_type = request.headers.get("content-type")
        if is_json_media(content_type.encode("latin-1") if content_type is not None else None):
            return None
        return JSONResponse(_error_body("unsupported_media_type", "send the body as JSON with 'Content-Type: "
                                        f"application/json' (got {content_type or 'no Content-Type'})"), status_code=415)

    def refuse(exc: RequestError | InvalidInput) -> JSONResponse:
        if isinstance(exc, InvalidInput):
            return JSONResponse(_failure(exc)[1], status_code=422)
        extra = {"field": exc.field} if exc.field else {}
        return JSONResponse(_error_body("invalid_request", exc.message, **extra), status_code=422)

    # Handlers return responses directly (no response models): nothing to build at startup.
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        return JSONResponse(health)

    @app.get("/stats")
    async def stats() -> JSONResponse:
        return JSONResponse({"stepCache": cache.stats(), "invocations": counters["invocations"]})

    @app.post("/invoke")
    async def invoke(request: Request) -> Response:
        if (refused := not_json(request)) is not None:
            return refused
        try:
            body = await read_json(request)
            if not isinstance(body, dict):
                raise RequestError(f"body must be a JSON object, got {type(body).__name__}")
            check_inputs(required, body)
        except (RequestError, InvalidInput) as exc:
            return refuse(exc)
        if wants_event_stream(request):
            return answer_stream(body, None, request.headers)
        return await answer_json(body, None, request.headers)

    @app.post("/chat")
    async def chat(request: Request) -> Response:
        if (refused := not_json(request)) is not None:
            return refused
        try:
            messages, stream, max_tokens = _parse_chat(await read_json(request))
            if callable(chat_inputs):
                try:
                    inputs = chat_inputs(messages)
                except (ValueError, TypeError, LookupError) as exc:
                    raise RequestError(f"chat_inputs of the recipe rejected the messages: {type(exc).__name__}: {exc}",
                                       "messages") from exc
                except Exception as exc:
                    log.exception("%s@%s: chat_inputs failed", workflow.name, workflow.version)
                    return JSONResponse(_error_body("internal", f"chat_inputs failed: {type(exc).__name__}: {exc}"),
                                        status_code=500)
                if not isinstance(inputs, dict):
                    return JSONResponse(
                        _error_body("internal", f"chat_inputs of the recipe returned {type(inputs).__name__}, not a dict"),
                        status_code=500,
                    )
            else:
                inputs = {"message": _last_user_content(messages), "messages": messages}
            check_inputs(required, inputs)
        except (RequestError, InvalidInput) as exc:
            return refuse(exc)
        if stream or wants_event_stream(request):
            return answer_stream(inputs, max_tokens, request.headers)
        return await answer_json(inputs, max_tokens, request.headers)

    return app
