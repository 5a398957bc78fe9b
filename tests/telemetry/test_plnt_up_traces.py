"""`plnt up --gateway-workers 2` as users run it (the installed console script, embedded Temporal, real
runner and gateway worker processes) with tracing configured by the environment only, exporting over
OTLP/gRPC to a REAL gRPC TraceService (tools/trace_tree.py). Every kind of process sets tracing up at
its entry and flushes on exit; plnt still stops cleanly.

The runners' model is MockBackend, a STAND-IN for a model server."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp

pytestmark = pytest.mark.integration


async def test_plnt_up_and_its_processes_export_traces_over_grpc(
    spec_repo: SpecRepo, tmp_path: Path, grpc_receiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in {"OTEL_EXPORTER_OTLP_ENDPOINT": grpc_receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                        "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
                        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer grpc-collector-secret"}.items():
        monkeypatch.setenv(name, value)  # PlntUp passes this process's environment to plnt up
    commit = spec_repo.git("rev-parse", "HEAD")
    up = PlntUp(spec_repo.path, tmp_path / "state", free_port(), tmp_path / "plnt.log", extra=("--gateway-workers", "2"))
    try:
        await asyncio.to_thread(up.wait_ready)
        for _ in range(6):  # new connections: the workers share the port
            async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
                response = await client.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW)
                assert response.status_code == 200, up.why(response.text)
        collected = grpc_receiver.collected
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            gateway_spans = collected.named("POST /workflows/{name}/invoke")
            traced = [s for s in gateway_spans if any(r.name == "runner invoke" and r.parent_id == s.span_id
                                                      for r in collected.trace(s.trace_id))]
            if len(traced) == 6:
                break
            await asyncio.sleep(0.1)
        assert len(traced) == 6, up.why(f"gateway spans with their runner's: {len(traced)} of 6")
        assert {s.service for s in traced} == {"plnt-gateway"}  # the worker processes answered
        reconcile = [s for s in collected.named("reconcile") if s.attributes.get("plnt.commit") == commit]
        assert reconcile and reconcile[0].service == "plnt"
        rollout = collected.trace(reconcile[0].trace_id)
        assert any(s.name == "RunActivity:promote_release" for s in rollout)
        assert collected.requests["grpc"] > 0 and collected.requests["http"] == 0
        runner_exports = [h for services, h in collected.exports if "plnt-runner" in services]
        ours = [h for services, h in collected.exports if services & {"plnt", "plnt-gateway"}]
        assert runner_exports and all("grpc-collector-secret" not in repr(h) for h in runner_exports)
        assert ours and all(h.get("authorization") == "Bearer grpc-collector-secret" for h in ours)
    finally:
        if up.process.poll() is None:
            up.stop_and_check(signal.SIGTERM)
