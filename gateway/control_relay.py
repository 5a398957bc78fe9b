"""Control-plane requests that reach a gateway worker of `plnt up` (workers.py), and how they reach
the control plane: the worker forwards them to plnt up's private loopback listener
(`ControlForwarder`, role.py uses it) with the caller's address in a header, and that listener trusts
the header only with the internal token (`TrustForwarded`), so a loopback-only hook stays
loopback-only whichever process accepted the connection.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import httpx
from plnt.core.upstream import HOP_BY_HOP

# Headers a gateway worker adds when it forwards a control-plane request (see TrustForwarded).
FORWARDER_HEADER = b"x-plnt-forwarder"
FORWARDED_FOR_HEADER = b"x-plnt-forwarded-for"
# Never passed on by a forward: hop-by-hop ones (and those a Connection header names, see
# _forwardable), the body's framing, and the forwarder's own (only the worker sets them).
_NOT_FORWARDED = HOP_BY_HOP | {b"content-length", FORWARDER_HEADER, FORWARDED_FOR_HEADER}


def _forwardable(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The end-to-end headers of a forwarded request or answer (names lower case, as ASGI gives them)."""
    named = {token.strip().lower() for k, v in headers if k == b"connection" for token in v.split(b",")}
    return [(k, v) for k, v in headers if k not in _NOT_FORWARDED and k not in named]


# --- plnt up's side ------------------------------------------------------------------------------------


class TrustForwarded:
    """ASGI wrapper for the control plane's private listener: a request forwarded by one of its own
    gateway workers (FORWARDER_HEADER = the internal token) is served as coming from the address the
    worker saw (FORWARDED_FOR_HEADER). The headers are dropped from every request, so nobody else can
    claim an address this way."""

    def __init__(self, app: Any, internal_token: str) -> None:
        self.app = app
        self._token = internal_token.encode()
        self.state = getattr(app, "state", None)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            forwarder = forwarded_for = None
            kept = []
            for key, value in scope["headers"]:
                if key == FORWARDER_HEADER:
                    forwarder = value
                elif key == FORWARDED_FOR_HEADER:
                    forwarded_for = value
                else:
                    kept.append((key, value))
            if forwarder is not None or forwarded_for is not None:
                scope = {**scope, "headers": kept}
                if forwarder is not None and forwarded_for and hmac.compare_digest(forwarder, self._token):
                    scope["client"] = (forwarded_for.decode("latin-1"), 0)
                else:
                    scope["client"] = ("0.0.0.0", 0)  # claimed but not proven: not loopback
        await self.app(scope, receive, send)


# --- the worker's side --------------------------------------------------------------------------------


class ControlForwarder:
    """Forwards a request to the control plane's private listener, streaming the answer back."""

    def __init__(self, control_url: str, internal_token: str, max_body_bytes: int) -> None:
        self.control_url = control_url.rstrip("/")
        self._token = internal_token.encode()
        self.max_body_bytes = max_body_bytes
        # Long-polls (GET /internal/routes from a `plnt gateway`) may take 30 s.
        self._client = httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(60.0, connect=5.0))

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = bytearray()
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body_bytes:
                await _answer(send, 413, "body_too_large", f"request body is over the {self.max_body_bytes} byte limit")
                return
        client = scope.get("client")
        headers = _forwardable(scope["headers"])
        headers += [(FORWARDER_HEADER, self._token),
                    (FORWARDED_FOR_HEADER, (client[0] if client else "0.0.0.0").encode("latin-1"))]
        url = self.control_url + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        request = self._client.build_request(scope["method"], url, headers=headers, content=bytes(body))
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            await _answer(send, 502, "control_unreachable", f"the control plane did not answer ({type(exc).__name__}); "
                          "retry, or check that plnt up is running")
            return
        try:
            out = _forwardable([(k.lower().encode("latin-1"), v.encode("latin-1"))
                                for k, v in response.headers.multi_items()])
            await send({"type": "http.response.start", "status": response.status_code, "headers": out})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await response.aclose()


async def _answer(send: Any, status: int, kind: str, message: str) -> None:
    body = json.dumps({"error": {"type": kind, "message": message}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})
