"""The roles apart, as separate processes: `plnt reconcile`, `plnt worker` and `plnt gateway` on one
real Temporal dev server and one real git repository, each with its own state directory (no shared
disk). Runners use the offline mock model backend, a stand-in for a model server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import PYTHON, SpecRepo
from tests.e2e.harness import REVIEW
from tests.services import _Process

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "internal-token-for-the-split-roles-test"  # roles with each other
USER = "admin-token-of-the-split-roles-test"       # people and CI with the control plane and gateways
AUTH = {"Authorization": f"Bearer {USER}"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Roles:
    """Starts and stops the role processes of one test."""

    def __init__(self, tmp_path: Path, repo: SpecRepo, temporal_address: str, namespace: str) -> None:
        self.tmp = tmp_path
        self.repo = repo
        self.temporal = ["--temporal-address", temporal_address, "--temporal-namespace", namespace]
        self.token_file = tmp_path / "internal.token"
        self.token_file.write_text(TOKEN + "\n")
        self.tokens = tmp_path / "tokens"
        self.tokens.write_text(f"{USER}\n")
        self.control_port = free_port()
        self.processes: list[_Process] = []

    @property
    def control_url(self) -> str:
        return f"http://127.0.0.1:{self.control_port}"

    def _start(self, name: str, args: list[str], ready: str) -> _Process:
        process = _Process([PYTHON, "-m", "plnt.reconciler.cli.main", *args], self.tmp / f"{name}.log")
        self.processes.append(process)
        process.wait_ready(ready, ok=(200,), timeout_s=60)
        return process

    def reconciler(self, name: str = "reconciler", *, port: int | None = None, state: str = "reconciler",
                   wait_active: bool = True) -> _Process:
        port = port or self.control_port
        args = ["reconcile", "--repo", str(self.repo.path), "--state-dir", str(self.tmp / state), "--port", str(port),
                "--interval", "1", "--internal-token-file", str(self.token_file), "--retry-initial-s", "0.2",
                "--tokens-file", str(self.tokens), *self.temporal]
        url = f"http://127.0.0.1:{port}/{'readyz' if wait_active else 'healthz'}"
        return self._start(name, args, url)

    def worker(self) -> _Process:
        port = free_port()
        args = ["worker", "--repo", str(self.repo.path), "--state-dir", str(self.tmp / "worker"), "--port", str(port),
                "--control-url", self.control_url, "--internal-token-file", str(self.token_file),
                "--report-interval", "0.5", "--drain-grace", "0.5", *self.temporal]
        return self._start("worker", args, f"http://127.0.0.1:{port}/readyz")

    def gateway(self, name: str) -> str:
        port = free_port()
        args = ["gateway", "--control-url", self.control_url, "--internal-token-file", str(self.token_file),
                "--port", str(port), "--tokens-file", str(self.tokens)]
        self._start(name, args, f"http://127.0.0.1:{port}/healthz")
        return f"http://127.0.0.1:{port}"

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            process.stop()


@pytest.fixture
def roles(tmp_path: Path, spec_repo: SpecRepo, temporal_address: str, temporal_namespace: str) -> Iterator[Roles]:
    roles = Roles(tmp_path, spec_repo, temporal_address, temporal_namespace)
    try:
        yield roles
    finally:
        roles.stop_all()


async def status(client: httpx.AsyncClient, url: str) -> dict | None:
    try:
        response = await client.get(f"{url}/workflows", headers=AUTH)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    rows = [row for row in response.json() if row["name"] == "review-responder"]
    return rows[0] if rows else None


# Two fresh processes (imports, Temporal's connection, the worker's registration) before the first
# saga: a minute was short on a 2-core machine running other suites beside.
FIRST_READY_S = 120


async def wait_phase(client: httpx.AsyncClient, url: str, phase: str, version: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await status(client, url)
        if last and last["phase"] == phase and (last["version"] == version or last.get("canaryVersion") == version):
            return last
        await asyncio.sleep(0.1)
    raise AssertionError(f"not {phase} {version} after {timeout}s: {last}")


async def status_rows(client: httpx.AsyncClient, url: str) -> list[dict]:
    response = await client.get(f"{url}/workflows", headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


async def invoke(client: httpx.AsyncClient, url: str) -> httpx.Response:
    return await client.post(f"{url}/workflows/review-responder/invoke", json=REVIEW, headers=AUTH)


async def served_version(client: httpx.AsyncClient, url: str, version: str, timeout: float = 15) -> float:
    """Seconds until `url` serves `version`."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            response = await invoke(client, url)
            if response.status_code == 200 and response.json()["version"] == version:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} does not serve {version} after {timeout}s")


async def test_roles_apart_serve_through_two_gateways_survive_a_killed_reconciler_and_heal(roles: Roles) -> None:
    roles.reconciler()
    roles.worker()
    async with httpx.AsyncClient(timeout=30) as client:
        await wait_phase(client, roles.control_url, "Ready", "1.2.0", timeout=FIRST_READY_S)
        gateways = [roles.gateway("gateway-1"), roles.gateway("gateway-2")]
        for url in gateways:
            await served_version(client, url, "1.2.0")

        # The reconciler dies hard. The runner is the worker's and the gateways keep their last table.
        roles.processes[0].proc.kill()
        roles.processes[0].proc.wait(timeout=10)
        for _ in range(3):
            for url in gateways:
                response = await invoke(client, url)
                assert response.status_code == 200 and response.json()["version"] == "1.2.0", response.text

        # A new reconciler (same state directory: the lock file is the lease) reads the worker's
        # report, plans nothing for what runs, and the next commit reaches both gateways within seconds.
        roles.reconciler("reconciler-2")
        roles.repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        roles.repo.commit("1.3.0")
        hooked = time.monotonic()
        response = await client.post(f"{roles.control_url}/hooks/git", headers=AUTH)
        assert response.status_code == 202, response.text
        await asyncio.gather(*(served_version(client, url, "1.3.0", timeout=60) for url in gateways))
        took = time.monotonic() - hooked
        print(f"commit -> 1.3.0 served by both gateways after a reconciler restart: {took:.2f}s")
        await wait_phase(client, roles.control_url, "Ready", "1.3.0")
        assert len(await status_rows(client, gateways[0])) == 1, "a gateway answers GET /workflows from its table"

        # A runner killed out of band: the worker reports the drift, the reconciler asks for it to be healed.
        record = next((roles.tmp / "worker" / "releases").glob("*.json"))
        pid = json.loads(record.read_text())["stable"]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while json.loads(record.read_text())["stable"]["pid"] == pid:
            assert time.monotonic() < deadline, "the killed runner was not restarted"
            await asyncio.sleep(0.1)
        await served_version(client, gateways[0], "1.3.0", timeout=30)
        log = (roles.tmp / "worker.log").read_text()
        assert "drift-healed workflowrun=default/review-responder" in log
        for name in ("worker", "reconciler-2", "gateway-1", "gateway-2"):
            assert TOKEN not in (roles.tmp / f"{name}.log").read_text(), f"the internal token is in {name}.log"


async def test_a_second_reconciler_waits_on_standby_and_takes_over(roles: Roles) -> None:
    roles.reconciler()
    standby_port = free_port()
    standby = roles.reconciler("standby", port=standby_port, wait_active=False)
    standby_url = f"http://127.0.0.1:{standby_port}"
    async with httpx.AsyncClient(timeout=10) as client:
        ready = await client.get(f"{standby_url}/readyz")
        assert ready.status_code == 503 and ready.json()["active"] is False
        refused = await client.get(f"{standby_url}/workflows", headers=AUTH)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "standby"
        assert (await client.get(f"{roles.control_url}/readyz")).status_code == 200

        roles.processes[0].proc.terminate()  # a clean stop releases the lease at once
        roles.processes[0].proc.wait(timeout=15)
        deadline = time.monotonic() + 15
        while (await client.get(f"{standby_url}/readyz")).status_code != 200:
            assert time.monotonic() < deadline, standby.tail()
            await asyncio.sleep(0.1)
        assert (await client.get(f"{standby_url}/workflows", headers=AUTH)).status_code == 200
    assert "lease-standby" in standby.tail() and "lease-acquired" in standby.tail()


async def test_a_canary_share_is_honoured_by_each_gateway(roles: Roles) -> None:
    roles.reconciler()
    roles.worker()
    async with httpx.AsyncClient(timeout=30) as client:
        await wait_phase(client, roles.control_url, "Ready", "1.2.0", timeout=FIRST_READY_S)
        gateways = [roles.gateway("gateway-1"), roles.gateway("gateway-2")]
        # 1.5.0 answers slowly (0.6 s per call) and its smoke test of 40 calls keeps it in canary for a while.
        roles.repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
        roles.repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 50")
        roles.repo.replace(RUN_FILE, "invocations: 10", "invocations: 40\n      concurrency: 1")
        roles.repo.commit("1.5.0 canary at 50%")
        await client.post(f"{roles.control_url}/hooks/git", headers=AUTH)
        await wait_phase(client, roles.control_url, "Canary", "1.5.0")
        for url in gateways:
            versions: Counter[str] = Counter()

            async def one(url: str = url, versions: Counter[str] = versions) -> None:
                response = await invoke(client, url)
                if response.status_code == 200:
                    versions[response.json()["version"]] += 1

            for _ in range(5):
                await asyncio.gather(*(one() for _ in range(12)))
            assert sum(versions.values()) == 60, (url, versions)
            assert 12 <= versions["1.5.0"] <= 48, (url, versions)  # 50% of 60, far outside chance either way
