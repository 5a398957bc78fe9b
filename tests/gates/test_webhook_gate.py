"""The signed webhook gate (reconciler/gates/webhook.py): sign/verify as pure functions, then
webhook_gate against a REAL HTTP receiver on 127.0.0.1 that verifies every request with `verify`
and a known secret (401 when it fails), answering per path: /hooks/<case>/<token-like segment>."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from plnt.reconciler.gates.webhook import (
    WebhookVerdict,
    display_url,
    post_signed,
    sign,
    verify,
    webhook_gate,
)
from pydantic import ValidationError

from tests.http_thread import ThreadedHttp

SECRET = b"whsec-receiver-7Q2x9"
QUERY_TOKEN = "abc123"
PATH_TOKEN = "tok3nInPath"
PAYLOAD = {"workflowRun": "review-responder", "step": 2, "canary": {"version": "1.3.0", "weight": 10}}
SLOW_S = 3.0


# ---- sign / verify: pure ----------------------------------------------------------------------

def test_sign_is_the_documented_hmac() -> None:
    body = b'{"a":1}'
    expected = hmac.new(SECRET, b"1718000000." + body, hashlib.sha256).hexdigest()
    assert sign(SECRET, 1718000000, body) == f"sha256={expected}"


def test_verify_accepts_a_fresh_signature() -> None:
    now = time.time()
    body = b'{"pass":true}'
    assert verify(SECRET, str(int(now)), sign(SECRET, int(now), body), body, now=now)


def test_verify_refuses_a_tampered_body() -> None:
    now = int(time.time())
    signature = sign(SECRET, now, b'{"weight":10}')
    assert not verify(SECRET, str(now), signature, b'{"weight":90}', now=now)


def test_verify_refuses_another_secret() -> None:
    now = int(time.time())
    body = b"{}"
    assert not verify(b"another-secret", str(now), sign(SECRET, now, body), body, now=now)


@pytest.mark.parametrize("age_s, accepted", [(0, True), (299, True), (-299, True), (301, False), (-301, False),
                                             (86400, False)])
def test_verify_refuses_a_timestamp_outside_the_tolerance(age_s: int, accepted: bool) -> None:
    """Replay protection: a captured request is refused once its signed timestamp is 5 minutes old
    (or from 5 minutes in the future), though its signature is valid."""
    signed_at = 1718000000
    body = b'{"a":1}'
    signature = sign(SECRET, signed_at, body)
    assert verify(SECRET, str(signed_at), signature, body, now=signed_at + age_s) is accepted


def test_the_timestamp_is_signed() -> None:
    """A replay with a fresh timestamp header but the old signature fails."""
    body = b"{}"
    old_signature = sign(SECRET, 1718000000, body)
    assert not verify(SECRET, "1718000600", old_signature, body, now=1718000600)


@pytest.mark.parametrize("timestamp, signature", [
    ("", None), ("-5", None), (" 1718000000", None), ("1718000000.0", None), ("١٧١٨٠٠٠٠٠٠", None),
    ("1718000000", "SIGNATURE"), ("1718000000", "sha1=00"), ("1718000000", "sha256=é"), ("1718000000", ""),
])
def test_verify_refuses_malformed_headers_without_raising(timestamp: str, signature: str | None) -> None:
    body = b"{}"
    good = sign(SECRET, 1718000000, body)
    assert verify(SECRET, "1718000000", good, body, now=1718000000)  # the same call, well formed, passes
    assert not verify(SECRET, timestamp, good if signature is None else signature, body, now=1718000000)


def test_an_empty_secret_signs_and_verifies_nothing() -> None:
    with pytest.raises(ValueError):
        sign(b"", 1718000000, b"{}")
    assert not verify(b"", "1718000000", "sha256=" + "0" * 64, b"{}", now=1718000000)


@pytest.mark.parametrize("url, shown", [
    ("https://hooks.example.com/services/T000/B000/XXXXSECRET", "https://hooks.example.com/services/..."),
    ("http://127.0.0.1:8080/hooks?token=abc123", "http://127.0.0.1:8080/hooks?..."),
    ("https://user:pa55@hooks.example.com/gate", "https://hooks.example.com/gate"),
    ("https://webhook.example/0b6d1c1e-2f3a-4b5c-8d9e-0123456789ab", "https://webhook.example/..."),
    ("http://[::1]:9000/", "http://[::1]:9000"),
    ("http://host:99999/x", "<unparsable webhook URL>"),
])
def test_display_url_shows_no_token(url: str, shown: str) -> None:
    assert display_url(url) == shown


def test_a_verdict_reason_is_bounded() -> None:
    assert WebhookVerdict(passed=True, reason="r" * 500).reason == "r" * 500
    with pytest.raises(ValidationError):
        WebhookVerdict(passed=True, reason="r" * 501)


async def test_only_http_urls_are_called() -> None:
    with pytest.raises(GateUnusable, match="only http and https"):
        await webhook_gate(f"file:///etc/{PATH_TOKEN}?token={QUERY_TOKEN}", SECRET, PAYLOAD)


async def test_a_closed_port_is_unavailable() -> None:
    """Nothing listens on a port bound but never put to listen: the connection is refused."""
    with socket.socket() as held:  # held bound, so no other test's server takes the port meanwhile
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        url = f"http://127.0.0.1:{port}/hooks/{PATH_TOKEN}?token={QUERY_TOKEN}"
        started = time.monotonic()
        with pytest.raises(GateUnavailable, match="could not be reached") as caught:
            await webhook_gate(url, SECRET, PAYLOAD, timeout_s=5)
    assert time.monotonic() - started < 5
    assert_no_secret(str(caught.value), url)


# ---- a real receiver ----------------------------------------------------------------------------

@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool


class Receiver:
    """A gate receiver: verifies each request with SECRET, then answers as the path's case says."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self._http = ThreadedHttp(self._handler())

    @property
    def url(self) -> str:
        return self._http.url

    def hook(self, case: str) -> str:
        """The URL of a case, carrying tokens in its path and query like real webhook URLs."""
        return f"{self.url}/hooks/{case}/{PATH_TOKEN}?token={QUERY_TOKEN}"

    def of(self, case: str) -> list[Received]:
        return [r for r in self.received if r.path.startswith(f"/hooks/{case}/")]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                verified = verify(SECRET, self.headers.get("X-Plnt-Timestamp", ""),
                                  self.headers.get("X-Plnt-Signature", ""), body)
                receiver.received.append(Received(self.path, dict(self.headers.items()), body, verified))
                if not verified:
                    return self.answer(401, b'{"error":"bad signature"}')
                case = self.path.split("/")[2]
                try:
                    self.respond(case)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # plnt stopped reading (a cap, a timeout): that is the point

            def respond(self, case: str) -> None:
                if case == "pass":
                    self.answer(200, json.dumps({"pass": True, "reason": "p95 within budget"}).encode())
                elif case == "fail":
                    self.answer(200, json.dumps({"pass": False, "reason": "error rate 7% > 2%"}).encode())
                elif case == "bare":
                    self.answer(200, b'{"pass":true}')
                elif case == "echo":  # a receiver echoing what it must not: the URL and the secret
                    reason = (f"called at {receiver.hook('echo')} with {SECRET.decode()}, token {PATH_TOKEN} "
                              f"and {QUERY_TOKEN}; " + "x" * 2000)
                    self.answer(200, json.dumps({"pass": False, "reason": reason}).encode())
                elif case.isdigit():
                    self.answer(int(case), b'{"error":"as asked"}')
                elif case == "redirect":
                    self.send_response(302)
                    self.send_header("Location", receiver.hook("pass"))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                elif case == "slow":
                    time.sleep(SLOW_S)
                    self.answer(200, b'{"pass":true}')
                elif case == "trickle":  # each read well within the timeout, the whole answer not
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    self.wfile.write(b'{"pass":true,"reason":"')
                    for _ in range(int(SLOW_S / 0.1)):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.1)
                    self.wfile.write(b'"}')
                elif case == "notjson":
                    self.answer(200, b"<html>all good</html>", "text/html")
                elif case == "passyes":
                    self.answer(200, b'{"pass":"yes"}')
                elif case == "passone":
                    self.answer(200, b'{"pass":1,"reason":"ok"}')
                elif case == "list":
                    self.answer(200, b"[true]")
                elif case == "badreason":
                    self.answer(200, b'{"pass":true,"reason":{"a":1}}')
                elif case == "big":  # announced by Content-Length
                    self.answer(200, b'{"pass":true,"reason":"' + b"x" * 70000 + b'"}')
                elif case == "bigstream":  # no length: plnt must count what it reads
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.end_headers()
                    for _ in range(40):
                        self.wfile.write(b" " * 4096)
                else:
                    self.answer(404, b"no such case")

            def answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        return Handler

    def __enter__(self) -> Receiver:
        self._http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.__exit__()


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def assert_no_secret(message: str, url: str) -> None:
    assert QUERY_TOKEN not in message and PATH_TOKEN not in message and url not in message, message
    assert SECRET.decode() not in message, message


@pytest.mark.integration
async def test_a_passing_verdict_from_a_receiver_that_verified_the_request(receiver: Receiver) -> None:
    verdict = await webhook_gate(receiver.hook("pass"), SECRET, PAYLOAD)
    assert verdict == WebhookVerdict(passed=True, reason="p95 within budget")
    [request] = receiver.of("pass")
    assert request.verified
    assert request.body == json.dumps(PAYLOAD, sort_keys=True, separators=(",", ":")).encode()
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"] == "plnt"
    assert uuid.UUID(request.headers["X-Plnt-Delivery"]).version == 4
    assert abs(int(request.headers["X-Plnt-Timestamp"]) - time.time()) < 5
    assert request.headers["X-Plnt-Signature"] == sign(SECRET, int(request.headers["X-Plnt-Timestamp"]), request.body)


@pytest.mark.integration
async def test_a_failing_verdict_keeps_its_reason(receiver: Receiver) -> None:
    assert await webhook_gate(receiver.hook("fail"), SECRET, PAYLOAD) == WebhookVerdict(passed=False,
                                                                                       reason="error rate 7% > 2%")


@pytest.mark.integration
async def test_the_reason_is_optional(receiver: Receiver) -> None:
    assert await webhook_gate(receiver.hook("bare"), SECRET, PAYLOAD) == WebhookVerdict(passed=True, reason="")


@pytest.mark.integration
async def test_a_reason_is_bounded_and_scrubbed(receiver: Receiver) -> None:
    verdict = await webhook_gate(receiver.hook("echo"), SECRET, PAYLOAD)
    assert verdict.passed is False and len(verdict.reason) == 500
    assert verdict.reason.startswith("called at ")
    assert_no_secret(verdict.reason, receiver.hook("echo"))


@pytest.mark.integration
async def test_deliveries_are_distinct(receiver: Receiver) -> None:
    first = await post_signed(receiver.hook("bare"), SECRET, PAYLOAD)
    second = await post_signed(receiver.hook("bare"), SECRET, PAYLOAD)
    assert first.status == second.status == 200 and first.body == b'{"pass":true}'
    assert first.delivery != second.delivery
    assert {first.delivery, second.delivery} <= {r.headers["X-Plnt-Delivery"] for r in receiver.of("bare")}


@pytest.mark.integration
@pytest.mark.parametrize("case, error, words", [
    ("500", GateUnavailable, ["HTTP 500"]),
    ("503", GateUnavailable, ["HTTP 503"]),
    ("429", GateUnavailable, ["HTTP 429"]),
    ("401", GateUnusable, ["HTTP 401", "signature", "secret"]),
    ("403", GateUnusable, ["HTTP 403", "signature", "secret"]),
    ("404", GateUnusable, ["HTTP 404"]),
    ("202", GateUnusable, ["HTTP 202"]),
    ("redirect", GateUnusable, ["HTTP 302", "does not follow redirects"]),
    ("notjson", GateUnusable, ["not JSON", "text/html"]),
    ("passyes", GateUnusable, ['boolean "pass"']),
    ("passone", GateUnusable, ['boolean "pass"']),
    ("list", GateUnusable, ['boolean "pass"']),
    ("badreason", GateUnusable, ['"reason" that is not a string']),
    ("big", GateUnusable, ["over 65536 bytes"]),
    ("bigstream", GateUnusable, ["over 65536 bytes"]),
])
async def test_what_no_verdict_comes_from(receiver: Receiver, case: str, error: type[Exception], words: list[str]) -> None:
    """Each answer raises the error that says what happens next, naming the URL without its tokens."""
    url = receiver.hook(case)
    with pytest.raises(error) as caught:
        await webhook_gate(url, SECRET, PAYLOAD, timeout_s=5)
    assert type(caught.value) is error  # not merely a subclass: the type is the instruction
    message = str(caught.value)
    assert f"{receiver.url}/hooks/..." in message, message
    for word in words:
        assert word in message, message
    assert_no_secret(message, url)
    assert all(r.verified for r in receiver.of(case))  # the receiver's own answer, not a bad signature


@pytest.mark.integration
async def test_a_redirect_is_not_followed_even_by_a_client_that_follows(receiver: Receiver) -> None:
    before = len(receiver.of("pass"))
    async with httpx.AsyncClient(trust_env=False, follow_redirects=True) as client:
        response = await post_signed(receiver.hook("redirect"), SECRET, PAYLOAD, client=client)
    assert response.status == 302
    assert len(receiver.of("pass")) == before  # the signed payload went nowhere else


@pytest.mark.integration
@pytest.mark.parametrize("case", ["slow", "trickle"])
async def test_a_slow_receiver_is_unavailable_within_the_timeout(receiver: Receiver, case: str) -> None:
    """The timeout bounds the whole call: also a receiver trickling its answer a byte at a time."""
    url = receiver.hook(case)
    started = time.monotonic()
    with pytest.raises(GateUnavailable, match="did not answer within 0.5 s") as caught:
        await webhook_gate(url, SECRET, PAYLOAD, timeout_s=0.5)
    assert time.monotonic() - started < 0.5 + 1.0
    assert_no_secret(str(caught.value), url)


@pytest.mark.integration
async def test_a_receiver_holding_another_secret_answers_401(receiver: Receiver) -> None:
    url = receiver.hook("pass").replace("/pass/", "/wrongsecret/")
    wrong = b"whsec-not-the-receivers-one"
    with pytest.raises(GateUnusable, match="refused the signature or the secret") as caught:
        await webhook_gate(url, wrong, PAYLOAD)
    [request] = receiver.of("wrongsecret")
    assert request.verified is False
    assert_no_secret(str(caught.value), url)
    assert wrong.decode() not in str(caught.value)


@pytest.mark.integration
async def test_a_body_over_a_smaller_cap_is_refused(receiver: Receiver) -> None:
    response = await post_signed(receiver.hook("fail"), SECRET, PAYLOAD, max_response_bytes=1000)
    assert response.status == 200
    with pytest.raises(GateUnusable, match="over 10 bytes"):
        await post_signed(receiver.hook("fail"), SECRET, PAYLOAD, max_response_bytes=10)
