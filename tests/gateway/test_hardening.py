"""Hostile HTTP at the gateway: signed git hooks, the open loopback mode's Host and Content-Type
checks, request-head limits and slow clients (real uvicorn servers, raw sockets), and deeply
nested JSON. The runner behind the gateway is the stand-in of fakes.py (FakeRunner)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import socket
from typing import Any

import httpx
import pytest
from plnt.core.auth import TokenSet, WebhookSecretError, host_name, load_webhook_secret, open_gateway_hosts
from plnt.core.limits import MAX_JSON_DEPTH, HttpLimits, JSONTooDeep, loads
from plnt.core.routes import RouteTable
from plnt.core.server import GatewayServer
from plnt.gateway.app import create_app
from plnt.gateway.hooks import verify
from plnt.gateway.router import Router

from tests.gateway.conftest import StartGateway, StartServer, backend, route
from tests.gateway.fakes import FakeRunner

SECRET = b"hook-secret"
JSON = {"content-type": "application/json"}


def github(body: bytes, secret: bytes = SECRET) -> dict[str, str]:
    return {"x-hub-signature-256": "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()}


def gitea(body: bytes, secret: bytes = SECRET) -> dict[str, str]:
    return {"x-gitea-signature": hmac.new(secret, body, hashlib.sha256).hexdigest()}


def deep(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


# --- no servers --------------------------------------------------------------------------------


def test_webhook_signatures() -> None:
    body = b'{"ref": "refs/heads/main"}'
    assert verify(SECRET, {k.encode(): v.encode() for k, v in github(body).items()}, body) is None
    assert verify(SECRET, {k.encode(): v.upper().encode() for k, v in gitea(body).items()}, body) is None
    assert verify(SECRET, {b"x-gitlab-token": SECRET}, body) is None
    assert "missing webhook signature: send X-Hub-Signature-256" in str(verify(SECRET, {}, body))
    forged = {k.encode(): v.encode() for k, v in github(body, b"other").items()}
    assert verify(SECRET, forged, body) == ("webhook signature does not verify: X-Hub-Signature-256 does not "
                                            "match the body signed with the webhook secret")
    tampered = {k.encode(): v.encode() for k, v in github(body).items()}
    assert verify(SECRET, tampered, body + b" ") is not None
    assert "X-Gitlab-Token" in str(verify(SECRET, {b"x-gitlab-token": b"guess"}, body))


def test_webhook_secret_file(tmp_path: Any) -> None:
    (tmp_path / "s").write_text("  s3cret\n")
    assert load_webhook_secret(tmp_path / "s") == b"s3cret"
    (tmp_path / "empty").write_text("\n")
    for name, message in [("empty", "is empty"), ("missing", "cannot read")]:
        with pytest.raises(WebhookSecretError, match=message):
            load_webhook_secret(tmp_path / name)


def test_open_gateway_host_names() -> None:
    assert open_gateway_hosts("127.0.0.1", TokenSet.parse(None, ["t"])) is None  # tokens guard it
    assert open_gateway_hosts("0.0.0.0", TokenSet()) is None  # opened on purpose (--insecure-no-auth)
    hosts = open_gateway_hosts("127.0.0.2", TokenSet())
    assert hosts == {b"localhost", b"127.0.0.1", b"[::1]", b"127.0.0.2"}
    assert b"[::1]" in (open_gateway_hosts("::1", TokenSet()) or ())
    assert [host_name(h) for h in (b"LocalHost:8000", b"[::1]:80", b"evil.example", b"127.0.0.1")] == [
        b"localhost", b"[::1]", b"evil.example", b"127.0.0.1"]


def test_json_depth_limit() -> None:
    assert loads(deep(MAX_JSON_DEPTH)) is not None
    assert loads(b'{"s": "' + b"[" * 500 + b'"}') == {"s": "[" * 500}  # brackets in strings are not depth
    for body in (deep(MAX_JSON_DEPTH + 1), deep(5000), b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(JSONTooDeep, match=f"deeper than {MAX_JSON_DEPTH} levels"):
            loads(body)


# --- over HTTP -----------------------------------------------------------------------------------


async def gateway(start_server: StartServer, start_gateway: StartGateway, **kwargs: Any) -> tuple[Any, FakeRunner]:
    runner = FakeRunner("v1")
    server = await start_server(runner.app())
    table = RouteTable([route("summarize", backend(server, "v1")), route("assistant", backend(server, "v1"))])
    return await start_gateway(Router(table), **kwargs), runner


@pytest.mark.integration
async def test_signed_hooks_need_no_token(start_server: StartServer, start_gateway: StartGateway) -> None:
    wakes: list[int] = []

    async def on_git_hook() -> None:
        wakes.append(1)

    gw, _ = await gateway(start_server, start_gateway, tokens=TokenSet.parse("admin\ninvoker summarize\n"),
                          webhook_secret=SECRET, on_git_hook=on_git_hook)
    body = b'{"ref": "refs/heads/main", "after": "abc"}'
    for headers in (github(body), gitea(body), {"x-gitlab-token": SECRET.decode()}):
        resp = await gw.client.post("/hooks/git", content=body, headers=headers)
        assert (resp.status_code, resp.json()) == (202, {"accepted": True}), resp.text
    assert len(wakes) == 3
    resp = await gw.client.post("/hooks/git", content=body, headers=github(body, b"guessed"))
    assert resp.status_code == 401 and resp.json()["error"]["type"] == "invalid_signature"
    assert "X-Hub-Signature-256 does not match" in resp.json()["error"]["message"]
    resp = await gw.client.post("/hooks/git", content=body)
    assert resp.status_code == 401 and "missing webhook signature" in resp.json()["error"]["message"]
    resp = await gw.client.post("/hooks/git", content=body, headers={"authorization": "Bearer invoker"})
    assert resp.status_code == 403 and "lacks the 'admin' scope" in resp.json()["error"]["message"]
    resp = await gw.client.post("/hooks/git", content=body, headers={"x-gitlab-token": "nope"})
    assert resp.status_code == 401 and "X-Gitlab-Token" in resp.json()["error"]["message"]
    # An operator's admin token works without a signature.
    assert (await gw.client.post("/hooks/git", headers={"authorization": "Bearer admin"})).status_code == 202
    resp = await gw.client.post("/hooks/git", content=b"x" * (2**20 + 1), headers=github(b""))
    assert resp.status_code == 413
    assert len(wakes) == 4


def non_loopback_address() -> str | None:
    """An address of this machine that is not loopback, if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a source address
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.integration
async def test_unsigned_hooks_only_from_loopback(start_server: StartServer) -> None:
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback address to call from")
    wakes: list[int] = []

    async def on_git_hook() -> None:
        wakes.append(1)

    app = create_app(Router(RouteTable([])), list_workflows=list, on_git_hook=on_git_hook, host="0.0.0.0",
                     tokens=TokenSet.parse(None, ["admin"]))
    server = GatewayServer(app, "0.0.0.0", 0, graceful_timeout_s=2)
    await server.start()
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            auth = {"authorization": "Bearer admin"}
            resp = await client.post(f"http://{address}:{server.port}/hooks/git", headers=auth)
            assert resp.status_code == 403
            assert "only loopback callers unless plnt up has --webhook-secret-file" in resp.json()["error"]["message"]
            assert (await client.post(f"http://127.0.0.1:{server.port}/hooks/git", headers=auth)).status_code == 202
            assert (await client.post(f"http://127.0.0.1:{server.port}/hooks/git")).status_code == 401
    finally:
        await server.stop()
    assert wakes == [1]


@pytest.mark.integration
async def test_open_loopback_gateway_refuses_rebinding_and_cross_site_posts(
    start_server: StartServer, start_gateway: StartGateway
) -> None:
    gw, runner = await gateway(start_server, start_gateway)
    c = gw.client
    for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io"):
        resp = await c.post("/workflows/summarize/invoke", json={}, headers={"host": host})
        assert resp.status_code == 421, host
        assert resp.json()["error"]["type"] == "misdirected_request"
        assert "DNS rebinding" in resp.json()["error"]["message"]
        assert (await c.get("/workflows", headers={"host": host})).status_code == 421
    for host in ("localhost:1234", "127.0.0.1", "[::1]:8000", "LOCALHOST"):
        assert (await c.post("/workflows/summarize/invoke", json={}, headers={"host": host})).status_code == 200
    # Bodies a browser sends cross-site without a preflight: 415 (and they never reach the runner).
    before = len(runner.requests)
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"},
                    {"content-type": "multipart/form-data; boundary=x"}, {}):
        resp = await c.post("/workflows/summarize/invoke", content=b'{"a": 1}', headers=headers)
        assert resp.status_code == 415, headers
        assert resp.json()["error"]["type"] == "unsupported_media_type"
        assert "Content-Type: application/json" in resp.json()["error"]["message"]
        resp = await c.post("/v1/chat/completions", content=b'{"model": "assistant", "messages": []}', headers=headers)
        assert resp.status_code == 415 and resp.json()["error"]["code"] == "unsupported_media_type"
    assert len(runner.requests) == before
    for content_type in ("application/json; charset=utf-8", "application/vnd.plnt+json", "Application/JSON"):
        resp = await c.post("/workflows/summarize/invoke", content=b"{}", headers={"content-type": content_type})
        assert resp.status_code == 200, content_type


@pytest.mark.integration
async def test_host_is_not_checked_with_tokens(start_server: StartServer, start_gateway: StartGateway) -> None:
    gw, _ = await gateway(start_server, start_gateway, tokens=TokenSet.parse(None, ["t"]))
    resp = await gw.client.post("/workflows/summarize/invoke", json={},
                                headers={"host": "gateway.example", "authorization": "Bearer t"})
    assert resp.status_code == 200


@pytest.mark.integration
async def test_deeply_nested_json_is_a_client_error(start_server: StartServer, start_gateway: StartGateway) -> None:
    gw, runner = await gateway(start_server, start_gateway)
    resp = await gw.client.post("/workflows/summarize/invoke", content=deep(5000), headers=JSON)
    assert resp.status_code == 422
    assert resp.json()["error"] == {"type": "invalid_json",
                                    "message": f"body is not accepted: JSON nests deeper than {MAX_JSON_DEPTH} levels"}
    chat = b'{"model": "assistant", "messages": [{"role": "user", "content": ' + deep(5000) + b"}]}"
    resp = await gw.client.post("/v1/chat/completions", content=chat, headers=JSON)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    assert not runner.requests
    assert (await gw.client.post("/workflows/summarize/invoke", content=deep(50), headers=JSON)).status_code == 200


# --- request heads and slow clients (raw sockets) ------------------------------------------------


async def raw_exchange(port: int, data: bytes, *, read_timeout: float = 30) -> bytes:
    """Send `data` (ignoring a reset once the server answered) and read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        try:
            await writer.drain()
        except ConnectionError:
            pass
        chunks = []
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(65536), read_timeout)
            except ConnectionError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        writer.close()


async def serve_limited(start_gateway: StartGateway, start_server: StartServer, limits: HttpLimits) -> GatewayServer:
    runner = await start_server(FakeRunner("v1").app())
    app = create_app(Router(RouteTable([route("summarize", backend(runner, "v1"))])), list_workflows=list)
    server = GatewayServer(app, "127.0.0.1", 0, graceful_timeout_s=2, limits=limits)
    await server.start()
    return server


@pytest.mark.integration
async def test_oversized_heads_get_431(start_server: StartServer, start_gateway: StartGateway) -> None:
    server = await serve_limited(start_gateway, start_server, HttpLimits(max_head_bytes=8192, max_headers=20))
    try:
        huge = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"a" * (4 * 2**20) + b"\r\n\r\n"
        answer = await raw_exchange(server.port, huge)
        assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"), answer[:200]
        assert b"request headers are over the 8192 byte limit" in answer
        # A whole oversized head in one read is counted as parsed.
        one_read = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: " + b"a" * 9000 + b"\r\n\r\n"
        assert (await raw_exchange(server.port, one_read)).startswith(b"HTTP/1.1 431 ")
        many = b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(30)) + b"\r\n"
        answer = await raw_exchange(server.port, many)
        assert answer.startswith(b"HTTP/1.1 431 ") and b"more than 20 header fields" in answer
        # Within the limits (a body bigger than the head limit included): served.
        body = json.dumps({"t": "x" * 100_000}).encode()
        ok = (b"POST /workflows/summarize/invoke HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
              b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body)) + body
        assert (await raw_exchange(server.port, ok)).startswith(b"HTTP/1.1 200 ")
    finally:
        await server.stop()


@pytest.mark.integration
async def test_slow_clients_are_cut_off_and_healthz_keeps_answering(
    start_server: StartServer, start_gateway: StartGateway
) -> None:
    server = await serve_limited(start_gateway, start_server, HttpLimits(head_timeout_s=1.0, body_timeout_s=1.0))
    try:
        # 200 connections trickling a head one byte at a time.
        conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(200)]
        for _, writer in conns:
            writer.write(b"GET /healthz HTTP/1.1\r\nx-slow: ")
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10) as client:
            for _ in range(3):
                for _, writer in conns:
                    if not writer.is_closing():
                        writer.write(b"a")
                assert (await client.get("/healthz")).status_code == 200
        answers = await asyncio.gather(*(asyncio.wait_for(reader.read(), 30) for reader, _ in conns))
        assert all(a.startswith(b"HTTP/1.1 408 ") and b"request headers not received within 1s" in a
                   for a in answers), answers[0]
        for _, writer in conns:
            writer.close()
        # A body that never completes: 408 and closed.
        slow_body = (b"POST /workflows/summarize/invoke HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json"
                     b"\r\ncontent-length: 100\r\n\r\n{")
        answer = await raw_exchange(server.port, slow_body)
        assert answer.startswith(b"HTTP/1.1 408 ") and b"request body not received within 1s" in answer
        # An idle connection is just closed.
        assert await raw_exchange(server.port, b"") == b""
    finally:
        await server.stop()


@pytest.mark.integration
async def test_keep_alive_connections_keep_working(start_server: StartServer, start_gateway: StartGateway) -> None:
    """The head deadline restarts for each request on a kept-alive connection."""
    server = await serve_limited(start_gateway, start_server, HttpLimits(head_timeout_s=1.0))
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=10) as client:
            for _ in range(5):
                resp = await client.post("/workflows/summarize/invoke", json={"x": 1})
                assert resp.status_code == 200
    finally:
        await server.stop()
