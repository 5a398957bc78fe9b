"""Bounds on what one HTTP client can make a server (gateway or runner) read, hold and parse.

- Request heads (request line + headers): at most `max_head_bytes` and `max_headers` fields,
  else `431 Request Header Fields Too Large` and the connection is closed. Counted as bytes
  arrive, before the parser sees them: uvicorn's httptools protocol has no limit of its own
  and would buffer a 96 MiB header whole (quadratically) on the event loop.
- Slow clients: a request head must be complete within `head_timeout_s` of the connection
  opening (or of the previous response), and a body within `body_timeout_s` of its head;
  otherwise the connection is closed (408 if nothing of a response was sent). A slowloris
  holds a socket for at most that long and never the event loop.
- JSON bodies: nesting deeper than `MAX_JSON_DEPTH` is refused (`JSONTooDeep`) instead of
  recursing until Python's RecursionError.

`http_protocol(limits)` is the uvicorn protocol class to pass as `uvicorn.Config(http=...)`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_JSON_DEPTH = 100


@dataclass(frozen=True)
class HttpLimits:
    max_head_bytes: int = 64 * 1024
    max_headers: int = 100
    head_timeout_s: float = 10.0
    body_timeout_s: float = 60.0


class JSONTooDeep(ValueError):
    def __init__(self, limit: int) -> None:
        super().__init__(f"JSON nests deeper than {limit} levels")
        self.limit = limit


def _deeper_than(value: Any, limit: int) -> bool:
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def loads(body: bytes | str, limit: int = MAX_JSON_DEPTH) -> Any:
    """`json.loads` that raises JSONTooDeep (a ValueError) for nesting deeper than `limit`.
    Other errors are json.loads' own (JSONDecodeError, UnicodeDecodeError)."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise JSONTooDeep(limit) from None
    if isinstance(value, (dict, list)):
        # Depth is at most the number of opening brackets: most bodies need no walk.
        raw = body.encode() if isinstance(body, str) else body
        if raw.count(b"[") + raw.count(b"{") > limit and _deeper_than(value, limit):
            raise JSONTooDeep(limit)
    return value


class _HeadTooLarge(Exception):
    pass


_LINGER_S = 2.0


_STATUS_TEXT = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


def _refusal(status: int, kind: str, message: str) -> bytes:
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n"
            % (status, _STATUS_TEXT[status], len(body))) + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with head size/count limits and head/body deadlines.

    Hot path: a request that arrives whole in one read costs a few attribute updates; timers
    are armed only for a new connection and for a head or body still incomplete after a read."""

    limits = HttpLimits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True
        self._head_bytes = 0  # raw bytes received since this head began
        self._head_problem: str | None = None
        self._lingering = False
        self._deadline: asyncio.TimerHandle | None = None
        # uvicorn never times out a connection that sends nothing at all.
        self._arm(self.limits.head_timeout_s)

    def _arm(self, seconds: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _too_slow(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_head:
            if cycle is not None and not cycle.response_complete:
                # A next request pipelined during a long answer: judge it once that is done.
                self._arm(self.limits.head_timeout_s)
                return
            if self._head_bytes:  # an idle connection just closes
                self.transport.write(_refusal(408, "request_timeout",
                                              f"request headers not received within {self.limits.head_timeout_s:g}s"))
        elif cycle is not None and cycle.more_body and not cycle.response_complete:
            if not cycle.response_started:
                self.transport.write(_refusal(408, "request_timeout",
                                              f"request body not received within {self.limits.body_timeout_s:g}s"))
            cycle.disconnected = True  # the app's receive() answers http.disconnect
            cycle.message_event.set()
        else:
            return  # the body completed meanwhile
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # refused: what the client still sends is dropped unread
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._lingering or self.transport.is_closing():
            return
        if self._in_head:
            # Still in a head after this read: the parser holds at most the limit plus one read.
            if self._head_bytes > self.limits.max_head_bytes:
                self._refuse_head(f"request headers are over the {self.limits.max_head_bytes} byte limit")
            elif self._head_bytes and self._deadline is None:
                self._arm(self.limits.head_timeout_s)
        elif self._deadline is None and self.cycle is not None and self.cycle.more_body:
            self._arm(self.limits.body_timeout_s)

    def send_400_response(self, msg: str) -> None:
        if self._head_problem is not None:
            self._refuse_head(self._head_problem)
            return
        super().send_400_response(msg)

    def _refuse_head(self, message: str) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self.transport.write(_refusal(431, "headers_too_large", message))
        # Closing while the client still sends would reset the connection, and a client
        # could lose the 431 with it: end our side, drop what still arrives (without
        # parsing it) for a short while, then close.
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._lingering = True
        self.loop.call_later(_LINGER_S, self.transport.close)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if len(self.headers) > self.limits.max_headers:
            self._head_problem = f"request has more than {self.limits.max_headers} header fields"
            raise _HeadTooLarge  # httptools makes it a parser error: send_400_response above
        if self._head_bytes > self.limits.max_head_bytes:
            # The whole head (and maybe a body) came in one read: measure the head itself.
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > self.limits.max_head_bytes:
                self._head_problem = f"request headers are over the {self.limits.max_head_bytes} byte limit"
                raise _HeadTooLarge
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        # What arrives next is the next request's head.
        self._in_head = True
        self._head_bytes = 0
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().on_message_complete()


def http_protocol(limits: HttpLimits) -> type[LimitedHttpToolsProtocol]:
    """A protocol class with these limits, for `uvicorn.Config(http=...)`."""
    return type("LimitedHttpToolsProtocol", (LimitedHttpToolsProtocol,), {"limits": limits})


__all__ = ["MAX_JSON_DEPTH", "HttpLimits", "JSONTooDeep", "LimitedHttpToolsProtocol", "http_protocol", "loads"]
