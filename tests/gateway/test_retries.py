"""Retries at the gateway with real runner processes (`python -m plnt.runner`): a canary whose runner is
killed is answered by the stable release, no side-effecting step ever runs twice, and each retry is in the
metrics and the call log, its failed attempt counted against the canary."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.upstream import UpstreamClient
from plnt.gateway.router import Router
from plnt.reconciler.drivers.processes import free_port

from tests.gateway.conftest import StartGateway, StartServer
from tests.runner.helpers import write_recipe

pytestmark = pytest.mark.integration

STEPS = """
- {id: record, tool: python, sideEffects: true}
- {id: answer, tool: python, deps: [record]}
"""


def module(log: Path, delay_s: float) -> str:
    # The side effect: one line per run of the step, named by the request's number.
    return f"""
import time
def record(ctx):
    with open({str(log)!r}, "a") as f:
        f.write(str(ctx.inputs["i"]) + "\\n")
    time.sleep({delay_s})
    return ctx.inputs["i"]
def answer(ctx):
    return {{"i": ctx.results["record"]}}
"""


class RunnerProcess:
    """One real runner process serving the recipe, its side effects in `log`."""

    def __init__(self, tmp: Path, name: str, delay_s: float = 0.0) -> None:
        self.log = tmp / f"{name}.log"
        self.log.touch()
        self.recipe = write_recipe(tmp / name, STEPS, module(self.log, delay_s))
        self.port = free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "plnt.runner", "--recipe", str(self.recipe), "--host", "127.0.0.1",
             "--port", str(self.port), "--release-id", f"rel-{name}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.backend = Backend(f"http://127.0.0.1:{self.port}", name, f"rel-{name}")

    async def healthy(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(trust_env=False) as client:
            while time.monotonic() < deadline:
                assert self.process.poll() is None, self.process.stderr.read().decode()  # type: ignore[union-attr]
                try:
                    if (await client.get(f"{self.backend.endpoint}/healthz", timeout=1)).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)
        raise AssertionError("runner did not become healthy")

    def ran(self) -> list[int]:
        return [int(line) for line in self.log.read_text().split()]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def runners(tmp_path: Path):  # type: ignore[no-untyped-def]
    started: list[RunnerProcess] = []

    def start(name: str, delay_s: float = 0.0) -> RunnerProcess:
        runner = RunnerProcess(tmp_path, name, delay_s)
        started.append(runner)
        return runner

    yield start
    for runner in started:
        runner.stop()


async def invoke_many(url: str, numbers: range, concurrency: int) -> dict[int, tuple[int, str, bytes]]:
    """{i: (status, x-plnt-track, body)} of POST /workflows/counter/invoke {"i": i}."""
    client = UpstreamClient(read_timeout_s=30)
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> tuple[int, tuple[int, str, bytes]]:
        async with sem:
            response = await client.request(url, "POST", "/workflows/counter/invoke", body=b'{"i": %d}' % i,
                                            headers=[("content-type", "application/json")])
        return i, (response.status, (response.header(b"x-plnt-track") or b"").decode(), response.body)

    try:
        return dict(await asyncio.gather(*(one(i) for i in numbers)))
    finally:
        await client.aclose()


async def test_a_killed_canary_loses_no_request_and_nothing_runs_twice(runners, start_gateway: StartGateway) -> None:  # type: ignore[no-untyped-def]
    stable, canary = runners("1.0.0"), runners("1.1.0")
    await asyncio.gather(stable.healthy(), canary.healthy())
    router = Router(RouteTable([Route("default", "counter", stable=stable.backend, canary=canary.backend,
                                      traffic_percent=50)]))
    gw = await start_gateway(router)

    before = await invoke_many(gw.url, range(0, 100), concurrency=8)
    assert {status for status, _, _ in before.values()} == {200}
    assert {track for _, track, _ in before.values()} == {"stable", "canary"}

    canary.process.send_signal(signal.SIGKILL)  # the canary's runner dies (its connections are reset)
    canary.process.wait(10)
    after = await invoke_many(gw.url, range(100, 160), concurrency=8)

    # No user error: every request after the death is answered, by the stable release.
    assert {status for status, _, _ in after.values()} == {200}
    assert {track for _, track, _ in after.values()} == {"stable"}
    # Nothing ran twice, and everything answered ran exactly once (on the release that answered it).
    ran = stable.ran() + canary.ran()
    assert sorted(ran) == list(range(160))
    assert set(canary.ran()) == {i for i, (_, track, _) in before.items() if track == "canary"}

    # Visible: retries by reason in /metrics; each retried request's failed attempt on the canary is a call
    # of its own (502, upstream_unavailable: the compare gate's ledger sees the canary fail); the answered
    # call names the canary it first went to and why.
    metrics = (await gw.client.get("/metrics")).text
    retried = [line for line in metrics.splitlines() if line.startswith("plnt_gateway_retries_total{")]
    assert len(retried) == 1 and 'reason="connect_refused"' in retried[0] and 'workflow="counter"' in retried[0]
    count = float(retried[0].rsplit(" ", 1)[1])
    assert 10 < count < 50  # about half of the 60 (Binomial(60, 0.5): 30 +- 12 at 3 sigma)
    assert ('plnt_gateway_requests_total{api="invoke",code="502",namespace="default",track="canary",'
            f'version="1.1.0",workflow="counter"}} {count}') in metrics
    calls = (await gw.client.get("/calls", params={"limit": 1000})).json()  # all of them: within the log's 200
    assert len(calls) == 160 + count
    failed = [c for c in calls if c["track"] == "canary" and c["code"] == 502]
    answered = [c for c in calls if c["retry"] is not None]
    assert len(failed) == len(answered) == count
    assert {c["retried"] for c in failed} == {"connect_refused"} and {c["errorType"] for c in failed} == {
        "upstream_unavailable"}
    assert {(c["track"], c["code"], c["retry"]["from"], c["retry"]["reason"]) for c in answered} == {
        ("stable", 200, "canary 1.1.0", "connect_refused")}


async def test_a_canary_killed_mid_request_is_not_run_again(runners, start_gateway: StartGateway) -> None:  # type: ignore[no-untyped-def]
    """A runner request whose body reached a canary that then died may have run a side-effecting step:
    it is answered 502, never sent to the stable release."""
    stable, canary = runners("1.0.0"), runners("1.1.0", delay_s=30.0)
    await asyncio.gather(stable.healthy(), canary.healthy())
    router = Router(RouteTable([Route("default", "counter", stable=stable.backend, canary=canary.backend,
                                      traffic_percent=100)]))
    gw = await start_gateway(router)
    pending = asyncio.ensure_future(gw.client.post("/workflows/counter/invoke", json={"i": 7}))
    deadline = time.monotonic() + 20
    while canary.ran() != [7]:  # the side effect happened; the step sleeps
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    canary.process.send_signal(signal.SIGKILL)
    response = await pending
    assert response.status_code == 502 and response.json()["error"]["type"] == "upstream_error"
    assert stable.ran() == []  # not repeated
    metrics = (await gw.client.get("/metrics")).text
    assert "plnt_gateway_retries_total{" not in metrics


async def test_a_not_started_answer_is_sent_to_stable(runners, start_server: StartServer,
                                                       start_gateway: StartGateway) -> None:  # type: ignore[no-untyped-def]
    """A 503 with X-Plnt-Not-Started: 1 (the contract for a runner, or whatever stands before one, that refused
    an invocation before running anything; a stand-in answers every invocation so) is retried on stable; a 503
    without it is not."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    stable = runners("1.0.0")
    await stable.healthy()
    said = {"not_started": True}
    stand_in = FastAPI()

    @stand_in.post("/invoke")
    async def refuse() -> JSONResponse:
        headers = {"x-plnt-not-started": "1"} if said["not_started"] else {}
        return JSONResponse({"error": {"type": "not_started" if headers else "overloaded", "message": "no",
                                       "step": None}}, status_code=503, headers=headers)

    canary = await start_server(stand_in)
    router = Router(RouteTable([Route("default", "counter", stable=stable.backend,
                                      canary=Backend(canary.url, "1.1.0", "rel-1.1.0"), traffic_percent=100)]))
    gw = await start_gateway(router)
    response = await gw.client.post("/workflows/counter/invoke", json={"i": 1})
    assert response.status_code == 200 and response.headers["x-plnt-track"] == "stable"
    assert stable.ran() == [1]
    said["not_started"] = False
    response = await gw.client.post("/workflows/counter/invoke", json={"i": 2})
    assert response.status_code == 503 and response.headers["x-plnt-track"] == "canary"
    assert stable.ran() == [1]
    # X-Plnt-Track: canary is never moved to stable, even when nothing ran.
    said["not_started"] = True
    response = await gw.client.post("/workflows/counter/invoke", json={"i": 3}, headers={"x-plnt-track": "canary"})
    assert response.status_code == 503 and stable.ran() == [1]
    metrics = (await gw.client.get("/metrics")).text
    assert 'plnt_gateway_retries_total{namespace="default",reason="not_started",workflow="counter"} 1.0' in metrics
