"""Gateway attacks through a live `plnt up` (real Temporal, git, runner process and gateway):
restricted tokens on admin and read endpoints, forged and unsigned git hooks, DNS rebinding and
cross-site posts against the open loopback gateway, a 96 MiB header, 200 slow clients, 5,000-deep
JSON, bodies missing the workflow's inputs, and a flood of hooks. Each ends with the refusal and
its message, nothing written outside the state directory, and 1.2.0 still answering."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.app import Plnt
from plnt.reconciler.cli.main import app as cli_app
from typer.testing import CliRunner

from tests.attacks.live import AttackRepo, OutsideWrites, assert_still_serving, live_plnt
from tests.e2e.harness import REVIEW, wait_for

pytestmark = pytest.mark.integration

TOKENS = """\
admin-token
reader-token   scopes=read
other-invoker  invoke=trend-monitor        # another workflow's invoker
rr-invoker     review-responder            # the older syntax: invoke-only
"""
SECRET = "forge-webhook-secret"
DEEP = b'{"a":' * 5000 + b"1" + b"}" * 5000


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def request(plnt: Plnt, method: str, path: str, **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(base_url=plnt.url, trust_env=False, timeout=30) as client:
        return await client.request(method, path, **kwargs)


async def still_serving_with(plnt: Plnt, token: str) -> None:
    """assert_still_serving for a gateway that requires a token."""
    response = await request(plnt, "POST", "/workflows/review-responder/invoke", json=REVIEW, headers=bearer(token))
    assert response.status_code == 200, response.text
    assert response.json()["version"] == "1.2.0"


def runner_endpoint(plnt: Plnt) -> str:
    stable = plnt.driver.snapshot()["default/review-responder"].stable
    assert stable is not None
    return stable.endpoint


async def test_restricted_tokens_and_forged_hooks(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    (tmp_path / "tokens.txt").write_text(TOKENS)
    (tmp_path / "hook-secret").write_text(SECRET + "\n")
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace,
                         gateway_tokens_file=tmp_path / "tokens.txt", webhook_secret_file=tmp_path / "hook-secret") as plnt:
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        wakes = count_wakes(plnt)

        # Invoke-only tokens: 403 naming the missing scope on every read and admin endpoint.
        for token in ("rr-invoker", "other-invoker"):
            for method, path, scope in [
                ("GET", "/source", "admin"), ("GET", "/metrics", "read"),
                ("GET", "/workflows/review-responder/history", "read"),
                ("GET", "/workflows/trend-monitor/history", "read"),
                ("GET", "/workflows/review-responder/stats", "read"), ("POST", "/hooks/git", "admin"),
            ]:
                response = await request(plnt, method, path, headers=bearer(token))
                assert response.status_code == 403, (token, path, response.text)
                assert response.json()["error"]["message"].startswith(
                    f"this token lacks the '{scope}' scope that {method} {path} needs"), response.text
        response = await request(plnt, "POST", "/workflows/review-responder/invoke", json=REVIEW,
                                 headers=bearer("other-invoker"))
        assert response.status_code == 403
        assert response.json()["error"]["message"] == "this token may not invoke workflow review-responder"
        # GET /workflows: an invoker sees its own workflows, without runner endpoints.
        endpoint = runner_endpoint(plnt)
        rows = (await request(plnt, "GET", "/workflows", headers=bearer("rr-invoker"))).json()
        assert [row["name"] for row in rows] == ["review-responder"] and endpoint not in str(rows)
        assert (await request(plnt, "GET", "/workflows", headers=bearer("other-invoker"))).json() == []
        admin_rows = (await request(plnt, "GET", "/workflows", headers=bearer("admin-token"))).json()
        assert admin_rows[0]["endpoint"] == endpoint

        # A read token: plnt status and plnt history work (the token from PLNT_TOKEN).
        cli = CliRunner()
        env = {"PLNT_TOKEN": "reader-token"}
        status = await asyncio.to_thread(cli.invoke, cli_app, ["status", "--url", plnt.url], env=env)
        assert status.exit_code == 0, status.output
        assert "default/review-responder" in status.output and "Ready" in status.output
        assert "(via gateway)" in status.output and endpoint not in status.output
        history = await asyncio.to_thread(cli.invoke, cli_app, ["history", "review-responder", "--url", plnt.url],
                                          env=env)
        assert history.exit_code == 0 and "promote" in history.output.lower(), history.output

        # Forged and unsigned hooks: 401 naming the header; nothing fetched.
        body = b'{"ref": "refs/heads/main"}'
        forged = "sha256=" + hmac.new(b"guessed", body, hashlib.sha256).hexdigest()
        for headers, message in [
            ({"x-hub-signature-256": forged}, "X-Hub-Signature-256 does not match the body signed with the webhook secret"),
            ({"x-gitea-signature": "00" * 32}, "X-Gitea-Signature does not match"),
            ({"x-gitlab-token": "guessed"}, "X-Gitlab-Token does not match"),
            ({}, "missing webhook signature: send X-Hub-Signature-256 (GitHub), X-Gitea-Signature (Gitea) or "
                 "X-Gitlab-Token (GitLab)"),
            ({**bearer("rr-invoker"), "x-gitlab-token": "guessed"}, "X-Gitlab-Token does not match"),
        ]:
            response = await request(plnt, "POST", "/hooks/git", content=body, headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert response.json()["error"]["type"] == "invalid_signature" and message in response.json()["error"]["message"]
        assert wakes == []  # no hook got through (403s above included)
        # The forge's correctly signed hook needs no token and wakes the reconciler.
        signed = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        response = await request(plnt, "POST", "/hooks/git", content=body, headers={"x-hub-signature-256": signed})
        assert response.status_code == 202
        assert wakes == [1]

        await still_serving_with(plnt, "rr-invoker")
        outside.assert_none()


async def test_hostile_http_against_the_open_gateway(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace,
                         gateway_header_timeout_s=2.0) as plnt:
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        invocations = await runner_invocations(plnt)

        # DNS rebinding (foreign Host) and a cross-site text/plain POST: refused, nothing runs.
        response = await request(plnt, "POST", "/workflows/review-responder/invoke", json=REVIEW,
                                 headers={"host": "attacker.example:8000", "origin": "http://attacker.example"})
        assert response.status_code == 421 and "DNS rebinding" in response.json()["error"]["message"]
        response = await request(plnt, "POST", "/workflows/review-responder/invoke",
                                 content=b'{"review": "x", "brand_voice": "y"}',
                                 headers={"content-type": "text/plain", "origin": "http://attacker.example"})
        assert response.status_code == 415
        assert response.json()["error"]["message"] == ("send the body as JSON with 'Content-Type: application/json' "
                                                        "(got text/plain)")
        # The same straight at the runner's port (it has no auth of its own).
        response = await request(plnt, "POST", runner_endpoint(plnt) + "/invoke", json=REVIEW,
                                 headers={"host": "attacker.example"})
        assert response.status_code == 421 and "DNS rebinding" in response.json()["error"]["message"]
        response = await request(plnt, "POST", runner_endpoint(plnt) + "/invoke", content=b'{"review": "x"}',
                                 headers={"content-type": "text/plain"})
        assert response.status_code == 415 and response.json()["error"]["type"] == "unsupported_media_type"
        assert await runner_invocations(plnt) == invocations
        await assert_still_serving(plnt)

        # 5,000-deep JSON to invoke and chat: 4xx, never 500.
        response = await request(plnt, "POST", "/workflows/review-responder/invoke", content=DEEP,
                                 headers={"content-type": "application/json"})
        assert response.status_code == 422 and "nests deeper than 100 levels" in response.json()["error"]["message"]
        chat = b'{"model": "review-responder", "messages": [{"role": "user", "content": ' + DEEP + b"}]}"
        response = await request(plnt, "POST", "/v1/chat/completions", content=chat,
                                 headers={"content-type": "application/json"})
        assert response.status_code == 400 and "nests deeper than 100 levels" in response.json()["error"]["message"]
        # ... and straight to the runner.
        response = await request(plnt, "POST", runner_endpoint(plnt) + "/invoke", content=DEEP,
                                 headers={"content-type": "application/json"})
        assert response.status_code == 422

        # A body missing the workflow's inputs: 422 naming the field (not 500 step_failed).
        response = await request(plnt, "POST", "/workflows/review-responder/invoke", json={"review": "Nice place"})
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert (error["type"], error["field"]) == ("invalid_input", "brand_voice")
        assert error["message"].startswith("missing input 'brand_voice'")
        await assert_still_serving(plnt)

        # One 96 MiB header: 431 after at most the limit was parsed; health checks keep answering.
        for port in (plnt.gateway.port, int(runner_endpoint(plnt).rsplit(":", 1)[1])):
            health = HealthProbe(plnt.url)
            answer, seconds = await asyncio.to_thread(huge_header, port, 96 * 2**20)
            # Joined off the loop: the gateway under test runs on this loop, and a probe still
            # waiting for its answer would otherwise wait out its timeout (it did, under load).
            probes = await asyncio.to_thread(health.stop)
            assert answer.startswith(b"HTTP/1.1 431 Request Header Fields Too Large"), answer[:120]
            assert b"request headers are over the 65536 byte limit" in answer
            assert probes.failures == 0, probes  # (often none ran: the 431 came first)
            assert (await request(plnt, "GET", "/healthz")).status_code == 200
            print(f"96 MiB header to port {port}: 431 after {seconds:.2f}s; healthz slowest {probes.slowest:.3f}s")
        await assert_still_serving(plnt)

        # 200 connections trickling a request head: /healthz answers; each is cut off (408).
        conns = [await asyncio.open_connection("127.0.0.1", plnt.gateway.port) for _ in range(200)]
        for _, writer in conns:
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-slow: ")
        for _ in range(3):
            for _, writer in conns:
                writer.write(b"a")
            response = await request(plnt, "GET", "/healthz")
            assert response.status_code == 200
        answers = await asyncio.gather(*(asyncio.wait_for(reader.read(), 30) for reader, _ in conns))
        assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers), answers[0]
        assert b"request headers not received within 2s" in answers[0]
        for _, writer in conns:
            writer.close()

        await assert_still_serving(plnt)
        outside.assert_none()


async def test_a_flood_of_hooks_is_one_fetch_in_flight_and_one_queued(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    """200 hooks while a fetch is in flight: they queue exactly one more fetch, never a second
    concurrent one (the reconciler's wake Event coalesces them)."""
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace, interval_s=3600) as plnt:
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        fetches = count_fetches(plnt, gated=True)
        assert (await request(plnt, "POST", "/hooks/git")).status_code == 202
        await wait_for(lambda: fetches.count == 1, timeout=30, what="the first fetch")  # noqa: B023
        async with httpx.AsyncClient(base_url=plnt.url, trust_env=False, timeout=30) as client:
            answers = await asyncio.gather(*(client.post("/hooks/git") for _ in range(199)))
        assert [a.status_code for a in answers] == [202] * 199
        fetches.release()
        await wait_for(lambda: fetches.count == 2, timeout=30, what="the queued fetch")  # noqa: B023
        # The second fetch consumed every hook: nothing else is queued behind it.
        assert not plnt.reconciler._wake.is_set()
        assert (fetches.count, fetches.most_at_once) == (2, 1)
        fetches.release()
        await assert_still_serving(plnt)
        outside.assert_none()


# --- helpers -------------------------------------------------------------------------------------


class FetchCounter:
    """Wraps the reconciler's GitSource.fetch: counts calls and (gated) holds each until released."""

    def __init__(self, real: Any, gated: bool) -> None:
        self.real = real
        self.gated = gated
        self.count = 0
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()
        self._gate = threading.Semaphore(0)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            self.count += 1
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        try:
            if self.gated:
                self._gate.acquire(timeout=60)
            return self.real(*args, **kwargs)
        finally:
            with self._lock:
                self.running -= 1

    def release(self) -> None:
        self._gate.release()


def count_wakes(plnt: Plnt) -> list[int]:
    """Calls of the reconciler's wake() (what POST /hooks/git does), counted; the wake still happens."""
    wakes: list[int] = []
    real = plnt.reconciler.wake

    def wake() -> None:
        wakes.append(1)
        real()

    plnt.reconciler.wake = wake  # type: ignore[method-assign]
    return wakes


def count_fetches(plnt: Plnt, gated: bool = False) -> FetchCounter:
    source = plnt.reconciler._source
    counter = FetchCounter(source.fetch, gated)
    source.fetch = counter  # type: ignore[method-assign]
    return counter


async def runner_invocations(plnt: Plnt) -> int:
    stats = (await request(plnt, "GET", "/workflows/review-responder/stats")).json()
    return sum(item["stats"]["invocations"] for item in stats["backends"])


def huge_header(port: int, size: int) -> tuple[bytes, float]:
    """Send one request whose header is `size` bytes; (the answer, seconds until it came)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx-big: ")
        chunk = b"a" * 2**20
        try:
            for _ in range(size // len(chunk)):
                sock.sendall(chunk)
        except OSError:
            pass  # the server stopped reading: it has answered
        try:
            answer = sock.recv(65536)
        except ConnectionResetError:
            answer = b""
    return answer, time.monotonic() - started


class HealthProbe:
    """GET /healthz in a thread, every 20 ms, until stopped: how many answered, the slowest."""

    def __init__(self, url: str) -> None:
        self.ok = self.failures = 0
        self.slowest = 0.0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        # 15 s: a stall from the attack is what fails; a busy shared machine's hiccup must not.
        with httpx.Client(trust_env=False, timeout=15) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    ok = client.get(f"{url}/healthz").status_code == 200
                except httpx.HTTPError as exc:
                    self.errors.append(f"{type(exc).__name__} after {time.monotonic() - started:.2f}s: {exc}")
                    ok = False
                self.slowest = max(self.slowest, time.monotonic() - started)
                self.ok += ok
                self.failures += not ok
                self._stop.wait(0.02)

    def stop(self) -> HealthProbe:
        self._stop.set()
        self._thread.join()
        return self

    def __repr__(self) -> str:
        return f"HealthProbe(ok={self.ok}, failures={self.failures}, slowest={self.slowest:.3f}s, errors={self.errors})"
