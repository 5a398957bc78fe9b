"""Trying a new model with no user exposure, with real inference on this machine's CPU: a real plnt
(Temporal worker, reconciler, gateway) serves SmolLM2-135M-Instruct 1.0.0 (llama.cpp, from signed
weights); 1.0.1 rolls out as a canary at trafficPercent 0 with shadowPercent 100 and a compare Gate.
Chat completions sent to the gateway meanwhile are all answered by 1.0.0 (every reply's X-Plnt-Version
and X-Plnt-Track say so); each is also sent to the 1.0.1 server and its answer discarded (track
"shadow" in /calls), and the compare gate promotes 1.0.1 on that shadow traffic alone.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py). Everything else is
real. Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.saga.history import saga_history

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, chat, model_repo, publish  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

MIN_REQUESTS = 8
GATE = ("apiVersion: plnt.work/v1\nkind: Gate\nmetadata: {name: shadow-vs-stable}\nspec:\n"
        # Both servers share this machine's two cores while the canary answers the mirrors: the latency
        # bound is loose; what is tested is that shadow traffic alone gives the gate its verdict.
        f"  compare: {{minRequests: {MIN_REQUESTS}, window: 5m, p95Ratio: 4, p95SlackMs: 5000}}\n")


def deployment(registry: Path, version: str, digest: str, canary: str, threads: int = 2) -> str:
    return (
        "apiVersion: plnt.work/v1\nkind: ModelDeployment\nmetadata: {name: smollm2}\nspec:\n"
        f"  model: {{registry: 'file://{registry}', name: smollm2, version: {version}, rootDigest: '{digest}', "
        "trustPolicy: models}\n"
        f"  runtime: {{type: llama.cpp, contextLength: 1024, threads: {threads}}}\n"
        "  backend: {cluster: local}\n"
        f"  canary:\n{canary}"
        # Budgets for a shared, busy CPU: what is tested here is where the traffic goes, not its speed.
        "    maxTokens: 8\n"
        "    smokeTest: {invocations: 2, concurrency: 1, p95BudgetMs: 120000}\n")


# The new version: no user's share, every completion mirrored, judged by the compare gate. One thread:
# the stable's server (two) and this one share the machine's two cores.
SHADOWED = "    shadowPercent: 100\n    steps: [{weight: 0, gates: [shadow-vs-stable]}]\n"


def user_chat(stream: bool) -> dict[str, object]:
    return {**chat(stream=stream), "max_tokens": 6}


async def test_a_new_model_is_tried_on_shadow_traffic_with_no_user_exposure_and_promoted_by_a_compare_gate(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str, smollm2_gguf: Path,  # noqa: F811
) -> None:
    repo, registry, ca, first = model_repo
    repo.write(MODEL_FILE, deployment(registry, "1.0.0", first, "    trafficPercent: 10\n"))
    repo.commit("smollm2 1.0.0 with a smoke budget for a busy machine")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=300)

        second = publish(registry, "1.0.1", smollm2_gguf, ca)  # new weights' version (the same GGUF)
        repo.write("gates/shadow-vs-stable.yaml", GATE)
        repo.write(MODEL_FILE, deployment(registry, "1.0.1", second, SHADOWED, threads=1))
        repo.commit("smollm2 1.0.1 tried in the shadow of 1.0.0")

        replies: list[tuple[str, str, int]] = []  # (X-Plnt-Track, X-Plnt-Version, status) of every reply

        async def users() -> None:
            """A user's chats, one after the other, streamed and not, until cancelled."""
            for i in range(10_000):
                stream = i % 2 == 1
                answer = await client.post(f"{plnt.url}/v1/chat/completions", json=user_chat(stream))
                replies.append((answer.headers.get("x-plnt-track", ""), answer.headers.get("x-plnt-version", ""),
                                answer.status_code))
                if stream:
                    assert answer.text.rstrip().endswith("data: [DONE]"), answer.text[-200:]
                else:
                    assert json.loads(answer.text)["choices"][0]["message"]["content"], answer.text

        traffic = asyncio.create_task(users())
        try:
            await hook(plnt)
            # (traffic.result() raises what failed in a user's chat at once, rather than at the timeout)
            await wait_for(lambda: (traffic.done() and traffic.result()) or (
                (s := status_of(plnt, "smollm2")) and s["phase"] == "Canary" and s), timeout=180, what="the 1.0.1 canary")
            canary = plnt.driver.snapshot()["default/smollm2"].canary
            assert canary is not None and (canary.version, canary.traffic_percent, canary.shadow_percent) == \
                ("1.0.1", 0, 100), canary
            await wait_for(lambda: (traffic.done() and traffic.result()) or (
                (s := status_of(plnt, "smollm2")) and s["phase"] == "Ready" and s["version"] == "1.0.1" and s),
                timeout=420, what="1.0.1 promoted")
        finally:
            traffic.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await traffic
        promoted_at = len(replies)

        # Every reply came from the stable track: 1.0.0 until the promotion, 1.0.1 after it, never mixed.
        assert replies and {track for track, _, _ in replies} == {"stable"}, replies
        assert {status for _, _, status in replies} == {200}, replies
        versions = [version for _, version, _ in replies]
        first_new = versions.index("1.0.1") if "1.0.1" in versions else promoted_at
        assert set(versions[:first_new]) == {"1.0.0"} and set(versions[first_new:]) <= {"1.0.1"}, versions
        assert first_new >= MIN_REQUESTS, "the gate had that many 1.0.0 answers to compare with"

        calls = (await client.get(f"{plnt.url}/calls", params={"limit": 1000})).json()
        mirrored = [c for c in calls if c["workflow"] == "smollm2" and c["track"] == "shadow"]
        assert len(mirrored) >= MIN_REQUESTS and {(c["api"], c["version"]) for c in mirrored} == {("chat", "1.0.1")}
        assert not [c for c in calls if c["workflow"] == "smollm2" and c["track"] == "canary"], \
            "no caller was answered by the canary"
        metrics = (await client.get(f"{plnt.url}/metrics")).text
        assert 'track="shadow",version="1.0.1",workflow="smollm2"' in metrics

        history = await saga_history(plnt.client, "default", "smollm2")
        (gates,) = [step for step in history.steps if step.step == "check_gates"]
        verdict = (gates.detail or {})["shadow-vs-stable"]
        assert verdict.startswith("passed") and "canary /" in verdict, verdict
        print("compare gate on shadow traffic:", verdict, f"({promoted_at} user chats during the rollout)")
