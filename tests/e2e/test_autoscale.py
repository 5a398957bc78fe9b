"""Autoscaling through `plnt up`: a WorkflowRun whose recipe is slow (review-responder 1.5.0 sleeps
0.6 s per invocation) with replicas 1-3 and `autoscaling: {targetInFlight: 2}`. Concurrent load
through the gateway raises its replica count, the gateway spreads the invocations over the new
runners (each runner's own count, by port); a new release promoted under that load starts at the 3
replicas the old one runs; once the load stops it comes back to one replica, one step per window,
without a failed request. Real Temporal, git, runners and gateway.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SpecRepo
from tests.e2e.harness import REVIEW, hook, running_plnt, settings_for, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
PLNT = str(Path(sys.executable).parent / "plnt")


def replicas(plnt: object) -> tuple[str, ...]:
    record = plnt.driver.record_of("default", "review-responder")  # type: ignore[attr-defined]
    return tuple(record.stable.endpoints) if record is not None and record.stable is not None else ()


async def test_load_raises_the_replicas_the_gateway_spreads_over_them_and_they_come_back(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    spec_repo.replace(RUN_FILE, "ref: review-responder@1.2.0", "ref: review-responder@1.5.0")
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}",
                      "replicas: {min: 1, max: 3}\n  autoscaling: {targetInFlight: 2, scaleDownAfterSeconds: 2}")
    spec_repo.commit("review-responder 1.5.0 (slow), autoscaled 1-3 on 2 in flight each")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.5.0", timeout=60)
        assert len(replicas(plnt)) == 1

        answers: list[int] = []
        peak: set[str] = set()
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                response = await client.post(f"{plnt.url}/workflows/review-responder/invoke", json=REVIEW)
                answers.append(response.status_code)

        callers = [asyncio.create_task(caller()) for _ in range(6)]  # 6 in flight: ceil(6 / 2) = 3 replicas
        try:
            scaled = await wait_for(lambda: len(replicas(plnt)) == 3 and replicas(plnt), timeout=30,
                                    what=lambda: f"3 replicas (now {replicas(plnt)})")
            peak.update(scaled)
            row = next(r for r in (await client.get(f"{plnt.url}/workflows")).json() if r["name"] == "review-responder")
            shown = await asyncio.to_thread(subprocess.run, [PLNT, "status", "--url", plnt.url], capture_output=True,
                                            text=True, timeout=60)
            # A promotion under that load (a new spec: a new release) starts at the 3 replicas the old one
            # runs, not at replicas.min: the first record of the new release already has three.
            old_release = plnt.driver.record_of("default", "review-responder").stable.release_id
            spec_repo.replace(RUN_FILE, "trafficPercent: 5", "trafficPercent: 10")
            spec_repo.commit("a canary share of 10 %")
            await hook(plnt)
            promoted = await wait_for(lambda: (r := plnt.driver.record_of("default", "review-responder")) is not None
                                      and r.stable.release_id != old_release and r.stable, timeout=90, interval=0.01,
                                      what="the new release promoted")
            assert len(promoted.processes()) == 3, promoted.endpoints
            peak = set(promoted.endpoints)  # (the old release's replicas are stopped)
            started = time.monotonic()
            while time.monotonic() - started < 3:  # the load goes on over the three replicas
                await asyncio.sleep(0.2)
        finally:
            stop.set()
            await asyncio.gather(*callers)
        served = {endpoint: (await client.get(f"{endpoint}/stats")).json()["invocations"] for endpoint in peak}
        assert all(count > 0 for count in served.values()), served  # the gateway used every new runner
        assert row["autoscale"]["desired"] == 3 and row["autoscale"]["reason"], row
        assert re.search(r"replicas 3/3 \(autoscaled: \d+ in flight\)", shown.stdout), shown.stdout + shown.stderr

        history = [len(replicas(plnt))]

        async def back_to_one() -> bool:
            history.append(len(replicas(plnt)))
            return history[-1] == 1

        await wait_for(back_to_one, timeout=60, what=lambda: f"one replica again (seen {history})")
        steps = [n for i, n in enumerate(history) if i == 0 or n != history[i - 1]]
        assert steps in ([3, 2, 1], [2, 1]), steps  # down one replica at a time
        assert answers and set(answers) == {200}, {code: answers.count(code) for code in set(answers)}

        labels = (("name", "review-responder"), ("namespace", "default"))

        async def settled() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            text = (await client.get(f"{plnt.url}/metrics")).text
            found = {(s.name, tuple(sorted(s.labels.items()))): s.value
                     for family in text_string_to_metric_families(text) for s in family.samples}
            return found if found.get(("plnt_replicas", (*labels, ("state", "running")))) == 1 else None

        # (the last replica's stop, after its drain, ends the change: then the gauge says 1)
        found = await wait_for(settled, timeout=20, what="plnt_replicas running 1")
        assert found[("plnt_autoscale_changes_total", (("direction", "up"), *labels))] >= 1
        assert found[("plnt_autoscale_changes_total", (("direction", "down"), *labels))] >= 1
        assert found[("plnt_replicas", (*labels, ("state", "desired")))] == 1
