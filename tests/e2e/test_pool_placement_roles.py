"""Placement across a pool with the roles apart: `plnt reconcile`, `plnt worker` and `plnt gateway` as
separate processes on one machine. review-responder on a pool of two local backends runs one replica
on each; lowering one backend's capacity to 0 in git makes the reconciler re-place the replica, and
the worker applies the placement it gets in the reply to its next report (the same release, moved in
place), while clients invoking through the gateway see no failed request. Runners use the offline
mock model backend, a stand-in for a model server."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.e2e.test_pool_placement import POOL
from tests.e2e.test_replicas import alive
from tests.e2e.test_split_roles import FIRST_READY_S, RUN_FILE, Roles, invoke, roles, status, wait_phase  # noqa: F401

pytestmark = pytest.mark.integration


def worker_stable(roles: Roles) -> dict:  # noqa: F811
    records = list((roles.tmp / "worker" / "releases").glob("*.json"))
    assert len(records) == 1, records
    stable = json.loads(records[0].read_text()).get("stable")
    assert stable is not None
    return stable


def backends_of(stable: dict) -> list[str]:
    return [stable["backend"], *(extra["backend"] for extra in stable.get("more_replicas") or ())]


async def test_the_worker_applies_the_reconcilers_re_placement(roles: Roles) -> None:  # noqa: F811
    roles.repo.write("backends/pool.yaml", POOL)
    roles.repo.replace(RUN_FILE, "    cluster: local", "    selector: {matchLabels: {pool: agents}}")
    roles.repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    roles.repo.commit("review-responder on the agents pool, two replicas")
    roles.reconciler()
    roles.worker()
    async with httpx.AsyncClient(timeout=30) as client:
        ready = await wait_phase(client, roles.control_url, "Ready", "1.2.0", timeout=FIRST_READY_S)
        spread = worker_stable(roles)
        assert spread["placement"] == {"east": 1, "west": 1} and sorted(backends_of(spread)) == ["east", "west"]
        on_west = spread if spread["backend"] == "west" else spread["more_replicas"][0]
        gateway = roles.gateway("gateway")
        answers: list[int] = []
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                answers.append((await invoke(client, gateway)).status_code)

        callers = [asyncio.create_task(caller()) for _ in range(3)]
        try:
            roles.repo.replace("backends/pool.yaml", "capacity: {replicas: 1}", "capacity: {replicas: 0}")
            roles.repo.commit("west is full")
            for _ in range(600):
                if worker_stable(roles)["placement"] == {"east": 2}:
                    break
                await asyncio.sleep(0.1)
            moved = worker_stable(roles)
            assert moved["placement"] == {"east": 2} and backends_of(moved) == ["east", "east"], moved
            assert moved["release_id"] == spread["release_id"], "moved in place: the same release"
            for _ in range(300):
                if not alive(on_west["pid"]):
                    break
                await asyncio.sleep(0.1)
            assert not alive(on_west["pid"]), "the replica on west stopped"
            await asyncio.sleep(0.5)  # the moved replicas serve a while under load
        finally:
            stop.set()
            await asyncio.gather(*callers)
        assert answers and set(answers) == {200}, {code: answers.count(code) for code in set(answers)}
        row = await status(client, roles.control_url)
        assert row is not None and row["phase"] == "Ready" and row["sagaId"] == ready["sagaId"], "a move runs no saga"
        assert not row.get("lastError"), row
    assert "place-failed" not in (roles.tmp / "worker.log").read_text()
