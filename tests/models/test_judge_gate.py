"""The quality gate's LLM judge with a real model: a real plnt (Temporal, reconciler, gateway, runner
processes) serves SmolLM2-135M-Instruct (llama.cpp on this machine's CPU, from signed weights) as a
ModelDeployment, and review-responder's golden cases are scored by it against a rubric at each
rollout. The judge's scores are in the gate's verdict; at temperature 0 the same answers get the
same scores, so a minScore one above the lowest one rolls the next rollout back, naming the case.

Stand-ins: the Sigstore authority that signs the weights and the recipes (tests/sigstore_ca.py and
the example's test authority); the runners' own LLM calls go to MockBackend (a STAND-IN for a model
server): only the judge is the real model.

Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from plnt.reconciler.saga.history import saga_history

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

RUN_FILE = "workflowruns/review-responder.yaml"
RUBRIC = "The answer thanks the customer and replies to what the review says."


def gate(min_score: int) -> str:
    return ("apiVersion: plnt.work/v1\nkind: Gate\nmetadata: {name: judged}\nspec:\n"
            f"  quality: {{maxDropVsStable: null, judge: {{model: smollm2, rubric: '{RUBRIC}', minScore: {min_score}}}}}\n")


async def test_the_real_model_scores_the_golden_answers_and_its_score_gates_the_rollout(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str,
) -> None:
    repo, registry, _, _ = model_repo
    repo.write("gates/judged.yaml", gate(1))
    repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    gates: [judged]\n")
    repo.replace(RUN_FILE, "spec:\n", "spec:\n  dependsOn: [smollm2]\n")
    repo.commit("review-responder judged by smollm2")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)
        ready = await wait_phase(plnt, "Ready", version="1.2.0", timeout=300)
        history = await saga_history(plnt.client, "default", "review-responder")
        (gates,) = [step for step in history.steps if step.step == "check_gates"]
        verdict = (gates.detail or {})["judged"]
        scores = {name: int(score) for name, score in re.findall(r"([a-z-]+) ([1-5])/5", verdict)}
        assert verdict.startswith("passed") and len(scores) == 4, verdict  # 4 golden cases, each scored 1-5
        assert ready["version"] == "1.2.0"

        lowest, case = min((score, name) for name, score in scores.items())
        if lowest == 5:
            pytest.skip(f"the judge gave every case 5/5 ({verdict}): no minScore can fail one")
        repo.write("gates/judged.yaml", gate(lowest + 1))
        repo.replace(RUN_FILE, "invocations: 10", "invocations: 11")  # the same answers, a new rollout
        repo.commit(f"minScore {lowest + 1}")
        await hook(plnt)
        rolled = await wait_phase(plnt, "RolledBack", version="1.2.0", timeout=300)
        assert f"{case}: the judge scored it {lowest}/5, under {lowest + 1}" in rolled["lastError"], rolled
        assert status_of(plnt, "smollm2")["phase"] == "Ready"
