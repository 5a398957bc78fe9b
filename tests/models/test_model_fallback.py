"""A ModelDeployment's fallback on real models: plnt (Temporal worker, reconciler, gateway, in this process)
deploys SmolLM2-135M-Instruct on llama.cpp twice, `smollm2` with `fallback: smollm2-backup`. Over its
GatewayPolicy capacity, and then with its server SIGKILLed, smollm2's chat completions are answered by the
backup's server, named in the answer's `model` and X-Plnt-Fallback, in GET /calls and in /metrics.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py). Everything else is
real. Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, wait_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, chat, deployment, model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

SMOKE = "{invocations: 2, concurrency: 1, p95BudgetMs: 60000}"
LIMITED = """\
apiVersion: plnt.work/v1
kind: GatewayPolicy
metadata: {name: quotas}
spec:
  models:
    - {model: smollm2, requestsPerMinute: 2}
"""
UNLIMITED = """\
apiVersion: plnt.work/v1
kind: GatewayPolicy
metadata: {name: quotas}
spec:
  models: []
"""


async def test_a_model_over_its_capacity_or_killed_is_answered_by_its_fallback(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str,
) -> None:
    repo, registry, _, digest = model_repo
    primary = deployment(registry, "1.0.0", digest, SMOKE) + "  selfHeal: false\n  fallback: smollm2-backup\n"
    repo.write(MODEL_FILE, primary)
    repo.write("workflowruns/smollm2-backup.yaml", deployment(registry, "1.0.0", digest, SMOKE).replace(
        "metadata: {name: smollm2}", "metadata: {name: smollm2-backup}"))
    repo.write("policies/quotas.yaml", LIMITED)
    repo.commit("smollm2 with a fallback, at most 2 requests a minute")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2-backup", timeout=180)
        url = f"{plnt.url}/v1/chat/completions"

        # Over its capacity: two answered by smollm2, the third by the backup's real server.
        answers = [await client.post(url, json=chat()) for _ in range(3)]
        assert [a.status_code for a in answers] == [200, 200, 200], [a.text for a in answers]
        assert [a.headers.get("x-plnt-fallback") for a in answers] == [None, None, "smollm2-backup"]
        assert [a.json()["model"] for a in answers] == ["smollm2", "smollm2", "smollm2-backup"]
        assert all(len(a.json()["choices"][0]["message"]["content"].split()) >= 2 for a in answers)  # real text

        # The limit lifted by a commit; then smollm2's server is SIGKILLed: the backup answers, streamed too.
        repo.write("policies/quotas.yaml", UNLIMITED)
        repo.commit("no model limit")

        async def served_by_smollm2() -> bool:
            return (await client.post(url, json=chat())).headers.get("x-plnt-fallback") is None

        await wait_for(served_by_smollm2, timeout=120, what="the lifted limit at the gateway")
        stable = plnt.driver.snapshot()["default/smollm2"].stable
        assert stable is not None and stable.pid is not None
        os.kill(stable.pid, signal.SIGKILL)
        await wait_for(lambda: not Path(f"/proc/{stable.pid}").exists() or None, timeout=30, what="the kill")
        down = await client.post(url, json=chat())
        assert down.status_code == 200, down.text
        assert down.headers["x-plnt-fallback"] == "smollm2-backup" and down.json()["model"] == "smollm2-backup"
        async with client.stream("POST", url, json=chat(stream=True)) as streamed:
            assert streamed.headers["x-plnt-fallback"] == "smollm2-backup"
            lines = [line async for line in streamed.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"model":"smollm2-backup"' in lines[0].replace(" ", "")

        # (while the lifted limit was on its way, the polls above fell back for it too: over_limit >= 1)
        calls = (await client.get(f"{plnt.url}/calls", params={"limit": 1000})).json()
        answered = [c for c in calls if c["fallbackOf"] == "smollm2"]
        reasons = Counter(c["retry"]["reason"] for c in answered)
        assert reasons["connect_refused"] == 2 and reasons["over_limit"] >= 1 and len(reasons) == 2, answered
        assert {c["workflow"] for c in answered} == {"smollm2-backup"}
        failed = Counter((c["workflow"], c["code"], c["retried"]) for c in calls if c["retried"] is not None)
        assert failed == {("smollm2", 429, "over_limit"): reasons["over_limit"],
                          ("smollm2", 502, "connect_refused"): 2}
        metrics = (await client.get(f"{plnt.url}/metrics")).text
        fallbacks = {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
                     for line in metrics.splitlines() if line.startswith("plnt_gateway_fallbacks_total{")}
        assert fallbacks == {
            'fallback="smollm2-backup",model="smollm2",namespace="default",reason="over_limit"': reasons["over_limit"],
            'fallback="smollm2-backup",model="smollm2",namespace="default",reason="connect_refused"': 2.0}
