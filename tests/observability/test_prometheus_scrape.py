"""A real Prometheus (Debian's `prometheus` package) scrapes a running plnt, evaluates the repo's
rules, and the canary alert fires on a bad canary.

Real parts: Temporal dev server, git repository, runner processes, gateway, Prometheus. The
runners' model is MockBackend (`--backend mock`), a STAND-IN for a model server; review-responder
1.4.0 is broken on purpose in the example (a step errors), so its smoke test fails and the saga
rolls it back. The rules are the repository's file as it is: PlntCanaryFailingGates has `for: 0m`
(a rollback is an event), so no shortened copy is needed; Prometheus scrapes and evaluates every
second.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from plnt.reconciler.drivers.processes import free_port
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, wait_for, wait_phase
from tests.observability.promql import RULES, dashboard_exprs, substitute, tool, variable_queries

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
ROLLED_BACK = 'plnt_rollouts_total{namespace="default",name="review-responder",outcome="rolled_back"}'


def prometheus_config(target: str) -> str:
    return f"""
global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - {RULES}
scrape_configs:
  - job_name: plnt
    metrics_path: /metrics
    static_configs:
      - targets: ["{target}"]
"""


class Prometheus:
    def __init__(self, url: str, client: httpx.AsyncClient) -> None:
        self.url = url
        self.client = client

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.client.get(f"{self.url}{path}", params=params)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", f"{path} {params}: {response.text}"
        return body["data"]

    async def query(self, promql: str) -> list[dict[str, Any]]:
        return (await self.get("/api/v1/query", query=promql))["result"]

    async def value(self, promql: str) -> float | None:
        result = await self.query(promql)
        return float(result[0]["value"][1]) if result else None

    async def firing(self, alert: str) -> list[dict[str, Any]]:
        return [a for a in (await self.get("/api/v1/alerts"))["alerts"]
                if a["labels"]["alertname"] == alert and a["state"] == "firing"]


async def test_prometheus_scrapes_plnt_and_the_canary_alert_fires(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    started = time.monotonic()
    settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace)
    async with running_plnt(settings) as plnt:
        # plnt's own exposition: one family per name (the gateway's and the control plane's never collide)
        async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
            text = (await client.get(f"{plnt.url}/metrics")).text
        families = [f.name for f in text_string_to_metric_families(text)]
        assert len(families) == len(set(families)), sorted(n for n in families if families.count(n) > 1)
        assert "plnt_gateway_requests" in families and "plnt_rollouts" in families

        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(prometheus_config(urlsplit(plnt.url).netloc))
        log = (tmp_path / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=10) as client:
                prom = Prometheus(f"http://127.0.0.1:{port}", client)

                async def ready() -> bool:
                    assert process.poll() is None, (tmp_path / "prometheus.log").read_text()
                    try:
                        return (await client.get(f"{prom.url}/-/ready")).status_code == 200
                    except httpx.HTTPError:
                        return False

                await wait_for(ready, timeout=20, what="Prometheus ready")
                await wait_phase(plnt, "Ready", version="1.2.0")
                # The rolled_back counter is scraped at 0 before the bad commit: increase() sees 0 -> 1.
                async def scraped_at_zero() -> bool:
                    return await prom.value(f"{ROLLED_BACK} == 0") is not None

                await wait_for(scraped_at_zero, timeout=30, what="plnt_rollouts_total{outcome=rolled_back} scraped at 0")
                assert await prom.value('up{job="plnt"}') == 1.0

                spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
                spec_repo.commit("try 1.4.0")
                await hook(plnt)
                status = await wait_phase(plnt, "RolledBack", version="1.2.0")
                assert "error rate 100%" in status["lastError"], status

                firing = await wait_for(lambda: prom.firing("PlntCanaryFailingGates"), timeout=30,
                                        what="PlntCanaryFailingGates firing")
                assert {(a["labels"]["namespace"], a["labels"]["name"]) for a in firing} == {("default", "review-responder")}
                assert firing[0]["annotations"]["summary"].startswith("Canary of default/review-responder failed")
                assert await prom.value(ROLLED_BACK) == 1.0
                assert await prom.value(ROLLED_BACK.replace("rolled_back", "promoted")) == 1.0  # 1.2.0 at the start
                # the failed gate against its budget, as scraped: 100% errors over a 1% budget
                assert await prom.value('plnt_smoke_gate_value{name="review-responder",gate="errors"}') == 1.0
                assert await prom.value('plnt_smoke_gate_budget{name="review-responder",gate="errors"}') == 0.01
                assert (await prom.value('plnt_smoke_gate_failures_total{name="review-responder",gate="errors"}')) == 1.0
                assert (await prom.value('sum(plnt_saga_step_duration_seconds_count{step="smoke_test"})') or 0) >= 2
                assert (await prom.value('sum(plnt_commit_to_ready_seconds_count{name="review-responder"})')) == 1.0
                for silent in ("PlntSagaStuck", "PlntGatewayErrorRate", "PlntGitUnreachable"):
                    assert not await prom.firing(silent), silent

                # Every rule evaluates without error against real data.
                groups = (await prom.get("/api/v1/rules"))["groups"]
                rules = [rule for group in groups for rule in group["rules"]]
                assert len(rules) == 15 and all(rule["health"] == "ok" for rule in rules), \
                    [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
                # Every dashboard query runs without error (Grafana's variables as "All"), and the
                # panels on what just happened have data.
                for where, expr in dashboard_exprs():
                    response = await client.get(f"{prom.url}/api/v1/query", params={"query": substitute(expr)})
                    assert response.status_code == 200 and response.json()["status"] == "success", \
                        f"{where}: {expr}: {response.text}"
                for name, query in variable_queries():
                    selector = query.removeprefix("label_values(").rsplit(",", 1)[0]
                    assert await prom.get("/api/v1/series", **{"match[]": substitute(selector)}), name
                assert await prom.query(substitute(
                    'sum by (outcome) (increase(plnt_rollouts_total{namespace=~"$namespace", name=~"$workflow"}[$__range]))'))
        finally:
            process.terminate()
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()
    assert time.monotonic() - started < 90
