"""Gateway worker processes (gateway/workers.py): `plnt up --gateway-workers N` and `plnt gateway
--workers N`, as users run them: the installed console script, embedded Temporal, real runner
processes, real worker processes sharing the port with SO_REUSEPORT.

Which process answered a connection is read from `GET /healthz` ("worker": 0 is plnt up's own
process, 1..N-1 its workers). An httpx client limited to one connection keeps that connection
(keep-alive), so every request it sends goes to the worker its /healthz named.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server; the example's
recipes are signed by the demo authority (gitops-example/trust), no Sigstore service.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, alive, cmdline
from tests.e2e.test_split_gateway import GatewayProc, deploy

pytestmark = pytest.mark.integration

ADMIN = "admin-5d1f-never-in-a-log"
INVOKER = "invoke-8b2c-never-in-a-log"
INTERNAL = "internal-2e9a-never-in-a-log"


class AuthedPlntUp(PlntUp):
    """plnt up with a tokens file: its readiness polls carry the admin token."""

    def workflows(self) -> list[dict[str, Any]] | None:
        try:
            response = httpx.get(f"{self.url}/workflows", timeout=2, trust_env=False,
                                 headers={"authorization": f"Bearer {ADMIN}"})
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None


def worker_pids(up: PlntUp) -> dict[int, str]:
    return {pid: start for pid, start in up.record_descendants().items() if "plnt.gateway.workers" in cmdline(pid)}


async def pinned_clients(url: str, count: int, timeout: float = 30.0) -> dict[int, httpx.AsyncClient]:
    """One keep-alive client per worker index, until `count` distinct workers answered."""
    clients: dict[int, httpx.AsyncClient] = {}
    deadline = time.monotonic() + timeout
    while len(clients) < count:
        assert time.monotonic() < deadline, f"only workers {sorted(clients)} answered within {timeout:.0f}s"
        client = httpx.AsyncClient(base_url=url, trust_env=False, timeout=30,
                                   limits=httpx.Limits(max_connections=1, max_keepalive_connections=1))
        try:
            worker = (await client.get("/healthz")).json()["worker"]
        except (httpx.HTTPError, KeyError, ValueError):
            worker = None
        if worker is None or worker in clients:
            await client.aclose()
            await asyncio.sleep(0.02)
            continue
        clients[worker] = client
    return clients


async def answered_by(client: httpx.AsyncClient) -> int:
    return (await client.get("/healthz")).json()["worker"]


async def test_plnt_up_gateway_workers_share_the_port_auth_routes_restart_and_stop(
    spec_repo: SpecRepo, tmp_path: Path
) -> None:
    tokens_file = tmp_path / "tokens"
    tokens_file.write_text(f"{ADMIN}\n{INVOKER} review-responder\n")
    up = AuthedPlntUp(spec_repo.path, tmp_path / "state", free_port(), tmp_path / "plnt.log",
                      extra=("--gateway-workers", "3", "--tokens-file", str(tokens_file)))
    clients: dict[int, httpx.AsyncClient] = {}
    try:
        await asyncio.to_thread(up.wait_ready)
        # The default layout: 3 worker processes on the port (1..3); plnt up's own (0) only holds it.
        assert len(worker_pids(up)) == 3, up.why(f"expected 3 worker processes besides plnt up: {up.seen}")
        clients = await pinned_clients(up.url, 3)
        assert sorted(clients) == [1, 2, 3]
        admin = {"authorization": f"Bearer {ADMIN}"}
        invoker = {"authorization": f"Bearer {INVOKER}"}

        # Every process: the same auth, the same routes, the same list, the control endpoints.
        source = None
        for index, client in clients.items():
            assert await answered_by(client) == index  # still the same connection, the same process
            refused = await client.post("/workflows/review-responder/invoke", json=REVIEW)
            assert refused.status_code == 401, up.why(f"worker {index}: {refused.text}")
            assert (await client.get("/workflows")).status_code == 401
            wrong = await client.post("/workflows/review-responder/invoke", json=REVIEW,
                                      headers={"authorization": "Bearer not-a-token"})
            assert wrong.status_code == 401
            ok = await client.post("/workflows/review-responder/invoke", json=REVIEW, headers=invoker)
            assert ok.status_code == 200 and ok.json()["version"] == "1.2.0", up.why(f"worker {index}: {ok.text}")
            rows = (await client.get("/workflows", headers=invoker)).json()
            assert [(r["name"], r["phase"]) for r in rows] == [("review-responder", "Ready")]
            assert "endpoint" not in rows[0]
            assert (await client.get("/workflows", headers=admin)).json()[0]["endpoint"].startswith("http://127.0.0.1:")
            stream = await client.post("/workflows/review-responder/invoke", json=REVIEW,
                                       headers={**invoker, "accept": "text/event-stream"})
            assert stream.status_code == 200 and stream.headers["content-type"].startswith("text/event-stream")
            assert "event: result" in stream.text, stream.text[:300]
            preview = await client.post("/workflows/review-responder/invoke", json=REVIEW,
                                        headers={**invoker, "x-plnt-preview": "7"})
            assert preview.status_code == 404 and "pull request 7" in preview.text, preview.text
            chat = await client.post("/v1/chat/completions", headers=invoker, json={
                "model": "review-responder", "messages": [{"role": "user", "content": "slow parking"}]})
            assert chat.status_code == 200 and chat.json()["object"] == "chat.completion", chat.text
            # Control endpoints, forwarded to plnt up by its workers: the same answers and the same auth.
            assert (await client.get("/source", headers=invoker)).status_code == 403
            got = await client.get("/source", headers=admin)
            assert got.status_code == 200, up.why(f"worker {index}: /source {got.text}")
            source = source or got.json()
            assert got.json().get("lastReconciledCommit") == source.get("lastReconciledCommit")
            history = await client.get("/workflows/review-responder/history", headers=admin)
            assert history.status_code == 200, up.why(f"worker {index}: history {history.text}")
            assert (await client.post("/hooks/git", headers=invoker)).status_code == 403
            assert (await client.post("/hooks/git", headers=admin)).status_code == 202
            internal = await client.get("/internal/routes?wait=0", headers=invoker)
            assert internal.status_code in (401, 403), internal.text

        # GET /metrics, whichever process answers: the sum over all of them (each pushes its own
        # every 2 s): two successful invokes (JSON, SSE) were sent through each of the three.
        deadline = time.monotonic() + 15
        counted = -1.0
        while counted != 6 and time.monotonic() < deadline:
            text = (await clients[1].get("/metrics", headers=admin)).text
            counted = sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                          if s.name == "plnt_gateway_requests_total" and s.labels.get("api") == "invoke"
                          and s.labels.get("code") == "200")
            await asyncio.sleep(0.3)
        assert counted == 6, up.why(f"GET /metrics counts {counted} invokes answered 200, not 6")
        assert (await clients[2].get("/metrics", headers=invoker)).status_code == 403

        # A commit (and a hook through a worker): every process routes to the new release.
        deploy(spec_repo, "1.3.0")
        assert (await clients[2].post("/hooks/git", headers=admin)).status_code == 202
        deadline = time.monotonic() + 90
        pending = set(clients)
        while pending and time.monotonic() < deadline:
            for index in list(pending):
                response = await clients[index].post("/workflows/review-responder/invoke", json=REVIEW, headers=invoker)
                if response.status_code == 200 and response.json()["version"] == "1.3.0":
                    pending.discard(index)
            await asyncio.sleep(0.1)
        assert not pending, up.why(f"workers {sorted(pending)} still not routing to 1.3.0")

        # A killed worker is started again, and answers on the port again.
        for client in clients.values():
            await client.aclose()
        before = worker_pids(up)
        victim = max(before)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(now := worker_pids(up)) < 3 or victim in now):
            await asyncio.sleep(0.1)
        now = worker_pids(up)
        assert len(now) == 3 and victim not in now, up.why(f"worker {victim} not replaced: {now}")
        clients = await pinned_clients(up.url, 3)
        assert "gateway-worker-exited" in up.log(), up.why("no restart line")

        up.stop_and_check(signal.SIGTERM)  # exits 0 and leaves no process behind (workers included)
        for pid, start in {**before, **now}.items():
            assert not alive(pid, start), up.why(f"worker {pid} outlived plnt up")
        assert ADMIN not in up.log() and INVOKER not in up.log()
    finally:
        for client in clients.values():
            await client.aclose()
        up.kill()


async def test_plnt_gateway_workers_follow_through_plnt_up_workers_and_die_with_their_parent(
    spec_repo: SpecRepo, tmp_path: Path
) -> None:
    token_file = tmp_path / "internal"
    token_file.write_text(INTERNAL + "\n")
    up = PlntUp(spec_repo.path, tmp_path / "state", free_port(), tmp_path / "plnt.log",
                extra=("--gateway-workers", "2", "--control-plane-gateway", "--internal-token-file", str(token_file)))
    gateway: GatewayProc | None = None
    clients: dict[int, httpx.AsyncClient] = {}
    try:
        await asyncio.to_thread(up.wait_ready)
        # plnt up's own process is one of the two on its port (--control-plane-gateway).
        pinned = await pinned_clients(up.url, 2)
        for client in pinned.values():
            await client.aclose()
        assert sorted(pinned) == [0, 1]
        # `plnt gateway` follows plnt up's public port: its long-polls land on either of plnt up's
        # processes (a worker forwards /internal/routes to the control plane).
        gateway = GatewayProc(up.url, token_file, tmp_path / "gateway.log")
        gateway.process.kill()  # GatewayProc starts one process; start it again with --workers 2
        gateway.process.wait()
        import subprocess

        from tests.e2e.test_plnt_up_process import PLNT

        with open(gateway.log_file, "wb") as out:
            gateway.process = subprocess.Popen(
                [*PLNT, "gateway", "--control-url", up.url, "--internal-token-file", str(token_file), "--port",
                 str(gateway.port), "--watch-wait", "2", "--watch-retry-max", "1", "--workers", "2"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        await gateway.wait_health(lambda code, state: code == 200, "a first route table")
        clients = await pinned_clients(gateway.url, 2)
        for client in clients.values():
            response = await client.post("/workflows/review-responder/invoke", json=REVIEW)
            assert response.status_code == 200 and response.json()["version"] == "1.2.0", gateway.why(response.text)
        deploy(spec_repo, "1.3.0")
        async with httpx.AsyncClient(trust_env=False) as hook:
            (await hook.post(f"{up.url}/hooks/git")).raise_for_status()
        deadline = time.monotonic() + 90
        pending = set(clients)
        while pending and time.monotonic() < deadline:
            for index in list(pending):
                response = await clients[index].post("/workflows/review-responder/invoke", json=REVIEW)
                if response.status_code == 200 and response.json()["version"] == "1.3.0":
                    pending.discard(index)
            await asyncio.sleep(0.1)
        assert not pending, gateway.why(f"gateway workers {sorted(pending)} still not routing to 1.3.0")
        for client in clients.values():
            await client.aclose()
        clients = {}

        # plnt gateway stopped: its worker goes with it.
        from tests.e2e.test_plnt_up_process import descendants

        gateway_children = descendants(gateway.process.pid)
        assert any("plnt.gateway.workers" in cmdline(pid) for pid in gateway_children), gateway_children
        gateway.stop()
        assert not [pid for pid, start in gateway_children.items() if alive(pid, start)], gateway.why("left behind")

        # plnt up killed outright (no cleanup of its own): its gateway workers still do not outlive it.
        workers = worker_pids(up)
        assert len(workers) == 1, up.why(f"{workers}")
        up.process.kill()
        up.process.wait()
        deadline = time.monotonic() + 10
        while [pid for pid, start in workers.items() if alive(pid, start)] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert not [pid for pid, start in workers.items() if alive(pid, start)], up.why("a worker outlived plnt up")
        for text in (up.log(), gateway.log()):
            assert INTERNAL not in text
    finally:
        for client in clients.values():
            await client.aclose()
        if gateway is not None:
            gateway.kill()
        up.kill()
