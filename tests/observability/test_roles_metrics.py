"""The split roles serve the control plane's metrics: `plnt reconcile` after the gateway app's own
series on its control API's GET /metrics (token with scope read or admin), `plnt worker` the saga
steps it ran on its health listener's GET /metrics. Real processes, Temporal and git (the model is
MockBackend, a stand-in)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SpecRepo
from tests.e2e.harness import wait_for
from tests.e2e.test_split_roles import AUTH, Roles, free_port, wait_phase

pytestmark = pytest.mark.integration


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
def split_roles(tmp_path: Path, spec_repo: SpecRepo, temporal_address: str, temporal_namespace: str) -> Iterator[Roles]:
    roles = Roles(tmp_path, spec_repo, temporal_address, temporal_namespace)
    try:
        yield roles
    finally:
        roles.stop_all()


async def test_reconcile_and_worker_roles_serve_their_metrics(split_roles: Roles) -> None:
    roles = split_roles
    roles.reconciler()
    port = free_port()
    roles._start("worker", ["worker", "--repo", str(roles.repo.path), "--state-dir", str(roles.tmp / "worker"),
                            "--port", str(port), "--control-url", roles.control_url,
                            "--internal-token-file", str(roles.token_file), "--report-interval", "0.5",
                            *roles.temporal], f"http://127.0.0.1:{port}/readyz")
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        await wait_phase(client, roles.control_url, "Ready", "1.2.0")
        key = ("plnt_rollouts_total", (("kind", "WorkflowRun"), ("name", "review-responder"), ("namespace", "default"),
                                       ("outcome", "promoted")))

        async def promoted() -> str | None:  # counted once the Ready record is on disk, a moment after it shows
            response = await client.get(f"{roles.control_url}/metrics", headers=AUTH)
            assert response.status_code == 200, response.text
            return response.text if samples(response.text).get(key) == 1.0 else None

        text = await wait_for(promoted, timeout=30, what="the promotion counted on the control API's GET /metrics")
        control = samples(text)
        families = [f.name for f in text_string_to_metric_families(text)]
        assert len(families) == len(set(families))
        assert "plnt_gateway_requests" in families
        assert control[("plnt_workflows", (("kind", "WorkflowRun"), ("phase", "Ready")))] == 1.0
        # the reconciler runs only record_phase; the steps ran on the worker
        assert control[("plnt_saga_step_duration_seconds_count", (("outcome", "ok"), ("step", "record_phase")))] >= 1
        assert not any(name == "plnt_saga_step_duration_seconds_count" and dict(labels)["step"] == "smoke_test"
                       for name, labels in control)
        worker = samples((await client.get(f"http://127.0.0.1:{port}/metrics")).text)
        for step in ("validate", "pull_recipe", "install_release", "smoke_test", "promote_release"):
            assert worker.get(("plnt_saga_step_duration_seconds_count", (("outcome", "ok"), ("step", step))), 0) >= 1, \
                (step, sorted(k for k in worker if k[0] == "plnt_saga_step_duration_seconds_count"))


async def test_a_standby_reconciler_answers_metrics_with_leader_zero(split_roles: Roles) -> None:
    """Prometheus scrapes every reconciler pod: a standby answers GET /metrics 200 (a 503 would be
    `up == 0`, a false alarm) with `plnt_reconciler_leader` 0 and none of the control plane's series
    (its statuses are a stale copy); the Lease holder says 1. Still the usual auth, and the rest of
    the control API stays 503 on the standby. Real processes sharing one state directory's file lease."""
    roles = split_roles
    roles.reconciler()
    standby_port = free_port()
    roles.reconciler("standby", port=standby_port, wait_active=False)
    standby_url = f"http://127.0.0.1:{standby_port}"
    async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
        active = await client.get(f"{roles.control_url}/metrics", headers=AUTH)
        standby = await client.get(f"{standby_url}/metrics", headers=AUTH)
        assert active.status_code == 200 and standby.status_code == 200, standby.text
        assert samples(active.text)[("plnt_reconciler_leader", ())] == 1.0
        on_standby = samples(standby.text)
        assert on_standby[("plnt_reconciler_leader", ())] == 0.0
        assert ("plnt_workflows", (("kind", "WorkflowRun"), ("phase", "Ready"))) in samples(active.text)  # 0 or 1
        assert not any(name.startswith(("plnt_workflows", "plnt_saga_", "plnt_rollouts")) for name, _ in on_standby), \
            sorted({name for name, _ in on_standby})
        assert any(name.startswith("plnt_gateway_") for name, _ in on_standby), "the standby's own series"
        assert (await client.get(f"{standby_url}/metrics")).status_code == 401, "the same auth as on the leader"
        refused = await client.get(f"{standby_url}/workflows", headers=AUTH)
        assert refused.status_code == 503 and refused.json()["error"]["type"] == "standby"
