"""What the gateway answers by itself on its hot paths: the few ASGI steps they share (reading a
bounded body, sending one answer) and the two shapes of its errors.

Invoke and every path but /v1/ answer plnt's `{"error": {"type", "message"}}`; /v1/ answers OpenAI's
`{"error": {"message", "type", "param", "code"}}`. An `ErrorShape` words, in one of the two, the
errors of the steps both hot paths share (forward.py); each path words its own errors itself.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from plnt.core.auth import INVOKE, Grant, missing_scope_message
from plnt.gateway import openai_compat as oai

ASGIScope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON = b"application/json"


class Reply(Exception):
    """Raised inside a handler to answer with an error right away."""

    def __init__(self, status: int, body: bytes, error_type: str, headers: Headers | None = None) -> None:
        self.status = status
        self.body = body
        self.error_type = error_type
        self.headers = headers or []


class ClientGone(Exception):
    """The caller hung up before its request body was read."""


class BodyTooLarge(Exception):
    def __init__(self, declared: int | None = None) -> None:
        self.declared = declared

    def headers(self, limit: int) -> Headers:
        # Answered before the body is read: uvicorn reads and discards the rest of it after
        # the response (closing with unread data would reset the connection, and the client
        # could lose the 413). Only an absurd declared size gets the connection closed.
        if self.declared is not None and self.declared > 8 * limit:
            return [(b"connection", b"close")]
        return []


async def read_body(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The request body, at most `limit` bytes (BodyTooLarge beyond; ClientGone on a hang-up)."""
    if content_length is not None:
        try:
            declared = int(content_length)
        except ValueError:
            declared = 0  # uvicorn already rejects a malformed Content-Length
        if declared > limit:
            raise BodyTooLarge(declared)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise BodyTooLarge
        return body
    parts = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body"):
            return b"".join(parts)


async def respond(send: Send, status: int, body: bytes, headers: Headers, content_type: bytes = JSON) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


def plnt_error(status: int, kind: str, message: str, headers: Headers | None = None, **extra: Any) -> Reply:
    return Reply(status, oai.dumps({"error": {"type": kind, "message": message, **extra}}), kind, headers)


def openai_error(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None,
    headers: Headers | None = None,
) -> Reply:
    return Reply(status, oai.error_body(message, type_, param, code), code or type_, headers)


def json_position(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"


def not_invocable(grant: Grant, what: str, credential: str = "token") -> str:
    """Why `grant` may not invoke `what`: it lacks the scope, or the workflow is not among its own."""
    if not grant.has(INVOKE):
        return missing_scope_message(INVOKE, f"invoking {what}").replace("this token", f"this {credential}")
    return f"this {credential} may not invoke {what}"


def _unauthorized_message(presented: bool) -> str:
    return "invalid bearer token" if presented else "missing bearer token: send 'Authorization: Bearer TOKEN'"


def _challenge(presented: bool) -> Headers:
    return [(b"www-authenticate", b'Bearer realm="plnt"' + (b', error="invalid_token"' if presented else b""))]


def _too_large_message(limit: int) -> str:
    return f"request body is over the {limit} byte limit"


def _unsupported_type_message(content_type: bytes | None) -> str:
    got = content_type.decode("latin-1") if content_type is not None else "no Content-Type"
    return f"send the body as JSON with 'Content-Type: application/json' (got {got})"


class ErrorShape(Protocol):
    """The errors of the shared steps, in one API's shape."""

    internal: bytes  # the 500 body, made once: encoding it per request cost ~2% of a gateway's CPU

    def unauthorized(self, presented: bool) -> Reply: ...
    def too_large(self, limit: int, exc: BodyTooLarge) -> Reply: ...
    def unsupported_type(self, content_type: bytes | None) -> Reply: ...
    def bad_track(self, message: str) -> Reply: ...
    def no_canary(self, message: str) -> Reply: ...
    def not_ready(self, what: str) -> Reply: ...
    def upstream(self, status: int, kind: str, message: str) -> Reply: ...
    def over_quota(self, limit: str, token: str, retry_after_s: int, message: str) -> Reply: ...


def _quota_message(message: str, retry_after_s: int) -> str:
    return f"{message}: retry in {retry_after_s} s (GatewayPolicy limits; GET /usage shows this token's use)"


class PlntErrors:
    internal = oai.dumps({"error": {"type": "internal", "message": "gateway error"}})

    def unauthorized(self, presented: bool) -> Reply:
        return plnt_error(401, "unauthorized", _unauthorized_message(presented), _challenge(presented))

    def too_large(self, limit: int, exc: BodyTooLarge) -> Reply:
        return plnt_error(413, "body_too_large", _too_large_message(limit), exc.headers(limit))

    def unsupported_type(self, content_type: bytes | None) -> Reply:
        return plnt_error(415, "unsupported_media_type", _unsupported_type_message(content_type))

    def bad_track(self, message: str) -> Reply:
        return plnt_error(400, "invalid_track", message)

    def no_canary(self, message: str) -> Reply:
        return plnt_error(409, "no_canary", message)

    def not_ready(self, what: str) -> Reply:
        return plnt_error(503, "not_ready", f"{what} has no promoted release yet", [(b"retry-after", b"5")])

    def upstream(self, status: int, kind: str, message: str) -> Reply:
        return plnt_error(status, kind, message)

    def over_quota(self, limit: str, token: str, retry_after_s: int, message: str) -> Reply:
        kind = "budget_exhausted" if limit == "budget" else "rate_limited"
        return plnt_error(429, kind, _quota_message(message, retry_after_s),
                          [(b"retry-after", str(retry_after_s).encode())], limit=limit, token=token)


class OpenAIErrors:
    internal = oai.error_body("gateway error", "server_error", None, "internal")

    def unauthorized(self, presented: bool) -> Reply:
        return openai_error(401, _unauthorized_message(presented), "invalid_request_error", None, "invalid_api_key",
                            _challenge(presented))

    def too_large(self, limit: int, exc: BodyTooLarge) -> Reply:
        return openai_error(413, _too_large_message(limit), "invalid_request_error", None, "request_too_large",
                            exc.headers(limit))

    def unsupported_type(self, content_type: bytes | None) -> Reply:
        return openai_error(415, _unsupported_type_message(content_type), "invalid_request_error", None,
                            "unsupported_media_type")

    def bad_track(self, message: str) -> Reply:
        return openai_error(400, message, "invalid_request_error", None, "invalid_track")

    def no_canary(self, message: str) -> Reply:
        return openai_error(409, message, "no_canary", "model", "no_canary")

    def not_ready(self, what: str) -> Reply:
        return openai_error(503, f"{what} has no promoted release yet", "server_error", None, "model_not_ready",
                            [(b"retry-after", b"5")])

    def upstream(self, status: int, kind: str, message: str) -> Reply:
        return openai_error(status, message, "server_error", None, kind)

    def over_quota(self, limit: str, token: str, retry_after_s: int, message: str) -> Reply:
        # As OpenAI answers: type `requests` or `tokens` with code rate_limit_exceeded; insufficient_quota.
        type_, code = {"requestsPerMinute": ("requests", "rate_limit_exceeded"),
                       "modelRequestsPerMinute": ("requests", "rate_limit_exceeded"),
                       "tokensPerMinute": ("tokens", "rate_limit_exceeded")}.get(
                           limit, ("insufficient_quota", "insufficient_quota"))
        return openai_error(429, _quota_message(message, retry_after_s), type_, None, code,
                            [(b"retry-after", str(retry_after_s).encode())])


PLNT: ErrorShape = PlntErrors()
OPENAI: ErrorShape = OpenAIErrors()
