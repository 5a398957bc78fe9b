"""Gateway workers' pure parts (gateway/workers.py): the forwarded-caller trust of the control
plane's private listener, with the real gateway app, and the worker config's secrecy.
The processes themselves are tested in tests/e2e/test_gateway_workers.py."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from plnt.gateway.app import create_app
from plnt.gateway.control_relay import FORWARDED_FOR_HEADER, FORWARDER_HEADER, TrustForwarded
from plnt.gateway.router import Router
from plnt.gateway.workers import WorkerConfig

TOKEN = "internal-token-4c1d-never-shown"


async def _hook_app() -> tuple[Any, list[int]]:
    woken: list[int] = []

    async def on_git_hook() -> None:
        woken.append(1)

    return create_app(Router(), list_workflows=list, on_git_hook=on_git_hook), woken


@pytest.mark.parametrize(("headers", "status", "woken"), [
    ({}, 202, 1),  # a loopback caller of the private listener: loopback
    ({FORWARDER_HEADER.decode(): TOKEN, FORWARDED_FOR_HEADER.decode(): "127.0.0.1"}, 202, 1),
    ({FORWARDER_HEADER.decode(): TOKEN, FORWARDED_FOR_HEADER.decode(): "203.0.113.9"}, 403, 0),
    # a claim without the internal token is not believed, and not loopback either
    ({FORWARDER_HEADER.decode(): "guess", FORWARDED_FOR_HEADER.decode(): "127.0.0.1"}, 403, 0),
    ({FORWARDED_FOR_HEADER.decode(): "127.0.0.1"}, 403, 0),
])
async def test_a_forwarded_hook_is_judged_by_the_address_the_worker_saw(headers: dict[str, str], status: int,
                                                                        woken: int) -> None:
    app, calls = await _hook_app()
    transport = httpx.ASGITransport(app=TrustForwarded(app, TOKEN), client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.post("/hooks/git", headers=headers)
    assert response.status_code == status, response.text
    assert len(calls) == woken


async def test_the_forwarding_headers_never_reach_the_app() -> None:
    seen: list[dict[str, Any]] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        seen.append(scope)
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    transport = httpx.ASGITransport(app=TrustForwarded(app, TOKEN), client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        await client.get("/x", headers={FORWARDER_HEADER.decode(): TOKEN, FORWARDED_FOR_HEADER.decode(): "10.1.2.3"})
        await client.get("/x")
    names = [{key for key, _ in scope["headers"]} for scope in seen]
    assert all(FORWARDER_HEADER not in n and FORWARDED_FOR_HEADER not in n for n in names)
    assert [scope["client"][0] for scope in seen] == ["10.1.2.3", "127.0.0.1"]


def test_the_worker_config_shows_no_secret_but_carries_them_to_the_worker() -> None:
    config = WorkerConfig(index=1, parent_pid=1, control_url="http://127.0.0.1:1", internal_token=TOKEN,
                          port=8000, tokens_text="app-token-77 review", plain_tokens=("plain-token-88",))
    for shown in (repr(config), str(config), config.model_dump_json()):
        assert TOKEN not in shown and "app-token-77" not in shown and "plain-token-88" not in shown
    again = WorkerConfig.model_validate_json(config.wire())
    assert again.internal_token.get_secret_value() == TOKEN
    assert again.tokens_text is not None and again.tokens_text.get_secret_value() == "app-token-77 review"
    assert [t.get_secret_value() for t in again.plain_tokens] == ["plain-token-88"]


def test_metrics_of_several_processes_add_up() -> None:
    from plnt.gateway.metrics import GatewayMetrics
    from plnt.gateway.workers import merge_metrics
    from prometheus_client.parser import text_string_to_metric_families

    labels = ("default", "review", "1.0.0", "stable")
    a, b = GatewayMetrics(), GatewayMetrics()
    for metrics, n in ((a, 2), (b, 3)):
        for _ in range(n):
            metrics.started("invoke")
            metrics.finished("invoke", labels, 200, 0.002)
    b.started("invoke")  # one still in flight
    b.started("invoke")
    b.finished("invoke", ("default", 'we"ird\\name', "", ""), 404, 0.001, error_type="not_found")
    merged = merge_metrics([a.render(), b.render()])
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(merged.decode()) for s in f.samples}

    def value(name: str, **want: str) -> float:
        return sum(v for (n, items), v in samples.items() if n == name and want.items() <= dict(items).items())

    assert value("plnt_gateway_requests_total", code="200", workflow="review") == 5
    assert value("plnt_gateway_request_duration_seconds_count", workflow="review") == 5
    assert value("plnt_gateway_request_duration_seconds_bucket", workflow="review", le="0.0025") == 5
    assert value("plnt_gateway_errors_total", workflow='we"ird\\name', type="not_found") == 1
    assert value("plnt_gateway_in_flight_requests", api="invoke") == 1
    created = [v for (n, _), v in samples.items() if n == "plnt_gateway_requests_created"]
    assert created and max(created) < 4e9  # the earliest, not a sum of timestamps
    assert merge_metrics([merged]) == merged  # merging one exposition changes nothing


@pytest.mark.parametrize(("headers", "kept"), [
    ([(b"x-request-id", b"1"), (b"accept", b"*/*")], [b"x-request-id", b"accept"]),
    ([(b"connection", b"keep-alive, X-Hop"), (b"x-hop", b"secret"), (b"keep-alive", b"5"), (b"x-end", b"1")],
     [b"x-end"]),
    ([(b"transfer-encoding", b"chunked"), (b"te", b"trailers"), (b"upgrade", b"h2c"), (b"content-length", b"3")], []),
    ([(FORWARDER_HEADER, b"forged"), (FORWARDED_FOR_HEADER, b"127.0.0.1"), (b"proxy-authorization", b"x")], []),
])
def test_a_forward_passes_only_end_to_end_headers(headers: list[tuple[bytes, bytes]], kept: list[bytes]) -> None:
    from plnt.gateway.control_relay import _forwardable

    assert [k for k, _ in _forwardable(headers)] == kept
