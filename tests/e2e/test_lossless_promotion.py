"""No request is lost when a canary is promoted (or a release retired) while clients invoke.

As users run it, in both layouts: `plnt up --gateway-workers 3` (the installed console script,
embedded Temporal, real runner processes, three gateway worker processes sharing the port) with a
separate `plnt gateway` following it; and the roles apart (`plnt reconcile`, `plnt worker`, two
`plnt gateway`s, one real Temporal dev server). Clients invoke through both, JSON and SSE, without pause, while commits
promote 1.3.0 and 1.2.0 in turn. The old stable runner must be stopped only once every gateway
process serves routes without it and has no request left on it: zero failed requests.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server; the example's
recipes are signed by the demo authority (gitops-example/trust), no Sigstore service.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp
from tests.e2e.test_split_gateway import GatewayProc, deploy
from tests.e2e.test_split_roles import AUTH, Roles, roles  # noqa: F401 - roles: the fixture
from tests.e2e.test_split_roles import wait_phase as wait_role_phase

pytestmark = pytest.mark.integration

INTERNAL = "internal-4c7d-never-in-a-log"
PROMOTIONS = 6


@dataclass
class Load:
    """Clients invoking without pause; every answer that is not a whole 200 is a failure."""

    served: Counter[str] = field(default_factory=Counter)  # version -> answers
    failures: list[str] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    auth: dict[str, str] = field(default_factory=dict)

    async def client(self, url: str, stream: bool) -> None:
        headers = {**self.auth, **({"accept": "text/event-stream"} if stream else {})}
        # A fresh connection now and then: SO_REUSEPORT spreads connections, not requests, over the workers.
        while not self.stop.is_set():
            async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=30) as client:
                for _ in range(20):
                    if self.stop.is_set():
                        return
                    try:
                        response = await client.post("/workflows/review-responder/invoke", json=REVIEW, headers=headers)
                    except httpx.HTTPError as exc:
                        self.failures.append(f"{url} {'SSE' if stream else 'JSON'}: {type(exc).__name__}: {exc}")
                        continue
                    if response.status_code != 200 or (stream and "event: result" not in response.text):
                        self.failures.append(f"{url} {'SSE' if stream else 'JSON'}: {response.status_code} "
                                             f"{response.text[:300]}")
                        continue
                    self.served[response.headers.get("x-plnt-version", "?")] += 1


async def wait_ready_version(up: PlntUp, version: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    row = None
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        while time.monotonic() < deadline:
            rows = (await client.get(f"{up.url}/workflows")).json()
            row = next((r for r in rows if r["name"] == "review-responder"), None)
            if row and row["phase"] == "Ready" and row["version"] == version and not row.get("canaryVersion"):
                return
            await asyncio.sleep(0.1)
    raise AssertionError(up.why(f"review-responder not Ready at {version} within {timeout:.0f}s: {row}"))


async def test_promotions_under_load_lose_no_request(spec_repo: SpecRepo, tmp_path: Path) -> None:
    token_file = tmp_path / "internal"
    token_file.write_text(INTERNAL + "\n")
    up = PlntUp(spec_repo.path, tmp_path / "state", free_port(), tmp_path / "plnt.log",
                extra=("--gateway-workers", "3", "--internal-token-file", str(token_file)))
    gateway: GatewayProc | None = None
    load = Load()
    clients: list[asyncio.Task[None]] = []
    try:
        await asyncio.to_thread(up.wait_ready)
        gateway = GatewayProc(up.url, token_file, tmp_path / "gateway.log")
        await gateway.wait_health(lambda code, state: code == 200, "a first route table")
        clients = [asyncio.create_task(load.client(url, stream))
                   for url in (up.url, up.url, up.url, up.url, gateway.url, gateway.url)
                   for stream in (False, True)]
        versions = ["1.3.0", "1.2.0"] * (PROMOTIONS // 2)
        async with httpx.AsyncClient(trust_env=False) as hook:
            for version in versions:
                deploy(spec_repo, version)
                (await hook.post(f"{up.url}/hooks/git")).raise_for_status()
                await wait_ready_version(up, version)
                await asyncio.sleep(0.5)  # serve the new stable a while under load
        load.stop.set()
        await asyncio.gather(*clients)
        clients = []

        log = up.log()
        assert not load.failures, up.why(f"{len(load.failures)} failed requests of "
                                         f"{sum(load.served.values()) + len(load.failures)}: {load.failures[:10]}")
        assert load.served["1.2.0"] > 0 and load.served["1.3.0"] > 0, load.served
        # Each retired runner was stopped after every gateway let go of it, not after a timeout.
        assert log.count("runner-drained ") >= PROMOTIONS, up.why("fewer drains than promotions")
        assert "runner-drain-timeout" not in log, up.why("a drain ran into its bound")
        print(f"promotions={PROMOTIONS} answered={dict(load.served)} failed=0")
    finally:
        load.stop.set()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        if gateway is not None:
            gateway.kill()
        up.kill()


async def test_promotions_with_the_roles_apart_lose_no_request(roles: Roles) -> None:  # noqa: F811 - the fixture
    """The worker stops a retired runner only once the reconciler says both gateways let go of it."""
    roles.reconciler()
    worker = roles.worker()
    gateways = [roles.gateway("gateway-a"), roles.gateway("gateway-b")]
    load = Load(auth=AUTH)
    clients: list[asyncio.Task[None]] = []
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
            await wait_role_phase(client, roles.control_url, "Ready", "1.2.0")
            clients = [asyncio.create_task(load.client(url, stream)) for url in gateways for stream in (False, True, False)]
            versions = ["1.3.0", "1.2.0"] * (PROMOTIONS // 2)
            for version in versions:
                deploy(roles.repo, version)
                (await client.post(f"{roles.control_url}/hooks/git", headers=AUTH)).raise_for_status()
                deadline = time.monotonic() + 90
                while True:
                    rows = (await client.get(f"{roles.control_url}/workflows", headers=AUTH)).json()
                    row = next((r for r in rows if r["name"] == "review-responder"), {})
                    if row.get("phase") == "Ready" and row.get("version") == version and not row.get("canaryVersion"):
                        break
                    assert time.monotonic() < deadline, f"not Ready at {version}: {row}"
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.5)
        load.stop.set()
        await asyncio.gather(*clients)
        clients = []
        log = worker.log.read_text(errors="replace")
        assert not load.failures, f"{len(load.failures)} failed requests: {load.failures[:10]}"
        assert load.served["1.2.0"] > 0 and load.served["1.3.0"] > 0, load.served
        assert log.count("runner-drained ") >= PROMOTIONS, log[-3000:]
        assert "drain-unconfirmed" not in log and "runner-drain-timeout" not in log, log[-3000:]
        print(f"roles apart: promotions={PROMOTIONS} answered={dict(load.served)} failed=0")
    finally:
        load.stop.set()
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
