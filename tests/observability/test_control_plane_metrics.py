"""reconciler/control/metrics.py: what the control plane's series say as statuses change (a real
StatusStore on disk; the saga's phase records are written the way PhaseRecorder writes them)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from plnt.core.status import Phase, RolloutMark
from plnt.gateway.metrics import GatewayMetrics
from plnt.reconciler.control.metrics import ControlPlaneMetrics, smoke_gates
from plnt.reconciler.status_store import StatusStore
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase

NS, NAME = "default", "review-responder"
BUDGET = {"invocations": 10, "p95BudgetMs": 2500, "errorBudgetPercent": 1}


def sample(m: ControlPlaneMetrics, series: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(series, labels)


async def settle() -> None:
    for _ in range(3):  # the follower looks once the loop turn is over
        await asyncio.sleep(0)


async def phase(store: StatusStore, commit: str, to: Phase, **fields: Any) -> None:
    await store.record(NS, NAME, phase=to, observed_commit=commit,
                       rollout=RolloutMark(commit=commit, phase=to, at=time.time()), **fields)


def smoke(p95_ms: float, error_percent: float, passed: bool) -> dict[str, Any]:
    return {"passed": passed, "reason": "", "metrics": {"invocations": 10, "p95_ms": p95_ms, "error_percent": error_percent}}


def test_smoke_gates_in_seconds_and_ratios_with_default_budgets() -> None:
    gates = smoke_gates({"metrics": {"p95_ms": 41.0, "error_percent": 100.0, "ttft_p95_ms": 12.0}},
                        {"ttftBudgetMs": 500})
    assert gates == {"p95": (0.041, 2.5), "errors": (1.0, 0.01), "ttft": (0.012, 0.5)}
    assert smoke_gates(None, BUDGET) == {} and smoke_gates({"metrics": "garbage"}, None) == {}


async def test_rollouts_gates_and_commit_to_ready_follow_the_saga_records(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / "status.json")
    m = ControlPlaneMetrics()
    detach = m.attach(store)
    m.commit_seen("c1")
    store.update_nowait(NS, NAME, phase=Phase.PENDING, kind="WorkflowRun")
    await settle()
    # every outcome and gate exists at 0 from the first sight of the workflow
    assert sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun", outcome="rolled_back") == 0
    assert sample(m, "plnt_smoke_gate_failures_total", namespace=NS, name=NAME, gate="errors") == 0
    assert sample(m, "plnt_sagas_in_progress") == 1
    start = sample(m, "plnt_saga_start_timestamp_seconds", namespace=NS, name=NAME, kind="WorkflowRun")
    assert start is not None and abs(start - time.time()) < 5

    await phase(store, "c1", Phase.VERIFYING)
    await phase(store, "c1", Phase.CANARY, canary_version="1.2.0", traffic_percent=5, smoke_budget=BUDGET)
    await settle()
    assert sample(m, "plnt_canary_traffic_ratio", namespace=NS, name=NAME, kind="WorkflowRun") == 0.05
    assert sample(m, "plnt_workflows", phase="Canary", kind="WorkflowRun") == 1
    await phase(store, "c1", Phase.READY, version="1.2.0", canary_version=None, traffic_percent=0,
                smoke_test=smoke(41.0, 0.0, True))
    await settle()
    assert sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun", outcome="promoted") == 1
    assert sample(m, "plnt_commit_to_ready_seconds_count", namespace=NS, name=NAME) == 1
    assert sample(m, "plnt_smoke_gate_value", namespace=NS, name=NAME, gate="p95") == pytest.approx(0.041)
    assert sample(m, "plnt_smoke_gate_budget", namespace=NS, name=NAME, gate="p95") == 2.5
    assert sample(m, "plnt_saga_start_timestamp_seconds", namespace=NS, name=NAME, kind="WorkflowRun") is None
    assert sample(m, "plnt_canary_traffic_ratio", namespace=NS, name=NAME, kind="WorkflowRun") == 0

    # a later status write that is no saga record ("in sync") counts nothing again
    store.update_nowait(NS, NAME, message="1.2.0 in sync", observed_commit="c2")
    await settle()
    assert sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun", outcome="promoted") == 1

    m.commit_seen("c2")
    await phase(store, "c2", Phase.CANARY, canary_version="1.4.0", traffic_percent=5, smoke_budget=BUDGET)
    await phase(store, "c2", Phase.ROLLED_BACK, canary_version=None, smoke_test=smoke(30.0, 100.0, False))
    await settle()
    assert sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun", outcome="rolled_back") == 1
    assert sample(m, "plnt_smoke_gate_failures_total", namespace=NS, name=NAME, gate="errors") == 1
    assert sample(m, "plnt_smoke_gate_failures_total", namespace=NS, name=NAME, gate="p95") == 0
    assert sample(m, "plnt_smoke_gate_value", namespace=NS, name=NAME, gate="errors") == 1.0
    assert sample(m, "plnt_commit_to_ready_seconds_count", namespace=NS, name=NAME) == 1  # no Ready for c2

    store.remove(NS, NAME)
    await settle()
    assert sample(m, "plnt_smoke_gate_value", namespace=NS, name=NAME, gate="errors") is None
    assert sample(m, "plnt_workflows", phase="RolledBack", kind="WorkflowRun") == 0
    await detach()


async def test_a_restart_does_not_count_old_rollouts_again_and_threads_may_write(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / "status.json")
    await phase(store, "c1", Phase.READY, version="1.2.0", smoke_test=smoke(41.0, 0.0, True), smoke_budget=BUDGET)
    m = ControlPlaneMetrics()
    m.attach(store)
    assert sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun", outcome="promoted") == 0
    assert sample(m, "plnt_smoke_gate_value", namespace=NS, name=NAME, gate="p95") == pytest.approx(0.041)
    # a write from another thread (StatusStore.update) is counted on the loop
    mark = RolloutMark(commit="c2", phase=Phase.FAILED, at=time.time())
    writer = threading.Thread(target=lambda: store.update(NS, NAME, phase=Phase.FAILED, rollout=mark))
    writer.start()
    writer.join()
    await wait_for(lambda: sample(m, "plnt_rollouts_total", namespace=NS, name=NAME, kind="WorkflowRun",
                                  outcome="failed") == 1, timeout=30, what="the failed rollout counted")


async def test_previews_stay_out_of_the_per_workflow_series(tmp_path: Path) -> None:
    store = StatusStore(tmp_path / "status.json")
    m = ControlPlaneMetrics()
    m.attach(store)
    store.update_nowait(NS, f"{NAME}--pr7", phase=Phase.CANARY)
    await settle()
    text = m.render().decode()
    assert "--pr7" not in text
    assert sample(m, "plnt_workflows", phase="Canary", kind="WorkflowRun") == 1


def test_served_after_the_gateway_series_without_a_family_twice() -> None:
    app = FastAPI()
    gateway = GatewayMetrics()
    gateway.finished("invoke", (NS, NAME, "1.2.0", "stable"), 200, 0.01)
    app.state.render_metrics = gateway.render
    m = ControlPlaneMetrics()
    m.fetch_finished(False, 0.2)
    m.fetch_finished(True, 0.01)
    m.pass_finished(True, "ok", 0.05)
    m.step_finished("smoke_test", "ok", 1.5)
    m.append_to(app)

    @app.get("/metrics")
    def metrics() -> bytes:
        return app.state.render_metrics()

    text = app.state.render_metrics().decode()
    families = [f.name for f in text_string_to_metric_families(text)]
    assert len(families) == len(set(families))
    assert "plnt_gateway_requests" in families and "plnt_git_fetch_errors" in families
    assert m.registry.get_sample_value("plnt_git_fetch_errors_total") == 1
    assert m.registry.get_sample_value("plnt_git_last_fetch_success_timestamp_seconds") is not None
    worker = FastAPI()
    m.mount(worker)
    response = TestClient(worker).get("/metrics")
    assert response.status_code == 200 and "plnt_saga_step_duration_seconds_bucket" in response.text


def test_recording_never_raises() -> None:
    m = ControlPlaneMetrics()
    m.step_finished("smoke_test", "ok", float("nan"))  # prometheus_client accepts it; nothing to assert but no raise
    m.pass_finished(True, "ok", -1.0)
    m._look = None  # type: ignore[assignment]  # a broken follower: the scan logs and carries on
    m._statuses = object()  # type: ignore[assignment]
    m._scan()
    assert b"plnt_rollouts_total" in m.render()


@pytest.mark.integration
async def test_a_git_server_gone_counts_fetch_errors(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        m = plnt.reconciler.metrics
        assert m.registry.get_sample_value("plnt_git_fetch_errors_total") == 0
        ok_at = m.registry.get_sample_value("plnt_git_last_fetch_success_timestamp_seconds")
        assert ok_at is not None and time.time() - ok_at < 30
        assert (m.registry.get_sample_value("plnt_reconcile_duration_seconds_count", {"pass": "full", "outcome": "ok"})
                or 0) >= 1
        assert m.registry.get_sample_value("plnt_saga_step_duration_seconds_count",
                                           {"step": "install_release", "outcome": "ok"}) == 1
        spec_repo.path.rename(tmp_path / "gone")
        await hook(plnt)
        await wait_for(lambda: (m.registry.get_sample_value("plnt_git_fetch_errors_total") or 0) >= 1, timeout=30,
                       what="a failed fetch counted")
        assert (m.registry.get_sample_value("plnt_reconcile_duration_seconds_count",
                                            {"pass": "full", "outcome": "skipped"}) or 0) >= 1


@pytest.mark.integration
async def test_with_gateway_workers_the_sum_and_the_control_plane_share_one_exposition(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace, gateway_workers=2)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        promoted = {"namespace": "default", "name": "review-responder", "kind": "WorkflowRun", "outcome": "promoted"}
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:

            async def scraped() -> str | None:  # answered by a worker, forwarded to plnt up's process
                text = (await client.get(f"{plnt.url}/metrics")).text
                counted = any(s.name == "plnt_rollouts_total" and s.labels == promoted and s.value == 1
                              for family in text_string_to_metric_families(text) for s in family.samples)
                return text if counted else None  # counted once the status write is on disk

            text = await wait_for(scraped, timeout=30, what="the promotion counted on GET /metrics")
        families = [f.name for f in text_string_to_metric_families(text)]
        assert len(families) == len(set(families)), sorted(n for n in families if families.count(n) > 1)
        assert {"plnt_gateway_requests", "plnt_rollouts", "plnt_workflows"} <= set(families)
