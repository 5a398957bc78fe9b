"""OpenAI chat-completions shapes: request validation, responses, stream chunks, errors.

The gateway serves `POST /v1/chat/completions` and `GET /v1/models` so that the official
`openai` client works unchanged (`base_url="http://GATEWAY/v1"`, `api_key=<gateway token>`,
`model=<workflow name>` or `"<namespace>/<name>"`). The runner's `POST /chat` does the work;
this module only translates.

Supported request fields: `model`, `messages` (roles system/developer/user/assistant/tool;
content a string, null, or a list of `{"type": "text", "text": ...}` parts), `stream`,
`stream_options.include_usage`, `max_tokens` / `max_completion_tokens`, `n` (1 only), `user`.
Sampling fields (temperature, top_p, seed, stop, ...) are accepted and ignored: a workflow is
not a bare model. Anything else malformed is a 400 `invalid_request_error` naming `param`.

`usage` counts are the runner's if its result carries `usage`; otherwise they are estimates:
whitespace-separated words of the prompt, and token events (streams) or words (otherwise)
of the reply.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Any

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


class InvalidRequest(ValueError):
    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


@dataclass(frozen=True, slots=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]  # normalised: role, content (str), name?
    stream: bool
    max_tokens: int | None
    include_usage: bool


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> bytes:
    return dumps({"error": {"message": message, "type": type_, "param": param, "code": code}})


def _text_content(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequest(f"{where}[{i}] must be an object with a 'type'", f"{where}[{i}]")
            if part["type"] != "text":
                raise InvalidRequest(
                    f"{where}[{i}]: content part type {part['type']!r} is not supported (only 'text')", f"{where}[{i}].type"
                )
            if not isinstance(part.get("text"), str):
                raise InvalidRequest(f"{where}[{i}].text must be a string", f"{where}[{i}].text")
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"{where} must be a string, null or a list of text parts, got {type(content).__name__}", where)


def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a decoded chat-completions body; raises InvalidRequest naming the field."""
    if not isinstance(body, dict):
        raise InvalidRequest(f"request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required: the workflow name (GET /v1/models lists them)", "model")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InvalidRequest("'messages' must be a non-empty array", "messages")
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(raw_messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise InvalidRequest(f"{where} must be an object", where)
        role = message.get("role")
        if role not in ROLES:
            raise InvalidRequest(f"{where}.role must be one of {', '.join(sorted(ROLES))}, got {role!r}", f"{where}.role")
        if "content" not in message and role != "assistant":
            raise InvalidRequest(f"{where}.content is required", f"{where}.content")
        item: dict[str, Any] = {"role": role, "content": _text_content(message.get("content"), f"{where}.content")}
        if isinstance(message.get("name"), str):
            item["name"] = message["name"]
        messages.append(item)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise InvalidRequest("'stream' must be a boolean", "stream")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        param = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        raise InvalidRequest(f"'{param}' must be a positive integer", param)
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest("only n=1 is supported", "n")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise InvalidRequest("'stream_options' must be an object", "stream_options")
    include_usage = bool(options and options.get("include_usage"))
    return ChatRequest(model, messages, stream, max_tokens, include_usage)


def runner_chat_body(request: ChatRequest) -> bytes:
    body: dict[str, Any] = {"messages": request.messages, "stream": request.stream}
    if request.max_tokens is not None:
        body["max_tokens"] = request.max_tokens
    return dumps(body)


def reply_text(output: Any) -> str:
    """The assistant's text from a runner result's `output`."""
    if isinstance(output, str):
        return output
    if isinstance(output, dict) and isinstance(output.get("reply"), str):
        return output["reply"]
    return json.dumps(output, ensure_ascii=False)


def new_id() -> str:
    return "chatcmpl-" + os.urandom(12).hex()


def words(text: str) -> int:
    return len(text.split())


def usage(result: dict[str, Any], request: ChatRequest, reply: str, completion_tokens: int | None = None) -> dict[str, int]:
    reported = result.get("usage") if isinstance(result, dict) else None
    if isinstance(reported, dict) and all(isinstance(reported.get(k), int) for k in ("prompt_tokens", "completion_tokens")):
        prompt, completion = reported["prompt_tokens"], reported["completion_tokens"]
    else:
        prompt = sum(words(m["content"]) for m in request.messages)
        completion = completion_tokens if completion_tokens is not None else words(reply)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion_body(request_id: str, model: str, result: dict[str, Any], request: ChatRequest) -> bytes:
    reply = reply_text(result.get("output"))
    return dumps(
        {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": _fingerprint(result),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": reply, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage(result, request, reply),
        }
    )


def _fingerprint(result: dict[str, Any]) -> str | None:
    version = result.get("version") if isinstance(result, dict) else None
    return f"plnt-{version}" if version else None


class ChunkWriter:
    """`chat.completion.chunk` SSE lines for one streamed completion."""

    def __init__(self, request_id: str, model: str, fingerprint: str | None = None) -> None:
        self.request_id = request_id
        self.model = model
        self.created = int(time.time())
        self.fingerprint = fingerprint
        # Prefix shared by every chunk, serialised once.
        self._head = (
            b'data: {"id":' + dumps(request_id) + b',"object":"chat.completion.chunk","created":'
            + str(self.created).encode() + b',"model":' + dumps(model)
            + b',"system_fingerprint":' + dumps(fingerprint) + b',"choices":'
        )

    def delta(self, delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        return self._head + dumps([choice]) + b"}\n\n"

    def first(self) -> bytes:
        return self.delta({"role": "assistant", "content": ""})

    def content(self, text: str) -> bytes:
        return self.delta({"content": text})

    def stop(self) -> bytes:
        return self.delta({}, "stop")

    def usage(self, usage: dict[str, int]) -> bytes:
        return self._head + b'[],"usage":' + dumps(usage) + b"}\n\n"

    @staticmethod
    def error(message: str, type_: str = "server_error", code: str | None = None) -> bytes:
        return b"data: " + error_body(message, type_, None, code) + b"\n\n"

    DONE = b"data: [DONE]\n\n"


def models_body(models: list[tuple[str, str]]) -> bytes:
    """`GET /v1/models`: (model id, owner namespace) pairs."""
    return dumps({"object": "list", "data": [model_obj(m, owner) for m, owner in models]})


def model_obj(model: str, owner: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": owner}
