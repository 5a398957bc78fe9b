"""A ModelDeployment autoscaled through `plnt up`, with real inference: SmolLM2-135M on llama.cpp
(one request at a time per server), replicas 1-2 and `autoscaling: {targetInFlight: 1}`. Chats at
once make requests wait in the one server; plnt starts a second server of the same release, the
gateway sends chats to both, and once the chats stop it goes back to one.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py). Everything else is
real. Needs `make install-llm`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, wait_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, chat, deployment, model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]


def servers(plnt: object) -> tuple[str, ...]:
    record = plnt.driver.record_of("default", "smollm2")  # type: ignore[attr-defined]
    return tuple(record.stable.endpoints) if record is not None and record.stable is not None else ()


async def test_chats_that_wait_bring_a_second_model_server_and_it_goes_again(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str,
) -> None:
    repo, registry, _, digest = model_repo
    # (the smoke test is not what this test is about: one call, a budget a busy CPU meets)
    repo.write(MODEL_FILE, deployment(registry, "1.0.0", digest, "{invocations: 1, concurrency: 1, p95BudgetMs: 120000}")
               .replace("  backend: {cluster: local}\n", "  backend: {cluster: local}\n  replicas: {min: 1, max: 2}\n"
                        "  autoscaling: {targetInFlight: 1, scaleDownAfterSeconds: 2}\n"))
    repo.commit("smollm2 autoscaled 1-2 on one request in flight each")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120,
                            # a scale down drains the server it stops, for at most this: a chat on a busy
                            # CPU (tens of seconds) must not outlast it
                            runner_stop_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)
        assert len(servers(plnt)) == 1
        stop = asyncio.Event()
        answers: list[int] = []

        async def chatter() -> None:
            while not stop.is_set():
                answer = await client.post(f"{plnt.url}/v1/chat/completions", json={**chat(), "max_tokens": 24})
                answers.append(answer.status_code)

        chatters = [asyncio.create_task(chatter()) for _ in range(3)]
        try:
            two = await wait_for(lambda: len(servers(plnt)) == 2 and servers(plnt), timeout=90,
                                 what=lambda: f"a second model server (now {servers(plnt)})")
            busy: set[str] = set()  # the servers seen with a chat in flight: the gateway uses both
            for _ in range(600):  # (a chat takes seconds on a busy CPU)
                for endpoint in two:
                    if (await client.get(f"{endpoint}/load")).json()["inFlight"] > 0:
                        busy.add(endpoint)
                if busy == set(two):
                    break
                await asyncio.sleep(0.1)
        finally:
            stop.set()
            await asyncio.gather(*chatters)
        assert busy == set(two), busy
        await wait_for(lambda: len(servers(plnt)) == 1, timeout=60, what=lambda: f"one server again ({servers(plnt)})")
        assert answers and set(answers) == {200}, answers  # none cut by the scale down
        last = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
        assert last.status_code == 200, last.text
