"""`plnt gateway` as a role of its own: real processes following a control plane's route table.

1. A real `plnt up` (console script, embedded Temporal, runner processes) on a copy of
   gitops-example with `--internal-token-file`, and TWO `plnt gateway` processes following it:
   both serve review-responder; a commit (+ hook) is served by both within seconds of plnt up's
   own gateway; with plnt up frozen (SIGSTOP: its HTTP stops answering, its runners keep running)
   both keep answering from their last table and say the control plane is unreachable; plnt up
   killed (SIGKILL: its runners, in sessions of their own, keep running) both keep answering; plnt
   up restarted on the same state dir (a new epoch) and a new commit: both serve it.
2. A canary's share honoured by a `plnt gateway`: the control plane here is the real
   `RoutePublisher` + `add_control_routes` served in the test's process (so the test can publish a
   table with `traffic_percent`), and the runners are STAND-INS (`FakeRunner`, tests/gateway/fakes.py).
   The control plane is then stopped: the gateway keeps its last table.

The runners' model in (1) is MockBackend (`--backend mock`), a STAND-IN for a model server; the
example's recipes are signed by the demo authority (gitops-example/trust), no Sigstore service.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.core.routes import Backend, Route, RouteTable
from plnt.core.server import GatewayServer
from plnt.gateway.app import create_app
from plnt.gateway.route_watch import RoutePublisher, add_control_routes
from plnt.gateway.router import Router
from plnt.reconciler.drivers.processes import free_port

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp
from tests.gateway.fakes import FakeRunner

pytestmark = pytest.mark.integration

INTERNAL_TOKEN = "internal-7f3a-never-in-a-log"
GATEWAY_TOKEN = "app-token-9c1e-never-in-a-log"
RUN_FILE = "workflowruns/review-responder.yaml"


class GatewayProc:
    """One `plnt gateway` process and its log."""

    def __init__(self, control_url: str, token_file: Path, log_file: Path, *, tokens_file: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = log_file
        self.headers = {"authorization": f"Bearer {GATEWAY_TOKEN}"} if tokens_file else {}
        args = [*PLNT, "gateway", "--control-url", control_url, "--internal-token-file", str(token_file),
                "--port", str(self.port), "--watch-wait", "2", "--watch-retry-max", "1"]
        if tokens_file:
            args += ["--tokens-file", str(tokens_file)]
        with open(log_file, "wb") as out:
            self.process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def why(self, message: str) -> str:
        return f"{message}\n--- gateway log ({self.log_file}) ---\n{self.log()}"

    async def health(self) -> tuple[int, dict[str, Any]]:
        async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
            try:
                response = await client.get(f"{self.url}/healthz")
            except httpx.HTTPError:
                return 0, {}
        return response.status_code, response.json()

    async def wait_health(self, check: Any, what: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        state: dict[str, Any] = {}
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.why(f"plnt gateway exited with {self.process.returncode}")
            code, state = await self.health()
            if code and check(code, state):
                return state
            await asyncio.sleep(0.1)
        raise AssertionError(self.why(f"{what} not seen within {timeout:.0f}s; last /healthz: {state}"))

    async def wait_log(self, text: str, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.log():
            assert time.monotonic() < deadline, self.why(f"{what}: {text!r} not logged within {timeout:.0f}s")
            await asyncio.sleep(0.1)

    async def invoke(self, headers: dict[str, str] | None = None) -> httpx.Response:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            return await client.post(f"{self.url}/workflows/review-responder/invoke", json=REVIEW,
                                     headers={**self.headers, **(headers or {})})

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(timeout=30)
        assert code == 0, self.why(f"plnt gateway exited with {code} after SIGTERM")
        assert "plnt gateway: stopped" in self.log(), self.why("no stop line")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def processes() -> Iterator[list[Any]]:
    started: list[Any] = []
    yield started
    for process in reversed(started):
        process.kill()


async def invoke_version(url: str, headers: dict[str, str] | None = None) -> str | None:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        try:
            response = await client.post(f"{url}/workflows/review-responder/invoke", json=REVIEW, headers=headers or {})
        except httpx.HTTPError:
            return None
    return response.json().get("version") if response.status_code == 200 else None


async def until_serving(url: str, version: str, headers: dict[str, str] | None = None, timeout: float = 60.0) -> float:
    """Poll invocations until `version` answers; returns when (monotonic)."""
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        seen = await invoke_version(url, headers)
        if seen == version:
            return time.monotonic()
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} did not serve {version} within {timeout:.0f}s (last: {seen})")


def deploy(repo: SpecRepo, version: str) -> str:
    text = (repo.path / RUN_FILE).read_text()
    current = next(line for line in text.splitlines() if "ref: review-responder@" in line).split("@")[1].strip()
    repo.replace(RUN_FILE, f"review-responder@{current}", f"review-responder@{version}")
    return repo.commit(f"review-responder {version}")


async def test_two_gateways_follow_plnt_up_through_commits_freezes_kill_and_restart(
    spec_repo: SpecRepo, tmp_path: Path, processes: list[Any]
) -> None:
    token_file = tmp_path / "internal-token"
    token_file.write_text(INTERNAL_TOKEN + "\n")
    tokens_file = tmp_path / "gateway-tokens"
    tokens_file.write_text(f"{GATEWAY_TOKEN} review-responder\n")
    state_dir = tmp_path / "state"
    port = free_port()
    up = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log", extra=("--internal-token-file", str(token_file)))
    processes.append(up)
    await asyncio.to_thread(up.wait_ready)

    # The route watch refuses callers without the internal token, over real HTTP too.
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        assert (await client.get(f"{up.url}/internal/routes?wait=0")).status_code == 401
        assert (await client.get(f"{up.url}/internal/routes?wait=0",
                                 headers={"authorization": f"Bearer {GATEWAY_TOKEN}"})).status_code == 401
        ok = await client.get(f"{up.url}/internal/routes?wait=0", headers={"authorization": f"Bearer {INTERNAL_TOKEN}"})
        assert ok.status_code == 200 and ok.json()["routes"][0]["name"] == "review-responder", ok.text

    gateways = [GatewayProc(up.url, token_file, tmp_path / f"gateway-{i}.log", tokens_file=tokens_file) for i in (1, 2)]
    processes.extend(gateways)
    for gateway in gateways:
        await gateway.wait_health(lambda code, state: code == 200, "a first route table")
    for gateway in gateways:
        response = await gateway.invoke()
        assert response.status_code == 200 and response.json()["version"] == "1.2.0", gateway.why(response.text)
        assert response.headers["x-plnt-track"] == "stable"
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            rows = (await client.get(f"{gateway.url}/workflows", headers=gateway.headers)).json()
            assert [(r["name"], r["phase"], r["version"]) for r in rows] == [("review-responder", "Ready", "1.2.0")]
            assert "endpoint" not in rows[0]  # an invoke token sees no runner address
            assert (await client.post(f"{gateway.url}/workflows/review-responder/invoke", json=REVIEW)).status_code == 401
            hook = await client.post(f"{gateway.url}/hooks/git")
            assert hook.status_code == 404 and "control plane" in hook.text

    # A commit, and the hook: plnt up's own gateway and both followers serve the new version.
    committed = time.monotonic()
    deploy(spec_repo, "1.3.0")
    async with httpx.AsyncClient(trust_env=False) as client:
        (await client.post(f"{up.url}/hooks/git")).raise_for_status()
    served = await asyncio.gather(until_serving(up.url, "1.3.0"),
                                  *(until_serving(g.url, "1.3.0", g.headers) for g in gateways))
    # How soon the followers served it is a figure (bench/split_gateway.py), not an assertion.
    print(f"commit -> 1.3.0 served: plnt up {served[0] - committed:.2f}s, gateways "
          f"{[round(t - committed, 2) for t in served[1:]]} s")
    version_before = [(await g.health())[1]["routes_version"] for g in gateways]

    # plnt up frozen: the control plane's HTTP answers nothing, its runners keep running.
    os.kill(up.process.pid, signal.SIGSTOP)
    try:
        for gateway in gateways:
            state = await gateway.wait_health(lambda code, state: code == 200 and state["control"] == "unreachable",
                                              "control unreachable", timeout=30)
            # The saga's last writes (Ready, the old runner retired) may still have been published
            # before the freeze; after it, the table stays the one the gateway had.
            assert state["routes_version"] >= min(version_before), state
            response = await gateway.invoke()
            assert response.status_code == 200 and response.json()["version"] == "1.3.0", gateway.why(response.text)
            assert (await gateway.health())[1]["routes_version"] == state["routes_version"], "a table from a frozen plnt"
            assert "control-unreachable" in gateway.log(), gateway.why("no control-unreachable line")
    finally:
        os.kill(up.process.pid, signal.SIGCONT)
    for gateway in gateways:
        await gateway.wait_health(lambda code, state: state.get("control") == "connected", "control reachable again")
        assert "control-reachable" in gateway.log(), gateway.why("no control-reachable line")

    # plnt up killed outright: both gateways keep answering from their last table.
    up.record_descendants()
    up.process.kill()
    up.process.wait()
    for gateway in gateways:
        for _ in range(5):
            response = await gateway.invoke()
            assert response.status_code == 200 and response.json()["version"] == "1.3.0", gateway.why(response.text)
        await gateway.wait_health(lambda code, state: code == 200 and state["control"] == "unreachable",
                                  "control unreachable after the kill")

    # plnt up again on the same state (a new epoch), then a new commit: both gateways follow.
    again = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log", extra=("--internal-token-file", str(token_file)))
    processes.append(again)
    await asyncio.to_thread(again.wait_ready, "review-responder", 90.0)
    for gateway in gateways:
        await gateway.wait_health(lambda code, state: state.get("control") == "connected", "the restarted control plane")
        # /healthz answers from one of the gateway's worker processes, and the one that answers may
        # not have held the old table (nothing to call a new epoch); another worker that did must
        # say so once it reconnects.
        await gateway.wait_log("new epoch", "the restarted control plane's table taken as a new epoch")
    committed = time.monotonic()
    deploy(spec_repo, "1.2.0")
    async with httpx.AsyncClient(trust_env=False) as client:
        (await client.post(f"{again.url}/hooks/git")).raise_for_status()
    served = await asyncio.gather(until_serving(again.url, "1.2.0"),
                                  *(until_serving(g.url, "1.2.0", g.headers) for g in gateways))
    print(f"gateways lagged the restarted plnt up by {[round(t - served[0], 2) for t in served[1:]]} s")

    for gateway in gateways:
        gateway.stop()
    again.stop_and_check(signal.SIGTERM)
    # Neither token in any log (the gateways' nor plnt up's).
    for log in [up.log(), again.log(), *(g.log() for g in gateways)]:
        assert INTERNAL_TOKEN not in log and GATEWAY_TOKEN not in log


async def test_a_gateway_honours_the_canary_share_and_keeps_its_table_without_control(
    tmp_path: Path, processes: list[Any]
) -> None:
    """Control plane: the real publisher and endpoint, in this process; runners: STAND-INS (FakeRunner)."""
    stable_runner, canary_runner = FakeRunner("1.0.0", workflow="review-responder"), FakeRunner("2.0.0", workflow="review-responder")
    servers = [GatewayServer(stable_runner.app(), "127.0.0.1", 0), GatewayServer(canary_runner.app(), "127.0.0.1", 0)]
    for server in servers:
        await server.start()
    publisher = RoutePublisher()
    control_app = create_app(Router(), list_workflows=list)
    add_control_routes(control_app, publisher, INTERNAL_TOKEN)
    control = GatewayServer(control_app, "127.0.0.1", 0, graceful_timeout_s=1)
    await control.start()
    try:
        stable = Backend(servers[0].url, "1.0.0", "rel-1")
        canary = Backend(servers[1].url, "2.0.0", "rel-2")
        publisher.publish(RouteTable([Route("default", "review-responder", stable=stable, canary=canary,
                                            traffic_percent=25)]), [{"name": "review-responder", "namespace": "default"}])
        token_file = tmp_path / "internal-token"
        token_file.write_text(INTERNAL_TOKEN)
        gateway = GatewayProc(control.url, token_file, tmp_path / "gateway.log")
        processes.append(gateway)
        await gateway.wait_health(lambda code, state: code == 200, "a first route table")

        async def tracks(n: int, session: str | None = None) -> Counter[str]:
            async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
                headers = {"x-session-id": session} if session else {}
                responses = await asyncio.gather(*(
                    client.post(f"{gateway.url}/workflows/review-responder/invoke", json={}, headers=headers)
                    for _ in range(n)))
            assert all(r.status_code == 200 for r in responses), [r.text for r in responses if r.status_code != 200][:3]
            return Counter(f"{r.headers['x-plnt-track']}:{r.json()['version']}" for r in responses)

        shares = await tracks(400)
        # 25% of 400 = 100, sd 8.7: 4.6 sd either side (seeded-free randomness; fails ~1 in 200,000 runs).
        assert 60 <= shares["canary:2.0.0"] <= 140 and shares["canary:2.0.0"] + shares["stable:1.0.0"] == 400, shares
        sticky = await tracks(20, session="user-42")
        assert len(sticky) == 1, sticky  # one session, one version

        # SSE, invoke and OpenAI chat, relayed by the follower as by plnt up's gateway.
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            stream = await client.post(f"{gateway.url}/workflows/review-responder/invoke", json={},
                                       headers={"accept": "text/event-stream", "x-session-id": "s"})
            assert stream.status_code == 200 and "event: token" in stream.text and "event: result" in stream.text
            chat = await client.post(f"{gateway.url}/v1/chat/completions", json={
                "model": "review-responder", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 200 and chat.text.rstrip().endswith("data: [DONE]"), chat.text
            models = (await client.get(f"{gateway.url}/v1/models")).json()
            assert [m["id"] for m in models["data"]] == ["review-responder"]

        publisher.publish(RouteTable([Route("default", "review-responder", stable=canary)]), [])  # promoted
        await gateway.wait_health(lambda code, state: state["routes_version"] == 2, "the promotion")
        assert await tracks(50) == Counter({"stable:2.0.0": 50})

        # The control plane goes away (as plnt up stops: waiting polls answered, then the server
        # stops): the gateway keeps serving its last table.
        publisher.close()
        await control.stop()
        await gateway.wait_health(lambda code, state: code == 200 and state["control"] == "unreachable",
                                  "control unreachable")
        assert await tracks(20) == Counter({"stable:2.0.0": 20})
        gateway.stop()
        assert INTERNAL_TOKEN not in gateway.log()
    finally:
        await control.stop()
        for server in servers:
            await server.stop()
