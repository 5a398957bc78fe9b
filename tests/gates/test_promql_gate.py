"""The metric gate's client (reconciler/gates/promql.py) against a real Prometheus.

Real parts: Prometheus (Debian's `prometheus` binary) with basic auth on (its --web.config.file),
scraping every second a real HTTP target that serves a fixed exposition made by prometheus_client
(plnt_gateway_requests_total{track="canary"}: 90 with code 200, 10 with code 500); query_value's
HTTP client; the closed port. STAND-INS: two small HTTP servers in a thread play a Prometheus that
answers 503 "unavailable" and one that never answers, which a healthy Prometheus cannot be made to do.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.errors import GateUnavailable, GateUnusable
from plnt.reconciler.gates.promql import compare, query_value
from prometheus_client import CollectorRegistry, Counter, generate_latest

from tests.http_thread import ThreadedHttp
from tests.observability.promql import tool

pytestmark = pytest.mark.integration

USER, PASSWORD = "plnt-gate", "gate-secret-7"
# bcrypt (cost 4, the least: Prometheus checks it on every request) of PASSWORD
PASSWORD_HASH = "$2b$04$abcdefghijklmnopqrstuuSS2y9NNhuBuTWk2sRg.4Gb6FYQhVWTy"

CANARY = 'plnt_gateway_requests_total{track="canary"}'
ERROR_RATIO = 'sum(plnt_gateway_requests_total{track="canary",code=~"5.."}) / sum(plnt_gateway_requests_total{track="canary"})'
OK_REQUESTS = 'sum(plnt_gateway_requests_total{track="canary",code="200"})'


def exposition() -> bytes:
    registry = CollectorRegistry()
    requests = Counter("plnt_gateway_requests", "Requests through the gateway.", ["track", "code"], registry=registry)
    requests.labels(track="canary", code="200").inc(90)
    requests.labels(track="canary", code="500").inc(10)
    return generate_latest(registry)


class Target(BaseHTTPRequestHandler):
    """The scrape target: the same exposition on every path (so it is also a 200 that is not JSON)."""

    body = exposition()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class Unavailable(BaseHTTPRequestHandler):
    """STAND-IN: a Prometheus answering 503 as its API does when it cannot serve a query."""

    body = b'{"status":"error","errorType":"unavailable","error":"TSDB not ready"}'

    def do_GET(self) -> None:
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


class Silent(BaseHTTPRequestHandler):
    """STAND-IN: a Prometheus that takes the request and says nothing for 3 s."""

    def do_GET(self) -> None:
        time.sleep(3)

    def log_message(self, *args: object) -> None:
        pass


@dataclass(frozen=True)
class Prometheus:
    port: int

    @property
    def url(self) -> str:
        """With the credentials in it, as a gate's spec may give them."""
        return f"http://{USER}:{PASSWORD}@127.0.0.1:{self.port}"

    @property
    def shown(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """A real Prometheus scraping the Target every second; ready, and the series scraped, when handed out."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with ThreadedHttp(Target) as target:
        config, web = tmp / "prometheus.yml", tmp / "web.yml"
        config.write_text(f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: target
    static_configs:
      - targets: ["127.0.0.1:{target.port}"]
""")
        web.write_text(f"basic_auth_users:\n  {USER}: '{PASSWORD_HASH}'\n")
        prom = Prometheus(free_port())
        log_path = tmp / "prometheus.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [tool("prometheus"), f"--config.file={config}", f"--web.config.file={web}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom.port}"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            with httpx.Client(trust_env=False, timeout=5, auth=(USER, PASSWORD)) as client:
                deadline = time.monotonic() + 20
                while True:
                    assert process.poll() is None, log_path.read_text()
                    assert time.monotonic() < deadline, f"Prometheus not ready with both series in 20 s: {log_path.read_text()}"
                    try:
                        response = client.get(f"{prom.shown}/api/v1/query", params={"query": CANARY})
                        if response.status_code == 200 and len(response.json()["data"]["result"]) == 2:
                            break
                    except httpx.HTTPError:
                        pass
                    time.sleep(0.2)
            yield prom
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.mark.parametrize("query", [ERROR_RATIO, f"scalar({ERROR_RATIO})"], ids=["vector", "scalar"])
async def test_one_value_passes_or_fails_its_threshold(prometheus: Prometheus, query: str) -> None:
    value = await query_value(prometheus.url, query)
    assert value == pytest.approx(0.1)
    assert compare(value, max=0.2, what="error ratio") == (True, "error ratio 0.1 <= max 0.2")
    assert compare(value, max=0.05, what="error ratio") == (False, "error ratio 0.1 > max 0.05")

    # a client of the caller's own, and a min threshold
    async with httpx.AsyncClient(trust_env=False) as client:
        ok = await query_value(prometheus.url, OK_REQUESTS, client=client)
    assert ok == 90.0
    assert compare(ok, min=95) == (False, "value 90 < min 95")
    assert compare(ok, min=80, max=100) == (True, "value 90 within [min 80, max 100]")


async def test_no_series_is_unusable_and_the_advice_works(prometheus: Prometheus) -> None:
    query = 'plnt_gateway_requests_total{track="stable"}'
    with pytest.raises(GateUnusable) as caught:
        await query_value(prometheus.url, query)
    message = str(caught.value)
    assert "returned no series" in message and repr(query) in message and prometheus.shown in message, message
    assert "or vector(0)" in message
    # what the message says, checked: sum() of nothing is nothing, `or vector(0)` gives 0
    with pytest.raises(GateUnusable, match="no series"):
        await query_value(prometheus.url, f"sum({query})")
    assert await query_value(prometheus.url, f"sum({query}) or vector(0)") == 0.0


async def test_two_series_are_unusable_until_aggregated(prometheus: Prometheus) -> None:
    with pytest.raises(GateUnusable) as caught:
        await query_value(prometheus.url, CANARY)
    message = str(caught.value)
    assert "returned 2 series" in message and "aggregate it (sum, max" in message, message
    assert "code='200'" in message and "code='500'" in message and repr(CANARY) in message
    assert await query_value(prometheus.url, f"sum({CANARY})") == 100.0


async def test_a_syntax_error_carries_prometheus_own_text(prometheus: Prometheus) -> None:
    query = f"sum({CANARY}"
    with pytest.raises(GateUnusable) as caught:
        await query_value(prometheus.url, query)
    message = str(caught.value)
    assert "HTTP 400" in message and "parse error" in message and "unclosed left parenthesis" in message, message
    assert repr(query) in message


async def test_a_range_vector_nan_and_infinity(prometheus: Prometheus) -> None:
    with pytest.raises(GateUnusable, match="range vector"):
        await query_value(prometheus.url, f"{CANARY}[1m]")
    with pytest.raises(GateUnusable, match="returned NaN"):
        await query_value(prometheus.url, "0 / 0")
    infinite = await query_value(prometheus.url, "1 / 0")  # "+Inf" on the wire
    assert infinite == float("inf") and compare(infinite, max=1)[0] is False


async def test_a_long_query_is_shortened_in_the_message(prometheus: Prometheus) -> None:
    query = " or ".join([f'plnt_gateway_requests_total{{track="nowhere-{n}"}}' for n in range(20)])
    with pytest.raises(GateUnusable) as caught:
        await query_value(prometheus.url, query)
    message = str(caught.value)
    assert query[:150] in message and query not in message and "...'" in message, message
    assert len(message) < 500


async def test_a_body_over_max_bytes_is_refused(prometheus: Prometheus) -> None:
    assert await query_value(prometheus.url, f"sum({CANARY})", max_bytes=4096) == 100.0
    with pytest.raises(GateUnusable) as caught:
        await query_value(prometheus.url, f"sum({CANARY})", max_bytes=64)
    assert "more than 64 bytes" in str(caught.value) and prometheus.shown in str(caught.value)


async def test_a_closed_port_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(GateUnavailable) as caught:
        await query_value(url, "up", timeout_s=5)
    assert "cannot be reached" in str(caught.value) and url in str(caught.value) and "'up'" in str(caught.value)


async def test_503_and_silence_are_unavailable() -> None:
    with ThreadedHttp(Unavailable) as down, pytest.raises(GateUnavailable) as caught:
        await query_value(down.url, "up")
    assert "HTTP 503" in str(caught.value) and "TSDB not ready" in str(caught.value)

    with ThreadedHttp(Silent) as silent, pytest.raises(GateUnavailable) as caught:
        started = time.monotonic()
        await query_value(silent.url, "up", timeout_s=0.5)
    assert "did not answer within 0.5s" in str(caught.value)
    assert time.monotonic() - started < 2


async def test_a_200_that_is_not_json_is_unusable(prometheus: Prometheus) -> None:
    with ThreadedHttp(Target) as not_prometheus, pytest.raises(GateUnusable) as caught:
        await query_value(not_prometheus.url, "up")
    assert "not its JSON API" in str(caught.value) and "plnt_gateway_requests" in str(caught.value)


async def test_credentials_authenticate_and_never_show(prometheus: Prometheus) -> None:
    """The user:password in the URL is sent as basic auth (Prometheus requires it here), and no
    message, whatever the error, holds it."""
    assert await query_value(prometheus.url, f"sum({CANARY})") == 100.0
    wrong = prometheus.url.replace(PASSWORD, "not-the-password")
    with pytest.raises(GateUnusable, match="HTTP 401"):
        await query_value(wrong, "up")
    with pytest.raises(GateUnusable, match="HTTP 401"):
        await query_value(prometheus.shown, "up")  # none at all

    closed = f"http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}"
    messages = []
    for url, query, options in [
        (prometheus.url, 'plnt_gateway_requests_total{track="stable"}', {}),  # no series
        (prometheus.url, CANARY, {}),  # two series
        (prometheus.url, f"sum({CANARY}", {}),  # syntax
        (prometheus.url, f"sum({CANARY})", {"max_bytes": 64}),  # too big
        (wrong, "up", {}),  # refused
        (closed, "up", {"timeout_s": 5}),  # unreachable
        (f"{prometheus.url}?a=b", "up", {}),  # a URL plnt refuses
    ]:
        with pytest.raises((GateUnusable, GateUnavailable)) as caught:
            await query_value(url, query, **options)  # type: ignore[arg-type]
        messages.append(str(caught.value))
    assert len(messages) == 7
    for message in messages:
        assert PASSWORD not in message and "not-the-password" not in message and f"{USER}:" not in message, message
        assert "http://127.0.0.1:" in message, message
