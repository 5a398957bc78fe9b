"""The web UI (/ui) with a real model: a real plnt (Temporal dev server, git repository, reconciler,
gateway, runner processes) deploys the SmolLM2 ModelDeployment (llama.cpp on this machine's CPU, from
signed weights) beside review-responder, and headless Chromium (Debian's `chromium`, driven by
Playwright) shows it: listed Ready with its TTFT and TPOT verdict, its rollout's gates, and a chat in
the playground whose text is the real model's, streamed in.

Stand-ins: the Sigstore authority that signs the weights and the recipes (tests/sigstore_ca.py and the
example's test authority). The spec repository, the weights and the browser fixtures are those of
tests/models/test_model_deployment.py and tests/ui/test_browser.py. Saves docs/screenshots/models.png
and model-chat.png (overwritten every run) for docs/observability.md.

Needs `make install-llm` (part of `make test`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import SpecRepo
from tests.e2e.harness import running_plnt, settings_for, wait_phase
from tests.models.test_llama_runtime import LLM_VENV, smollm2_gguf  # noqa: F401 - the fixture
from tests.models.test_model_deployment import EMAIL, model_repo  # noqa: F401 - the fixture
from tests.sigstore_ca import TestSigstoreAuthority
from tests.ui.test_browser import browser, page, shot  # noqa: F401 - the fixtures

pytestmark = [pytest.mark.integration, pytest.mark.real_inference]

MODEL_ROW = 'tr[data-workflow="default/smollm2"]'


def ms(value: float) -> str:
    """A measured value as the page writes it (app.js fmt: at most two decimals)."""
    return f"{round(value, 2):g} ms"


async def test_the_model_is_listed_its_gates_shown_and_its_answer_streams_into_the_playground(
    model_repo: tuple[SpecRepo, Path, TestSigstoreAuthority, str], tmp_path: Path,  # noqa: F811
    temporal_address: str, temporal_namespace: str, page: Any,  # noqa: F811
) -> None:
    repo, registry, _, _ = model_repo
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                            file_registry_roots=(registry,), llm_venv=LLM_VENV, smoke_request_timeout_s=120)
    async with running_plnt(settings) as plnt:
        ready = await wait_phase(plnt, "Ready", version="1.0.0", name="smollm2", timeout=120)
        await wait_phase(plnt, "Ready", version="1.2.0")
        metrics = ready["smokeTest"]["metrics"]
        assert metrics["ttft_p95_ms"] is not None and metrics["tpot_p95_ms"] is not None, ready

        # Workflows: smollm2 is a ModelDeployment, Ready, signed by the weights' signer, with a
        # verdict naming TTFT and TPOT against their budgets (model_repo: 5000 ms and 2000 ms).
        await page.goto(f"{plnt.url}/ui")
        row = page.locator(f'{MODEL_ROW}[data-phase="Ready"]')
        await row.wait_for()
        await page.locator('tr[data-workflow="default/review-responder"][data-phase="Ready"]').wait_for()
        assert (await row.locator("td").nth(0).inner_text()).strip() == "ModelDeployment"
        assert EMAIL in ready["signer"] and ready["signer"] in await row.locator("td.signer").inner_text()
        verdict = await row.locator(".verdict").inner_text()
        assert "passed" in verdict, verdict
        assert f"TTFT p95 {ms(metrics['ttft_p95_ms'])} / budget 5000 ms" in verdict, verdict
        assert f"TPOT p95 {ms(metrics['tpot_p95_ms'])} / budget 2000 ms" in verdict, verdict
        assert "1.0.0" in await row.inner_text()
        await page.locator("#live.mode-live").wait_for()
        await shot(page, "models.png")

        # Its rollout: the TTFT and TPOT gates, measured against their budgets, and promoted.
        await row.get_by_role("link", name="Rollout of smollm2").click()
        await page.wait_for_function("() => location.hash === '#/rollout/default/smollm2'")
        await page.locator("#outcome", has_text="promoted").wait_for()
        for gate, value, budget in (("ttft", metrics["ttft_p95_ms"], "5000 ms"),
                                    ("tpot", metrics["tpot_p95_ms"], "2000 ms")):
            text = await page.locator(f'#gates tr[data-gate="{gate}"]').inner_text()
            assert ms(value) in text and budget in text and "within budget" in text, (gate, text)
        assert EMAIL in await page.locator('ol.timeline [data-step="Verification"]').inner_text()
        assert "1.0.0" in await page.locator('ol.timeline [data-step="Canary"]').inner_text()

        # Playground, chat: the models of GET /v1/models (the model and the WorkflowRun: the user
        # picks the backend); smollm2's answer streams in, token by token.
        # "Try" on the model's row opens the playground in chat mode with smollm2 picked.
        await page.get_by_role("link", name="Workflows").click()
        await page.locator(MODEL_ROW).get_by_role("link", name="Try smollm2 in the playground").click()
        await page.wait_for_function("() => location.hash === '#/playground/default/smollm2'")
        await page.locator("#pg-model option[value='smollm2']").wait_for(state="attached")
        assert await page.locator("#mode-chat").is_checked() and await page.locator("#pg-message").is_visible()
        options = await page.locator("#pg-model option").evaluate_all("(os) => os.map((o) => o.value)")
        assert {"smollm2", "review-responder"} <= set(options), options
        assert await page.locator("#pg-model").input_value() == "smollm2", "the model the link named is picked"
        # The track choices are the model's (its stable version), not another workflow's.
        assert await page.locator("#pg-track option[value='stable']").inner_text() == "stable 1.0.0"
        await page.locator("#pg-message").fill("Reply with one short sentence: what is a canary release?")
        await page.evaluate("""() => {
            window.__seen = [];
            const out = document.getElementById('pg-output');
            new MutationObserver(() => window.__seen.push([out.textContent.length, performance.now()]))
              .observe(out, {childList: true, characterData: true, subtree: true});
        }""")
        await page.locator("#pg-run").click()
        await page.locator("#pg-meta", has_text="done").wait_for(timeout=90_000)
        assert await page.locator("#pg-error").inner_text() == ""
        assert await page.locator("#pg-status").inner_text() == "200"
        assert await page.locator("#pg-version").inner_text() == "1.0.0"
        assert await page.locator("#pg-track-used").inner_text() == "stable"
        answer = await page.locator("#pg-output").inner_text()
        assert len(answer.split()) >= 3 and re.search(r"[A-Za-z]{3}", answer), answer
        seen = await page.evaluate("() => window.__seen")
        lengths = [length for length, _ in seen]
        assert len(lengths) >= 3 and lengths == sorted(lengths) and lengths[0] < lengths[-1], \
            f"the answer did not grow piece by piece: {seen}"
        assert seen[-1][1] - seen[0][1] > 0, "every piece arrived at once"
        pieces = int((await page.locator("#pg-chunks").inner_text()).split()[0])
        assert pieces >= 3, pieces
        log_row = page.locator("#calls-table tbody tr").first
        await log_row.wait_for()
        assert "smollm2" in await log_row.inner_text()
        print("smollm2 in the playground:", answer)
        await shot(page, "model-chat.png")
