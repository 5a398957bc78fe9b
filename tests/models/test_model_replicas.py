"""A ModelDeployment with `replicas.min: 2` on the embedded default: the real SmolLM2 (llama.cpp) canary is
one model server; once promoted, the release runs two model server processes, each on its own port,
both answering chat completions, and the gateway sends requests to both.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py). Needs `make install-llm`."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from plnt.reconciler.drivers.processes import process_start_time

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, chat, deployment, model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]


async def test_a_model_deployment_with_two_replicas_answers_from_two_model_servers(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str,
) -> None:
    repo, registry, _, digest = model_repo
    repo.write(MODEL_FILE, deployment(registry, "1.0.0", digest, (
        "{invocations: 2, concurrency: 1, p95BudgetMs: 120000, ttftBudgetMs: 60000, tpotBudgetMs: 30000}"))
        + "  replicas: {min: 2}\n")
    repo.commit("smollm2 on two replicas")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)
        stable = plnt.driver.snapshot()["default/smollm2"].stable
        assert stable is not None and stable.replicas == 2
        servers = stable.processes()
        assert len(servers) == 2 and len({p.pid for p in servers}) == 2 and len({p.port for p in servers}) == 2
        assert all(p.pid is not None and process_start_time(p.pid) is not None for p in servers)
        for server in servers:  # each is a llama.cpp server of its own, answering as the release
            answer = await client.post(f"{server.endpoint}/v1/chat/completions", json=chat())
            assert answer.status_code == 200, answer.text
            assert answer.json()["usage"]["completion_tokens"] > 1
        through = [await client.post(f"{plnt.url}/v1/chat/completions", json=chat()) for _ in range(4)]
        assert [r.status_code for r in through] == [200] * 4 and all(r.headers["x-plnt-version"] == "1.0.0"
                                                                      for r in through)
        route = plnt.router.table.lookup("smollm2", "default")
        assert route is not None and {b.endpoint for b in route.stable_replicas} == {p.endpoint for p in servers}
