"""`POST /v1/chat/completions`: OpenAI chat completions, `model` = a workflow's name (or
`namespace/name`), translated to the runner's `POST /chat` (openai_compat.py). A ModelDeployment's
server speaks the OpenAI API itself: its requests go through as sent, its answers come back as given;
with several stable replicas each conversation goes to the one that served it before (affinity.py).
A ModelDeployment with a `fallback` sends the request to that model when it is down or over its own
limit (retry.py says when; one hop): the answer's `model` is the fallback's name, X-Plnt-Fallback names it.

Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}`: 400 for malformed or too deeply
nested JSON and for a model name in several namespaces; the rest as forward.py and app.py say.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

from plnt.core import limits as json_limits
from plnt.core.auth import MODELS, Grant
from plnt.core.routes import PREVIEW_HEADER, TRACK_HEADER, AmbiguousRoute, PreviewNotFound, Route, RouteTable, preview_target
from plnt.core.upstream import UpstreamError, UpstreamTimeout
from plnt.gateway import openai_compat as oai
from plnt.gateway import retry as retries
from plnt.gateway.affinity import conversation_key
from plnt.gateway.forward import (
    SSE,
    Exchange,
    Gateway,
    Outcome,
    StreamShape,
    TokenClock,
    request_headers,
    runner_error_type,
)
from plnt.gateway.relay import RUNNER_STREAM, relay, watch_disconnect, whole_body
from plnt.gateway.replies import (
    OPENAI,
    ASGIScope,
    Receive,
    Reply,
    Send,
    json_position,
    not_invocable,
    openai_error,
    respond,
)
from plnt.gateway.sse import COMMENT, Event, SSEParser

MODEL_PATH = "/v1/chat/completions"
_TRACK = TRACK_HEADER.encode()


def _model_failure_event(kind: str, failure: str, last: bytes) -> bytes:
    return b"data: " + oai.error_body(f"model server stream failed: {failure}", "server_error", None, kind) + b"\n\n"


# A token event: a non-empty "content" string (a first chunk's `"content": ""` or `null` is none). Inside
# the generated text a quote is escaped, so the pattern only meets the JSON's own key.
_TOKEN = re.compile(rb'"content":\s*"(?!")')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":\s*(\d{1,9})')
_PROMPT_TOKENS = re.compile(rb'"prompt_tokens":\s*(\d{1,9})')


def _completion_tokens(body: bytes) -> int | None:
    found = _COMPLETION_TOKENS.search(body)
    return int(found.group(1)) if found else None


def _prompt_tokens(body: bytes) -> int | None:
    found = _PROMPT_TOKENS.search(body)
    return int(found.group(1)) if found else None


# A model server's stream: OpenAI chunks, the first with content is the first token, each with content
# one token (what the smoke test counts too); usage (stream_options.include_usage) says the count.
MODEL_STREAM = StreamShape(is_token=lambda chunk: _TOKEN.search(chunk) is not None,
                           failure_event=_model_failure_event,
                           count_tokens=lambda chunk: len(_TOKEN.findall(chunk)), completion_tokens=_completion_tokens,
                           prompt_tokens=_prompt_tokens)


async def chat(gateway: Gateway, scope: ASGIScope, receive: Receive, send: Send) -> None:
    await gateway.measured("chat", OPENAI, scope, send, lambda outcome: _chat(gateway, scope, receive, send, outcome))


async def _chat(gateway: Gateway, scope: ASGIScope, receive: Receive, send: Send, outcome: Outcome) -> None:
    headers = request_headers(scope)
    grant = gateway.grant(headers.get(b"authorization"), OPENAI)
    gateway.admit(grant, outcome, OPENAI)
    body = await gateway.json_body(receive, headers, OPENAI)
    try:
        request = oai.parse_chat_request(json_limits.loads(body))
    except json_limits.JSONTooDeep as exc:
        raise openai_error(400, f"could not accept the JSON body: {exc}", "invalid_request_error", None,
                           "invalid_json") from None
    except json.JSONDecodeError as exc:
        raise openai_error(400, f"could not parse the JSON body: {json_position(exc)}",
                           "invalid_request_error", None, "invalid_json") from None
    except UnicodeDecodeError as exc:
        raise openai_error(400, f"the body is not UTF-8 at byte {exc.start}", "invalid_request_error",
                           None, "invalid_json") from None
    except oai.InvalidRequest as exc:
        raise openai_error(400, exc.message, "invalid_request_error", exc.param, "invalid_request") from None

    model = request.model
    namespace, _, name = model.rpartition("/")
    if not (grant.allows(namespace, name) if namespace else grant.allows_name(name)) and not grant.has(MODELS):
        raise openai_error(403, not_invocable(grant, f"model {model}", "API key"), "permission_error",
                           "model", "model_not_allowed")
    try:  # X-Plnt-Preview: N goes to the preview of pull request N, and only then (routes.preview_target)
        target = preview_target(name, headers.get(PREVIEW_HEADER.encode()))
    except PreviewNotFound as exc:
        raise openai_error(404, str(exc), "invalid_request_error", "model", "model_not_found") from None
    table = gateway.router.table  # one snapshot for the whole request
    try:
        route = table.lookup(target, namespace or None)
    except AmbiguousRoute as exc:
        choices = ", ".join(f"{ns}/{name}" for ns in exc.namespaces)
        raise openai_error(400, f"model {name!r} is ambiguous; use one of {choices}", "invalid_request_error",
                           "model", "model_ambiguous") from None
    if route is None:
        preview = "" if target == name else f" with a preview for pull request {target.rsplit('--pr', 1)[1]}"
        raise openai_error(404, f"The model `{model}`{preview} does not exist (GET /v1/models lists the workflows)",
                           "invalid_request_error", "model", "model_not_found")
    is_model = route.protocol == "openai"
    if not grant.may_chat(route.namespace, name, is_model=is_model):
        raise openai_error(403, f"this API key may not use model {model}", "permission_error", "model", "model_not_allowed")
    forced, raw_headers = _TRACK in headers, scope["headers"]
    # A model's replicas keep the KV cache of the conversations they read: each conversation keeps its own
    # (affinity.py); worked out only where there is a choice.
    conversation = (conversation_key(request.messages)
                    if is_model and gateway.router.cache_affinity and len(route.stable_replicas) > 1 else None)
    if is_model and route.fallback is not None and not forced:
        exchange = await _model_or_fallback(gateway, table, route, target, name, headers, raw_headers, body,
                                            request, outcome, grant, conversation)
    else:
        if is_model and (over := gateway.model_over_limit(route, OPENAI)) is not None:
            outcome.labels = (route.namespace, name, "", "")
            raise over
        chosen = gateway.choose(route, headers, OPENAI, f"model {model}", raw_headers, conversation)
        # A ModelDeployment's server takes the request as sent; a workflow's runner its own chat body.
        path, runner_body = (MODEL_PATH, body) if is_model else ("/chat", oai.runner_chat_body(request))
        if route.shadow_percent:
            gateway.shadow(route, name, chosen, headers, "chat", path, runner_body,
                           (MODEL_STREAM if is_model else RUNNER_STREAM) if request.stream else None)
        exchange = await gateway.forward(table, route, target, name, chosen, path, runner_body,
                                         content_type="application/json", stream=request.stream, outcome=outcome,
                                         errors=OPENAI, forced=forced, conversation=conversation)
    try:
        if is_model:
            await relay(exchange, receive, send, outcome, OPENAI, MODEL_STREAM if request.stream else None,
                        whole=MODEL_STREAM)
        elif request.stream:
            await _chat_stream(exchange, receive, send, request, outcome)
        else:
            result = _chat_result(exchange.response.status, exchange.response.body)
            outcome.code = 200
            reported = result.get("usage")
            if isinstance(reported, dict) and isinstance(reported.get("completion_tokens"), int):
                outcome.tokens = reported["completion_tokens"]
            if isinstance(reported, dict) and isinstance(reported.get("prompt_tokens"), int):
                outcome.prompt_tokens = reported["prompt_tokens"]
            await respond(send, 200, oai.completion_body(oai.new_id(), model, result, request), exchange.plnt_headers())
    finally:
        exchange.release()


async def _model_or_fallback(gateway: Gateway, table: RouteTable, route: Route, target: str, name: str,
                             headers: dict[bytes, bytes], raw_headers: Any, body: bytes, request: oai.ChatRequest,
                             outcome: Outcome, grant: Grant, conversation: bytes | None = None) -> Exchange:
    """A ModelDeployment's chat; when the model is down or over its own limit (retry.fallback_reason, after
    forward's own retry) and its fallback model is there for this caller, the fallback's answer (one hop:
    its own fallback is not followed). The model's failed attempt is recorded as its own call."""
    failed: Reply | None = None
    exchange: Exchange | None = None
    over = gateway.model_over_limit(route, OPENAI)
    if over is not None or not route.stable_replicas:
        reason: retries.Failure | None = "over_limit" if over is not None else "not_ready"
        outcome.labels = (route.namespace, name, "", "")
        failed = over or OPENAI.not_ready(f"model {request.model}")
    else:
        chosen = gateway.choose(route, headers, OPENAI, f"model {request.model}", raw_headers, conversation)
        if route.shadow_percent:
            gateway.shadow(route, name, chosen, headers, "chat", MODEL_PATH, body,
                           MODEL_STREAM if request.stream else None)
        try:
            exchange = await gateway.forward(table, route, target, name, chosen, MODEL_PATH, body,
                                             content_type="application/json", stream=request.stream, outcome=outcome,
                                             errors=OPENAI, conversation=conversation)
        except Reply as reply:
            reason = retries.fallback_reason(outcome.failure)
            if reason is None:
                raise
            failed = reply
        else:
            reason = retries.fallback_reason(outcome.failure, exchange.response.status)
            if reason is None:
                return exchange
    fallback = _fallback_route(table, route, grant)
    if fallback is not None and gateway.model_over_limit(fallback, OPENAI) is not None:
        fallback = None  # the fallback is at its own limit too
    if fallback is None:  # nowhere to go: the model's own answer
        if exchange is not None:
            return exchange
        assert failed is not None
        raise failed
    assert reason is not None
    if exchange is not None:
        response = exchange.response
        code, error_type = response.status, runner_error_type(response.body) if not request.stream else reason
        exchange.release()
    else:
        assert failed is not None
        code, error_type = failed.status, failed.error_type
    gateway.attempt_failed(outcome, code, error_type, reason)
    namespace, _, version, track = outcome.labels
    # the backend first tried; "not sent" when the model had none to try (not ready, over its capacity)
    outcome.first = f"{track} {version}" if version else "not sent"
    outcome.reason, outcome.fallback_of = reason, name
    gateway.metrics.fell_back(namespace, name, fallback.name, reason)
    chosen = gateway.choose(fallback, headers, OPENAI, f"model {fallback.name}", raw_headers, conversation)
    said = request.model.rpartition("/")[0]  # the caller's form: with a namespace if it gave one
    exchange = await gateway.forward(table, fallback, fallback.name, fallback.name, chosen, MODEL_PATH,
                                     _renamed(body, f"{said}/{fallback.name}" if said else fallback.name),
                                     content_type="application/json", stream=request.stream, outcome=outcome,
                                     errors=OPENAI, conversation=conversation)
    exchange.fallback = fallback.name
    return exchange


def _fallback_route(table: RouteTable, route: Route, grant: Grant) -> Route | None:
    """The route of `route`'s fallback model, when it is a model with a promoted release this caller may use."""
    assert route.fallback is not None
    fallback = table.lookup(route.fallback, route.namespace)
    if fallback is None or fallback.protocol != "openai" or not fallback.stable_replicas:
        return None
    return fallback if grant.may_chat(fallback.namespace, fallback.name, is_model=True) else None


def _renamed(body: bytes, model: str) -> bytes:
    """The chat request with `model` naming the fallback (a model server names in its answer the model asked)."""
    request = json_limits.loads(body)  # parsed once already: within the limits
    request["model"] = model
    return oai.dumps(request)


def _chat_result(status: int, body: bytes) -> dict[str, Any]:
    """The runner's result JSON, or a Reply in OpenAI's error shape."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        data = None
    if status == 200 and isinstance(data, dict):
        return data
    if status == 200:
        raise openai_error(502, "the runner answered something that is not a JSON result", "server_error",
                           None, "bad_upstream_response")
    error = data.get("error") if isinstance(data, dict) else None
    error = error if isinstance(error, dict) else {}
    message = error.get("message") if isinstance(error.get("message"), str) else f"runner answered {status}"
    code = error.get("type") if isinstance(error.get("type"), str) else "runner_error"
    if status < 500:
        return_status = 400 if status == 422 else status
        param = error.get("field") if isinstance(error.get("field"), str) else None
        raise openai_error(return_status, message, "invalid_request_error", param, code)
    raise openai_error(status, message, "server_error", None, code)


class _ChunkTranslation:
    """A runner's SSE events (`token`, `result`, `error`, comments) as OpenAI stream chunks."""

    def __init__(self, writer: oai.ChunkWriter, request: oai.ChatRequest) -> None:
        self.writer = writer
        self.request = request
        self.streamed: list[str] = []  # the token texts sent so far
        self.finished = False  # a result or an error ended the stream
        self.failed = False  # ... an error

    def chunks(self, event: Event) -> list[bytes]:
        writer = self.writer
        if event.event == "token":
            try:
                text = json.loads(event.data).get("text")
            except (ValueError, AttributeError, RecursionError):
                text = None
            if isinstance(text, str) and text:
                self.streamed.append(text)
                return [writer.content(text)]
        elif event.event == "result":
            self.finished = True
            return self._result(event.data)
        elif event.event == "error":
            try:
                error = json.loads(event.data).get("error") or {}
            except (ValueError, AttributeError, RecursionError):
                error = {}
            message = error.get("message") if isinstance(error, dict) else None
            code = error.get("type") if isinstance(error, dict) else None
            self.finished = self.failed = True
            return [writer.error(message or "the workflow failed", "server_error", code or "runner_error")]
        elif event.event == COMMENT:
            return [b": ping\n\n"]
        return []

    def _result(self, data: str) -> list[bytes]:
        try:
            result = json.loads(data)
        except (ValueError, RecursionError):
            result = {}
        result = result if isinstance(result, dict) else {}
        reply = oai.reply_text(result.get("output"))
        sent = "".join(self.streamed)
        out = []
        if reply.startswith(sent) and len(reply) > len(sent):
            # Nothing (or only part) was streamed as tokens: send the rest now.
            out.append(self.writer.content(reply[len(sent):]))
        out.append(self.writer.stop())
        if self.request.include_usage:
            out.append(self.writer.usage(oai.usage(result, self.request, reply, len(self.streamed) or None)))
        out.append(self.writer.DONE)
        return out


async def _chat_stream(exchange: Exchange, receive: Receive, send: Send, request: oai.ChatRequest,
                       outcome: Outcome) -> None:
    response = exchange.response
    content_type = response.header(b"content-type", b"") or b""
    if response.status != 200 or not content_type.startswith(SSE):
        _chat_result(response.status, await whole_body(response, OPENAI))  # raises for errors
        raise openai_error(502, "the runner did not stream although asked to", "server_error", None,
                           "bad_upstream_response")
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
                *exchange.plnt_headers(),
            ],
        }
    )
    outcome.started = True
    outcome.code = 200
    writer = oai.ChunkWriter(oai.new_id(), request.model, f"plnt-{exchange.backend.version}")
    await send({"type": "http.response.body", "body": writer.first(), "more_body": True})
    translation = _ChunkTranslation(writer, request)
    parser = SSEParser()
    gone: list[bool] = []
    watcher = asyncio.create_task(watch_disconnect(receive, response, gone))
    clock = TokenClock()
    try:
        async for chunk in response.chunks():
            out: list[bytes] = []
            streamed = len(translation.streamed)
            for event in parser.feed(chunk):
                out.extend(translation.chunks(event))
                if translation.finished:
                    break
            clock.tokens(len(translation.streamed) - streamed, time.perf_counter())
            if translation.failed:
                outcome.error_type = "stream_error"
            if out:
                if outcome.ttft is None and translation.streamed:
                    outcome.ttft = time.perf_counter() - outcome.t0
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if translation.finished:
                break
        if not translation.finished:
            outcome.error_type = "stream_error"
            await send({"type": "http.response.body", "more_body": True,
                        "body": writer.error("the runner ended the stream without a result", "server_error",
                                             "upstream_error")})
    except UpstreamError as exc:
        if gone:
            outcome.code, outcome.error_type = 499, "client_disconnected"
            return
        kind = "upstream_timeout" if isinstance(exc, UpstreamTimeout) else "upstream_error"
        outcome.error_type = kind
        await send({"type": "http.response.body", "more_body": True,
                    "body": writer.error(f"runner stream failed: {exc}", "server_error", kind)})
    finally:
        watcher.cancel()
        clock.into(outcome)
    await send({"type": "http.response.body", "body": b"", "more_body": False})
