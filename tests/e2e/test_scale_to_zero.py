"""Scale to zero through `plnt up`: a WorkflowRun with `replicas.min: 0` is Ready, its runner parks
after the backend's scaleToZeroAfterSeconds without an invocation, `GET /workflows` says so, and the
next request through the gateway starts it again and is answered (real Temporal, git, runners and
gateway; with gateway worker processes, the wake goes through the control plane's /internal/wake).

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import process_start_time

from tests.conftest import SpecRepo
from tests.e2e.harness import invoke, running_plnt, settings_for, wait_for, wait_phase

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"


@pytest.mark.parametrize("workers", [1, 2])
async def test_an_idle_workflow_parks_and_the_next_request_starts_it(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str, workers: int
) -> None:
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 0, max: 1}")
    spec_repo.replace("backends/local.yaml", "type: local", "type: local\n  scaleToZeroAfterSeconds: 1")
    spec_repo.commit("review-responder scales to zero after 1 s idle")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            gateway_workers=workers)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.2.0")
        record = plnt.driver.record_of("default", "review-responder")
        assert record is not None and record.stable is not None and record.stable.park_after_s == 1
        first = record.stable

        async def parked_row() -> dict | None:
            rows = (await client.get(f"{plnt.url}/workflows")).json()
            return next((row for row in rows if row["name"] == "review-responder" and row.get("parked")), None)

        row = await wait_for(parked_row, timeout=30, what="review-responder parked in GET /workflows")
        assert row["phase"] == "Ready" and row["version"] == "1.2.0"
        assert first.pid is not None and process_start_time(first.pid) is None, "a parked runner has no process"

        response = await invoke(plnt)
        assert response.status_code == 200, response.text
        assert response.json()["version"] == "1.2.0" and response.json()["release"] == first.release_id
        woken = plnt.driver.record_of("default", "review-responder").stable
        assert woken is not None and not woken.parked and woken.port == first.port and woken.pid != first.pid
        assert process_start_time(woken.pid) is not None

        async def wakes_counted() -> bool:  # gateway workers push their metrics to plnt up's process now and then
            metrics = (await client.get(f"{plnt.url}/metrics")).text
            return 'plnt_gateway_runner_wakes_total{namespace="default",workflow="review-responder"} 1.0' in metrics

        await wait_for(wakes_counted, timeout=30, what="the wake in GET /metrics")
        status = plnt.statuses.get("default/review-responder")
        assert status is not None and status.phase.value == "Ready" and "drift" not in status.message
