"""The live comparison gate with the roles apart, as separate processes: `plnt reconcile`, `plnt worker`
and two `plnt gateway`s on one real Temporal dev server and one real git repository. Real traffic flows
through both gateways during the rollouts; each pushes its calls to the reconciler, whose ledger the
worker's gate reads over GET /internal/traffic (the internal token). 1.3.0 serves as fast as 1.2.0 and
is promoted; the ledger's counts are the sum over both gateways; 1.5.0 answers right but 0.6 s slower per
call, passes its smoke test's 2.5 s budget, and is rolled back by the comparison with its stable.
Runners use the offline mock model backend (a STAND-IN for a model server); recipes are signed by the
example's test authority (a STAND-IN for Sigstore's public services)."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.conftest import SpecRepo
from tests.e2e.test_compare_gate import GATE, Traffic
from tests.e2e.test_split_roles import AUTH, RUN_FILE, TOKEN, Roles, wait_phase
from tests.e2e.test_split_roles import roles as roles  # noqa: F401 (the fixture: role processes stopped after the test)


async def verdict_of(client: httpx.AsyncClient, control: str) -> str:
    history = (await client.get(f"{control}/workflows/review-responder/history", headers=AUTH)).json()
    (gates,) = [step for step in history["steps"] if step["step"] == "check_gates"]
    return str(gates["detail"]["latency-vs-stable"])


async def test_the_compare_gate_reads_every_gateways_traffic_through_the_reconciler(
        spec_repo: SpecRepo, roles: Roles) -> None:  # noqa: F811
    roles.reconciler()
    roles.worker()
    gateways = [roles.gateway("gateway-a"), roles.gateway("gateway-b")]
    control = roles.control_url
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        await wait_phase(client, control, "Ready", "1.2.0")
        spec_repo.write("gates/latency-vs-stable.yaml", GATE)
        spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
        spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n",
                          "    steps:\n      - {weight: 50, pause: 3s, gates: [latency-vs-stable]}\n")
        spec_repo.commit("1.3.0 compared with 1.2.0 on real traffic through two gateways")
        since = time.time()
        with Traffic(*gateways, headers=AUTH) as traffic:
            await client.post(f"{control}/hooks/git", headers=AUTH)
            await wait_phase(client, control, "Ready", "1.3.0", timeout=120)
        verdict = await verdict_of(client, control)
        assert verdict.startswith("passed in ") and "vs stable" in verdict and "canary /" in verdict, verdict
        assert "not heard from" not in verdict, verdict
        assert all(traffic.per_gateway[url] > 0 for url in gateways), traffic.per_gateway

        # What the ledger holds is every gateway's: the canary's calls are the sum of what both answered.
        await asyncio.sleep(1.0)  # the last pushes (every 0.25 s)
        answer = await client.get(f"{control}/internal/traffic", headers={"authorization": f"Bearer {TOKEN}"},
                                  params={"namespace": "default", "name": "review-responder", "canary": "1.3.0",
                                          "stable": "1.2.0", "since": since})
        assert answer.status_code == 200, answer.text
        reading = answer.json()
        assert reading["canary"]["count"] == traffic.answered[("1.3.0", "canary")] > 0, (reading, traffic.answered)
        assert reading["stable"]["count"] == traffic.answered[("1.2.0", "stable")] > 0, (reading, traffic.answered)
        # The reconciler's own app and each gateway process (a `plnt gateway` runs one per core by default).
        assert reading["gateways"] >= 3 and reading["silent"] == [], reading
        refused = await client.get(f"{control}/internal/traffic", headers={"authorization": "Bearer nope"},
                                   params={"namespace": "d", "name": "n", "canary": "1", "stable": "2", "since": 0})
        assert refused.status_code == 401

        spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
        spec_repo.commit("1.5.0: right, but 0.6 s slower per call")
        with Traffic(*gateways, headers=AUTH) as traffic:
            await client.post(f"{control}/hooks/git", headers=AUTH)
            rolled = await wait_phase(client, control, "RolledBack", "1.3.0", timeout=150)
    reason = rolled["lastError"]
    assert reason.startswith("step 1/1 at 50%: gate latency-vs-stable (compare): p95 "), reason
    assert "over 1.5 x stable" in reason and "+ 100 ms (p95SlackMs)" in reason, reason
    assert rolled["smokeTest"]["passed"], "the smoke test's own budget passed 1.5.0: only the comparison caught it"
    assert traffic.answered[("1.5.0", "canary")] > 0 and "error" not in traffic.versions, traffic.answered
    for process in roles.processes:
        assert TOKEN not in process.tail(), "the internal token is in a role's log"

