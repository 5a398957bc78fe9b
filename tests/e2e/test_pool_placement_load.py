"""Placement by measured load, end to end through `plnt up`'s parts (real Temporal, git, runner
processes and gateway): two local PlntBackends in one pool with no declared capacity, so nothing but
the load measured on them tells them apart. review-responder 1.5.0 (0.6 s per call) runs on `east`
alone. A pool run committed while every replica is idle goes to `east` (the tie is broken by name);
one committed while clients keep review-responder busy goes to `west`, and plnt's log gives the reason
(the requests in flight on each backend, as its replicas' own GET /load counted them). Both runs keep
where they were placed (no churn once the load is gone), and no request failed.

The runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest

from tests.conftest import EXAMPLE, SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase
from tests.e2e.test_replicas import SteadyLoad, stable

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
POOL = """\
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: east, labels: {pool: agents}}
spec: {type: local}
---
apiVersion: plnt.work/v1
kind: PlntBackend
metadata: {name: west, labels: {pool: agents}}
spec: {type: local}
"""


def pool_run(name: str) -> str:
    """gitops-example's review-responder as another WorkflowRun `name` on the agents pool."""
    return (EXAMPLE / RUN_FILE).read_text().replace("name: review-responder\n", f"name: {name}\n") \
        .replace("cluster: local", "selector: {matchLabels: {pool: agents}}")


def placement_of(plnt, name: str) -> dict[str, int] | None:  # type: ignore[no-untyped-def]
    record = plnt.driver.record_of("default", name)
    return record.stable.placement if record is not None and record.stable is not None else None


def saga_started_line(caplog: pytest.LogCaptureFixture, name: str) -> str:
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith(f"saga-started workflowrun=default/{name} ")]
    assert len(lines) == 1, lines
    return lines[0]


async def test_a_new_pool_run_goes_to_the_backend_with_less_load(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="plnt")
    spec_repo.write("backends/pool.yaml", POOL)
    spec_repo.replace(RUN_FILE, "cluster: local", "cluster: east")
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
    spec_repo.commit("review-responder 1.5.0 on east")
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)

    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(plnt, "Ready", version="1.5.0", timeout=60)
        busy = stable(plnt)

        # Idle: the two backends are alike, the first by name takes the replica.
        spec_repo.write("workflowruns/idle-time.yaml", pool_run("idle-time"))
        spec_repo.commit("idle-time on the agents pool")
        await hook(plnt)
        await wait_phase(plnt, "Ready", version="1.2.0", name="idle-time", timeout=60)
        assert placement_of(plnt, "idle-time") == {"east": 1}
        idle_line = saga_started_line(caplog, "idle-time")
        assert "replica 1 -> east: no declared capacity, 0 in flight" in idle_line, idle_line

        with SteadyLoad(plnt.url) as load:  # three clients on review-responder: its runner on east is busy
            await wait_for(lambda: load.served >= 3, timeout=30, what="review-responder under load")
            in_flight = (await client.get(f"{busy.endpoint}/load")).json()
            assert in_flight["inFlight"] + in_flight.get("waiting", 0) > 0, in_flight
            spec_repo.write("workflowruns/busy-time.yaml", pool_run("busy-time"))
            spec_repo.commit("busy-time on the agents pool")
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.2.0", name="busy-time", timeout=60)
        await load.done()

        assert placement_of(plnt, "busy-time") == {"west": 1}, "the loaded backend was passed over"
        busy_line = saga_started_line(caplog, "busy-time")
        assert "replica 1 -> west: no declared capacity, 0 in flight; less loaded than east (" in busy_line, busy_line
        # Nothing moved: the idle run stays on east, review-responder on its one backend.
        assert placement_of(plnt, "idle-time") == {"east": 1}
        assert stable(plnt).pid == busy.pid
        for name in ("idle-time", "busy-time", "review-responder"):
            response = await client.post(f"{plnt.url}/workflows/{name}/invoke", json={"review": "ok", "brand_voice": "dry"})
            assert response.status_code == 200, response.text
        print(f"served under load={load.served} failed=0; {busy_line}")
