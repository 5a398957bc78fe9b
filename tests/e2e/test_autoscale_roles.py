"""Autoscaling with the roles apart: `plnt reconcile` (the autoscaler, while it leads), `plnt worker`
(the runners; it takes the replica count in the reply to its next report) and `plnt gateway`, as
separate processes on one machine. Load through the gateway raises review-responder 1.5.0 (0.6 s per
invocation) to 3 replicas on the worker, and they come back to one once it stops, with no failed
request. Runners use the offline mock model backend, a stand-in for a model server."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.test_split_roles import AUTH, FIRST_READY_S, RUN_FILE, Roles, invoke, roles, wait_phase  # noqa: F401

pytestmark = pytest.mark.integration


def worker_replicas(roles: Roles) -> int:  # noqa: F811
    records = list((roles.tmp / "worker" / "releases").glob("*.json"))
    stable = json.loads(records[0].read_text()).get("stable") if records else None
    return 1 + len(stable.get("more_replicas") or ()) if stable else 0


async def test_the_reconcile_role_scales_the_workers_runners(roles: Roles) -> None:  # noqa: F811
    roles.repo.replace(RUN_FILE, "ref: review-responder@1.2.0", "ref: review-responder@1.5.0")
    roles.repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}",
                       "replicas: {min: 1, max: 3}\n  autoscaling: {targetInFlight: 2, scaleDownAfterSeconds: 2}")
    roles.repo.commit("review-responder 1.5.0, autoscaled 1-3")
    roles.reconciler()
    roles.worker()
    async with httpx.AsyncClient(timeout=30) as client:
        await wait_phase(client, roles.control_url, "Ready", "1.5.0", timeout=FIRST_READY_S)
        gateway = roles.gateway("gateway")
        assert worker_replicas(roles) == 1
        answers: list[int] = []
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                answers.append((await invoke(client, gateway)).status_code)

        callers = [asyncio.create_task(caller()) for _ in range(6)]
        try:
            for _ in range(600):
                if worker_replicas(roles) == 3:
                    break
                await asyncio.sleep(0.1)
            assert worker_replicas(roles) == 3
        finally:
            stop.set()
            await asyncio.gather(*callers)
        for _ in range(600):
            if worker_replicas(roles) == 1:
                break
            await asyncio.sleep(0.1)
        assert worker_replicas(roles) == 1
        assert answers and set(answers) == {200}, {code: answers.count(code) for code in set(answers)}
        metrics = (await client.get(f"{roles.control_url}/metrics", headers=AUTH)).text
        ups = [s.value for family in text_string_to_metric_families(metrics) for s in family.samples
               if s.name == "plnt_autoscale_changes_total" and s.labels.get("direction") == "up"]
        assert ups and ups[0] >= 1, metrics[-2000:]
    assert re.search(r"autoscale default/review-responder 1 -> [23]: \d+ in flight", (roles.tmp / "reconciler.log").read_text())
