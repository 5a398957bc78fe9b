"""A metric gate on a real Prometheus scraping plnt, and a webhook gate on a real HTTP receiver that
checks plnt's HMAC signature, in one stepped canary of a real plnt (Temporal dev server, git
repository, reconciler, gateway, runner processes). The runners' model is MockBackend, a STAND-IN
for a model server; recipes are signed by the example's test authority, a STAND-IN for Sigstore's
public services.

The metric gate counts the canary's answered requests through plnt's gateway: real traffic during
the step's pause (its soak) lets 1.3.0 pass; 1.5.0 gets none, fails it, and its QA webhook says no
too: the rollback names both gates."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.gates.webhook import verify

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.http_thread import ThreadedHttp
from tests.observability.promql import tool

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
SECRET = "qa-gate-secret-never-logged"
QUERY = ('sum(plnt_gateway_requests_total{namespace="$namespace",workflow="$name",version="$canary_version",'
         'code="200"}) or vector(0)')


def gates(prometheus: str, receiver: str) -> str:
    return f"""\
apiVersion: plnt.work/v1
kind: Gate
metadata: {{name: canary-traffic}}
spec:
  metric: {{prometheus: "{prometheus}", query: '{QUERY}', min: 5}}
---
apiVersion: plnt.work/v1
kind: Gate
metadata: {{name: qa-signoff}}
spec:
  webhook: {{url: "{receiver}/gate?token=abc123", secret: QA, timeout: 5s}}
"""


class Receiver(BaseHTTPRequestHandler):
    """A QA service: verifies the signature, says yes to 1.3.0 only."""

    seen: list[dict[str, Any]] = []
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        if not verify(SECRET.encode(), self.headers.get("x-plnt-timestamp", ""),
                      self.headers.get("x-plnt-signature", ""), body):
            self.send_response(401)
            self.end_headers()
            return
        payload = json.loads(body)
        with self.lock:
            self.seen.append(payload)
        ok = payload["canary_version"] == "1.3.0"
        answer = json.dumps({"pass": ok, "reason": "QA signed off" if ok else f"no QA sign-off for "
                             f"{payload['canary_version']}"}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


async def test_a_metric_gate_on_prometheus_and_a_signed_webhook_gate(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PLNT_GATE_SECRET_QA", SECRET)
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    port = free_port()
    with ThreadedHttp(Receiver) as receiver:
        async with running_plnt(settings) as plnt:
            config = tmp_path / "prometheus.yml"
            config.write_text(f"global: {{scrape_interval: 1s, scrape_timeout: 1s}}\nscrape_configs:\n"
                              f"  - job_name: plnt\n    static_configs: [{{targets: ['{urlsplit(plnt.url).netloc}']}}]\n")
            process = subprocess.Popen(
                [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{port}"],
                stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT)
            try:
                await _rollouts(spec_repo, plnt, f"http://127.0.0.1:{port}", receiver.url)
            finally:
                process.terminate()
                process.wait(timeout=10)


async def _rollouts(spec_repo: SpecRepo, plnt: Any, prometheus: str, receiver: str) -> None:
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        async def ready() -> bool:
            try:
                return (await client.get(f"{prometheus}/-/ready")).status_code == 200
            except httpx.HTTPError:
                return False

        await wait_for(ready, timeout=20, what="Prometheus ready")
    await wait_phase(plnt, "Ready", version="1.2.0")

    spec_repo.write("gates/gates.yaml", gates(prometheus, receiver))
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n",
                      "    steps:\n      - {weight: 50, pause: 6s, gates: [canary-traffic, qa-signoff]}\n")
    commit = spec_repo.commit("1.3.0 behind a metric gate and a QA webhook")
    await hook(plnt)
    # The soak: real traffic through the gateway while the step pauses, half of it to the canary.
    await wait_for(lambda: "pausing 6s before its gates" in (status_of(plnt) or {}).get("message", ""),
                   timeout=60, what=lambda: f"step 1's pause (now: {status_of(plnt)})")
    answers = await asyncio.gather(*(invoke(plnt) for _ in range(40)))
    versions = [a.json()["version"] for a in answers]
    assert versions.count("1.3.0") >= 5, versions
    ready = await wait_phase(plnt, "Ready", version="1.3.0", timeout=60)
    assert ready["canaryVersion"] is None
    (asked,) = Receiver.seen
    assert (asked["gate"], asked["canary_version"], asked["stable_version"], asked["commit"], asked["step"],
            asked["weight"]) == ("qa-signoff", "1.3.0", "1.2.0", commit, 1, 50), asked

    # 1.5.0: no traffic in its soak (the metric gate's minimum not met), and QA says no.
    spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
    spec_repo.commit("1.5.0")
    await hook(plnt)
    rolled = await wait_phase(plnt, "RolledBack", version="1.3.0", timeout=60)
    reason = rolled["lastError"]
    assert reason == ("step 1/1 at 50%: gate canary-traffic (metric): value 0 < min 5; gate qa-signoff (webhook): "
                      "no QA sign-off for 1.5.0"), reason
    assert SECRET not in json.dumps(rolled) and "abc123" not in json.dumps(rolled)
