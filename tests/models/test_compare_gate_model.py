"""The live comparison gate on a real model's streamed chat: a real plnt (Temporal, reconciler, gateway,
llama.cpp server processes) serves SmolLM2-135M-Instruct as a ModelDeployment; a client streams chat
completions through the gateway the whole time, and the gateway times each answer's first token and
the tokens after it and counts them. 1.0.1's canary is held to 1.0.0 on TTFT, TPOT and tokens with room
for CPU noise and is promoted; 1.0.2's canary (the same weights) is held to a TTFT p95 of a quarter of
the stable's, which the same model on the same CPU cannot meet, and is rolled back, naming the figure.

Stand-ins: the Sigstore authority that signs the weights (tests/sigstore_ca.py). Everything else is
real. Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from plnt.reconciler.saga.history import saga_history

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import MODEL_FILE, model_repo, publish  # noqa: F401 - the fixture
from tests.models.test_model_deployment import deployment as model_deployment
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

# The step's traffic includes its smoke test's time, when a gateway call to the canary can wait behind a
# smoke-test request (the first run measured one such TTFT at 4.4 s against a stable's 94 ms): 20 calls,
# so one such call is past the p95; the room is for a 2-core machine other tests share.
PASSING = ("{minRequests: 20, window: 300s, p95Ratio: null, ttftRatio: 5, ttftSlackMs: 1000, tpotRatio: 5, "
           "tpotSlackMs: 100, tokensRatio: 2}")
FAILING = "{minRequests: 20, window: 300s, p95Ratio: null, ttftRatio: 0.25, ttftSlackMs: 0}"


def gate(compare: str) -> str:
    return f"apiVersion: plnt.work/v1\nkind: Gate\nmetadata: {{name: streamed-vs-stable}}\nspec:\n  compare: {compare}\n"


def deployment(registry: Path, version: str, digest: str) -> str:
    """test_model_deployment's, in one step at 50% held to the gate."""
    return model_deployment(registry, version, digest, "{invocations: 1, concurrency: 1, p95BudgetMs: 60000}").replace(
        "trafficPercent: 10, ", "steps: [{weight: 50, gates: [streamed-vs-stable]}], ")


class Chats:
    """One client streaming chat completions through the gateway until stopped (one at a time: the
    llama.cpp servers answer in turn, so no answer waits behind another)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.served: list[tuple[str, str]] = []  # (version, track)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        body = {"model": "smollm2", "max_tokens": 8, "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": "Reply with one short sentence: what is a canary release?"}]}
        with httpx.Client(trust_env=False, timeout=120) as client:
            while not self._stop.is_set():
                try:
                    with client.stream("POST", f"{self.url}/v1/chat/completions", json=body) as answer:
                        lines = [line for line in answer.iter_lines() if line.startswith("data: ")]
                        if answer.status_code != 200 or lines[-1:] != ["data: [DONE]"]:
                            self.failures.append(f"{answer.status_code}: {lines[-2:]}")
                        self.served.append((answer.headers.get("x-plnt-version", "?"), answer.headers.get("x-plnt-track", "?")))
                except (httpx.HTTPError, IndexError, json.JSONDecodeError) as exc:
                    self.failures.append(repr(exc))

    async def __aenter__(self) -> Chats:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        # Joined off the event loop: plnt's gateway runs on it and answers the call in flight.
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 150)


async def test_a_model_canary_is_judged_on_ttft_tpot_and_tokens_of_real_streamed_chat(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str, smollm2_gguf: Path,  # noqa: F811
) -> None:
    repo, registry, ca, _ = model_repo
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=180)
        repo.write("gates/streamed-vs-stable.yaml", gate(PASSING))
        repo.write(MODEL_FILE, deployment(registry, "1.0.1", publish(registry, "1.0.1", smollm2_gguf, ca)))
        repo.commit("smollm2 1.0.1, held to 1.0.0 on streamed chat")
        async with Chats(plnt.url) as chats:
            await hook(plnt)
            await wait_phase(plnt, "Ready", version="1.0.1", name="smollm2", timeout=400)
        assert ("1.0.1", "canary") in chats.served and not chats.failures, (chats.served, chats.failures)
        history = await saga_history(plnt.client, "default", "smollm2")
        (gates,) = [step for step in history.steps if step.step == "check_gates"]
        verdict = (gates.detail or {})["streamed-vs-stable"]
        assert verdict.startswith("passed"), verdict
        figures = dict(re.findall(r"(TTFT p95|TPOT p95) ([0-9.]+) ms vs stable", verdict))
        assert set(figures) == {"TTFT p95", "TPOT p95"} and all(float(v) > 0 for v in figures.values()), verdict
        assert re.search(r"mean tokens [1-9][0-9.]* vs stable [1-9]", verdict), verdict  # 8 tokens asked

        repo.write("gates/streamed-vs-stable.yaml", gate(FAILING))
        repo.write(MODEL_FILE, deployment(registry, "1.0.2", publish(registry, "1.0.2", smollm2_gguf, ca)))
        repo.commit("smollm2 1.0.2, held to a quarter of 1.0.1's TTFT")
        async with Chats(plnt.url) as chats:
            await hook(plnt)
            rolled = await wait_phase(plnt, "RolledBack", version="1.0.1", name="smollm2", timeout=400)
        reason = rolled["lastError"]
        assert re.search(r"gate streamed-vs-stable \(compare\): TTFT p95 [0-9.]+ ms over 0.25 x stable [0-9.]+ ms "
                         r"\+ 0 ms \(ttftSlackMs\) = [0-9.]+ ms \(over \d+ canary / \d+ stable requests\)", reason), reason
        assert ("1.0.2", "canary") in chats.served and not chats.failures, (chats.served, chats.failures)
        assert status_of(plnt, "smollm2")["phase"] == "RolledBack"
