"""plnt's signed outgoing webhook: the canary "webhook gate" now, notifications later.

What a receiver gets
--------------------
One POST per call, its body JSON (keys sorted, no spaces), with these headers:

    Content-Type:      application/json
    User-Agent:        plnt
    X-Plnt-Delivery:   a uuid4, new for each delivery (log it, or drop deliveries seen before)
    X-Plnt-Timestamp:  the Unix time in whole seconds when plnt signed the body, e.g. 1718000000
    X-Plnt-Signature:  sha256=<hex>, the HMAC-SHA256 of  f"{timestamp}.".encode() + body  under the shared secret

How a receiver verifies it (what `verify` below does; any language has the same three steps):

1. Take the body as the raw bytes received, before any JSON parsing (re-serialising changes the bytes).
2. Compute hex(HMAC-SHA256(secret, timestamp_header + "." + body)) and compare it with the hex after
   "sha256=" in constant time (Python: hmac.compare_digest). Different: answer 401.
3. Refuse a timestamp more than 5 minutes away from your clock (either way): a captured request
   replayed later fails, since its timestamp is signed.

    import hashlib, hmac, time
    def verify(secret: bytes, timestamp: str, signature: str, body: bytes) -> bool:
        expected = "sha256=" + hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, signature) and abs(time.time() - int(timestamp)) <= 300

What a gate receiver answers
----------------------------
HTTP 200 with the JSON body {"pass": true|false, "reason": "..."} ("reason" optional, at most 500
characters are kept). Anything else is an error whose type says what plnt does next:

- GateUnavailable (the gate is tried again): connection refused, no answer within the timeout, 5xx, 429.
- GateUnusable (a human must fix the receiver or the spec): any other status (plnt follows no
  redirect; a 401/403 means the receiver refused the signature or the secret), a body that is not
  JSON, JSON without a boolean "pass", a body over the cap.

Webhook URLs often carry a token in their path or query, so no message shows the full URL: only
scheme://host[:port]/first-path-segment/... (`display_url`). The secret appears in none either.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import httpx
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from plnt.reconciler.redact import redact
from plnt.reconciler.tls_context import default_tls_context
from pydantic import BaseModel, Field

SIGNATURE_PREFIX = "sha256="
DEFAULT_TOLERANCE_S = 300.0
MAX_REASON_CHARS = 500

# A first path segment shown in messages: a short plain word ("hooks", "services", "v1"). Anything
# longer or odder may be a token (https://webhook.site/<uuid>) and is hidden like the rest.
_SHOWN_SEGMENT = re.compile(r"[A-Za-z0-9._-]{1,24}")


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The X-Plnt-Signature header value: "sha256=" + hex HMAC-SHA256 of f"{timestamp}.".encode() + body."""
    if not secret:
        raise ValueError("refusing to sign with an empty secret")  # an empty key proves nothing
    digest = hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return SIGNATURE_PREFIX + digest


def verify(secret: bytes, timestamp_header: str, signature_header: str, body: bytes, *,
           now: float | None = None, tolerance_s: float = DEFAULT_TOLERANCE_S) -> bool:
    """True when `signature_header` signs `body` at `timestamp_header` under `secret`, and the
    timestamp is within `tolerance_s` of `now` (either way: replay protection). Never raises."""
    if not secret or not timestamp_header.isascii() or not timestamp_header.isdigit():
        return False  # fail closed; isdigit also refuses signs and spaces, which would sign other bytes
    timestamp = int(timestamp_header)
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        return False
    expected = sign(secret, timestamp, body).encode()
    # Bytes, not str: compare_digest raises on non-ASCII str, and a header is the sender's to choose.
    return hmac.compare_digest(expected, signature_header.encode("utf-8", errors="replace"))


def display_url(url: str) -> str:
    """scheme://host[:port]/first-segment/... : never the credentials, query, fragment or the rest of
    the path, where webhook URLs keep their tokens."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = parts.port
    except ValueError:  # a bad port or IPv6 literal
        return "<unparsable webhook URL>"
    if ":" in host:
        host = f"[{host}]"  # IPv6
    shown = f"{parts.scheme or '?'}://{host}" + (f":{port}" if port is not None else "")
    segments = [s for s in parts.path.split("/") if s]
    if segments and _SHOWN_SEGMENT.fullmatch(segments[0]):
        shown += f"/{segments[0]}" + ("/..." if len(segments) > 1 else "")
    elif segments:
        shown += "/..."
    if parts.query or parts.fragment:
        shown += "?..."  # says there was one, shows none of it
    return shown


def _scrub(text: str, url: str, secret: bytes) -> str:
    """`text` (an httpx message, a receiver's reason) without the URL's hidden parts or the secret."""
    hidden = [url, secret.decode("utf-8", errors="ignore")]
    try:
        parts = urlsplit(url)
        hidden += [parts.query, parts.fragment, parts.netloc.rpartition("@")[0], parts.path if len(parts.path) > 1 else ""]
        # A token quoted alone: path segments after the first (the one display_url may show), query values.
        hidden += parts.path.split("/")[2:] + [value for _, value in parse_qsl(parts.query)]
    except ValueError:
        pass  # the whole URL and the secret are still hidden
    # Longest first, so the whole URL goes before its query; tiny pieces would only mangle the text.
    return redact(text, *sorted((h for h in hidden if len(h) >= 4), key=len, reverse=True))


@dataclass(frozen=True)
class SignedResponse:
    """What a receiver answered: the status, the body (at most max_response_bytes) and the headers
    a caller may act on."""

    status: int
    body: bytes
    content_type: str
    retry_after: str | None
    delivery: str  # the X-Plnt-Delivery sent, to match the receiver's logs


def _encode(payload: dict[str, Any]) -> bytes:
    # Sorted and compact: the same payload is the same bytes, easy to diff and to sign.
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


async def post_signed(url: str, secret: bytes, payload: dict[str, Any], *, timeout_s: float = 10.0,
                      max_response_bytes: int = 65536, client: httpx.AsyncClient | None = None) -> SignedResponse:
    """POST `payload` signed to `url` and read the answer, all within `timeout_s`.

    Returns any status (the caller decides what it means). Raises GateUnavailable when the receiver
    cannot be reached or does not answer in time, GateUnusable for a URL plnt will not call or a body
    over `max_response_bytes` (GateUnavailable instead if the status already says "try later")."""
    shown = display_url(url)
    try:
        scheme = urlsplit(url).scheme
    except ValueError:
        scheme = ""
    if scheme not in ("http", "https"):
        raise GateUnusable(f"webhook {shown}: only http and https URLs are called")
    if not secret:
        raise GateUnusable(f"webhook {shown}: the signing secret is empty")
    body = _encode(payload)
    timestamp = int(time.time())
    delivery = str(uuid.uuid4())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "plnt",
        "X-Plnt-Delivery": delivery,
        "X-Plnt-Timestamp": str(timestamp),
        "X-Plnt-Signature": sign(secret, timestamp, body),
        # Counted bytes are decoded bytes; a compressed answer could inflate a lot from one chunk.
        "Accept-Encoding": "identity",
    }
    own = client is None
    # trust_env=False: no proxy or netrc from the environment sees a signed request or its URL.
    http = client or httpx.AsyncClient(trust_env=False, follow_redirects=False, verify=default_tls_context())
    try:
        # One deadline for connect, send and the whole read: httpx's own timeouts are per operation,
        # so a receiver trickling a byte at a time would otherwise hold the gate forever.
        async with asyncio.timeout(timeout_s):
            # follow_redirects per request too: a caller's client may follow them by default.
            async with http.stream("POST", url, content=body, headers=headers, timeout=timeout_s,
                                   follow_redirects=False) as response:
                retry = response.status_code == 429 or response.status_code >= 500
                announced = response.headers.get("content-length", "")
                if announced.isdigit() and int(announced) > max_response_bytes:
                    raise _too_large(shown, response.status_code, max_response_bytes, retry)
                received = bytearray()
                async for chunk in response.aiter_bytes():
                    received += chunk
                    if len(received) > max_response_bytes:
                        raise _too_large(shown, response.status_code, max_response_bytes, retry)
                return SignedResponse(status=response.status_code, body=bytes(received),
                                      content_type=response.headers.get("content-type", ""),
                                      retry_after=response.headers.get("retry-after"), delivery=delivery)
    # `from None` below: httpx's exceptions carry the request, and some messages the full URL.
    except TimeoutError:
        raise GateUnavailable(f"webhook {shown} did not answer within {timeout_s:g} s") from None
    except httpx.TimeoutException:
        raise GateUnavailable(f"webhook {shown} did not answer within {timeout_s:g} s") from None
    except (httpx.UnsupportedProtocol, httpx.LocalProtocolError, httpx.InvalidURL) as exc:
        raise GateUnusable(f"webhook {shown}: plnt cannot call this URL ({_describe(exc, url, secret)})") from None
    except httpx.TransportError as exc:  # refused, reset, DNS, TLS, the receiver hanging up mid-answer
        raise GateUnavailable(f"webhook {shown} could not be reached ({_describe(exc, url, secret)})") from None
    except httpx.HTTPError as exc:  # a body that does not decode, say
        raise GateUnusable(f"webhook {shown}: unusable answer ({_describe(exc, url, secret)})") from None
    finally:
        if own:
            await http.aclose()


def _too_large(shown: str, status: int, cap: int, retry: bool) -> GateUnavailable | GateUnusable:
    message = f"webhook {shown} answered HTTP {status} with a body over {cap} bytes"
    # A 502/503 from a proxy with a big error page is still an outage, not a broken receiver.
    return GateUnavailable(message) if retry else GateUnusable(message)


def _describe(exc: Exception, url: str, secret: bytes) -> str:
    detail = _scrub(str(exc), url, secret)[:200]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


class WebhookVerdict(BaseModel):
    """A gate receiver's answer: promote (passed) or not, and why in its words."""

    passed: bool
    reason: str = Field(default="", max_length=MAX_REASON_CHARS)


async def webhook_gate(url: str, secret: bytes, payload: dict[str, Any], *, timeout_s: float = 10.0) -> WebhookVerdict:
    """Ask the receiver at `url` for a verdict on `payload` (signed; see the module docstring)."""
    shown = display_url(url)
    response = await post_signed(url, secret, payload, timeout_s=timeout_s)
    status = response.status
    if status == 429 or status >= 500:
        after = f" (Retry-After: {response.retry_after[:40]})" if response.retry_after else ""
        raise GateUnavailable(f"webhook {shown} answered HTTP {status}{after}")
    if 300 <= status < 400:
        # Not followed: a redirect could take the signed payload to another host.
        raise GateUnusable(f"webhook {shown} answered a redirect (HTTP {status}); plnt does not follow "
                           "redirects: set the gate's URL to the final one")
    if status in (401, 403):
        raise GateUnusable(f"webhook {shown} answered HTTP {status}: the receiver refused the signature or "
                           "the secret (check both sides hold the same secret and clocks agree within 5 minutes)")
    if status != 200:
        raise GateUnusable(f"webhook {shown} answered HTTP {status}; a gate receiver answers 200 with "
                           '{"pass": true|false, "reason": "..."}')
    try:
        answer = json.loads(response.body)
    except ValueError:  # also a body that is not UTF-8
        kind = response.content_type.split(";")[0].strip()[:60] or "no content-type"
        raise GateUnusable(f"webhook {shown} answered a body that is not JSON ({len(response.body)} bytes, "
                           f"{kind})") from None
    passed = answer.get("pass") if isinstance(answer, dict) else None
    if not isinstance(passed, bool):  # 1, "yes" or null are not a verdict
        raise GateUnusable(f'webhook {shown} answered JSON without a boolean "pass" (expects '
                           '{"pass": true|false, "reason": "..."})')
    reason = answer.get("reason", "")
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        raise GateUnusable(f'webhook {shown} answered a "reason" that is not a string')
    # The receiver's words go into the status: bounded, and scrubbed in case it echoes its URL or secret.
    return WebhookVerdict(passed=passed, reason=_scrub(reason, url, secret)[:MAX_REASON_CHARS])
