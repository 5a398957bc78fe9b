"""A quality Gate on a ModelDeployment, with the real model: plnt (Temporal, reconciler, gateway)
serves SmolLM2-135M-Instruct (llama.cpp on this machine's CPU, from signed weights), and each new
version's canary must answer the model's golden cases (canary.golden: prompts with checks, at
temperature 0) on its own server, beside the stable release on the same cases. Cases the model
answers are promoted; a case it cannot answer rolls the canary back, named in the reason.

Stand-in: the Sigstore authority that signs the weights (tests/sigstore_ca.py).
Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.reconciler.saga.history import saga_history

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, deployment, model_repo, publish  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

GATE = "apiVersion: plnt.work/v1\nkind: Gate\nmetadata: {name: golden-answers}\nspec:\n  quality: {minPassRate: 1}\n"
SMOKE = "{invocations: 2, concurrency: 1, p95BudgetMs: 60000}"
ANSWERED = """\
    gates: [golden-answers]
    golden:
      - name: canary-release
        prompt: "Reply with one short sentence: what is a canary release?"
        maxTokens: 24
        checks: [{regex: "(?i)[a-z]+ [a-z]+"}, {contains: "canary"}]
"""
UNANSWERABLE = """\
      - name: secret-word
        prompt: "Say hello."
        maxTokens: 8
        checks: [{contains: "xyzzy-plugh-42"}]
"""


def gated(registry: Path, version: str, digest: str, golden: str) -> str:
    return deployment(registry, version, digest, SMOKE).replace(
        f"  canary: {{trafficPercent: 10, maxTokens: 8, smokeTest: {SMOKE}}}\n",
        f"  canary:\n    trafficPercent: 10\n    maxTokens: 8\n    smokeTest: {SMOKE}\n{golden}")


async def test_a_model_canary_is_held_to_its_golden_cases(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str, smollm2_gguf: Path,  # noqa: F811
) -> None:
    repo, registry, ca, digest = model_repo
    repo.write(MODEL_FILE, deployment(registry, "1.0.0", digest, SMOKE))  # no TTFT budget: the CPU is shared
    repo.commit("smollm2 1.0.0, latency budgets for a busy machine")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)

        # 1.0.1 (the same GGUF): its golden case answered by the canary and by the stable release.
        repo.write("gates/golden-answers.yaml", GATE)
        repo.write(MODEL_FILE, gated(registry, "1.0.1", publish(registry, "1.0.1", smollm2_gguf, ca), ANSWERED))
        commit = repo.commit("smollm2 1.0.1, held to its golden case")
        await hook(plnt)
        ready = await wait_phase(plnt, "Ready", version="1.0.1", name="smollm2", timeout=300)
        assert ready["observedCommit"] == commit
        history = await saga_history(plnt.client, "default", "smollm2")
        (gates,) = [step for step in history.steps if step.step == "check_gates"]
        verdict = (gates.detail or {})["golden-answers"]
        assert verdict.startswith("passed") and "canary 1/1 golden cases passed (100%), stable 1/1" in verdict, verdict

        # 1.0.2: a case no answer of the model meets: rolled back naming it, and 1.0.1 keeps serving.
        repo.write(MODEL_FILE, gated(registry, "1.0.2", publish(registry, "1.0.2", smollm2_gguf, ca),
                                     ANSWERED + UNANSWERABLE))
        repo.commit("smollm2 1.0.2, with a case it cannot answer")
        await hook(plnt)
        rolled = await wait_phase(plnt, "RolledBack", version="1.0.1", name="smollm2", timeout=300)
        assert "canary 1/2 golden cases passed (50%)" in rolled["lastError"], rolled
        assert 'secret-word: the output: does not contain "xyzzy-plugh-42"' in rolled["lastError"], rolled
        assert "canary-release" not in rolled["lastError"].split("failing:")[1], rolled
        assert status_of(plnt, "smollm2")["version"] == "1.0.1"
