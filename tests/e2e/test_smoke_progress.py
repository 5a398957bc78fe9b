"""Live smoke numbers while a canary is tested: the smoke test's heartbeats (calls done, p95 and
errors so far) reach the status (`smokeProgress`) and the forge's pending status before the verdict.
Real git, real Temporal, real runners (mock model backend, a stand-in for a model server), real signed
recipes; the forge is the DECLARED stand-in (tests/forge_standin.py, GitHub REST shapes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, running_plnt, settings_for, status_of, wait_for, wait_phase
from tests.forge_standin import ForgeStandin

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "forge-token-smoke-progress"


async def test_a_running_smoke_tests_numbers_show_before_its_verdict(
        spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str) -> None:
    with ForgeStandin("github", "platform/specs", TOKEN) as standin:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="github", forge_api_url=standin.api_url, forge_project="platform/specs",
                                forge_token=SecretStr(TOKEN))
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            # 1.5.0 answers in 0.6 s per call: its 10 smoke calls take about 6 s, one at a time.
            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.5.0")
            slow = spec_repo.commit("review-responder 1.5.0 (slow)")
            await hook(plnt)

            def live() -> dict | None:  # type: ignore[type-arg]
                status = status_of(plnt)
                progress = (status or {}).get("smokeProgress") or {}
                if status and status["phase"] == "Canary" and 0 < progress.get("done", 0) < progress.get("of", 0):
                    return progress
                return None

            progress = await wait_for(live, timeout=60, what="smoke progress while the canary is tested")
            assert progress["of"] == 10 and progress["metrics"]["p95_ms"] >= 500, progress
            pending = await wait_for(
                lambda: [s["description"] for s in standin.statuses
                         if s["sha"] == slow and s["state"] == "pending" and " calls, p95 " in s["description"]],
                timeout=30, what="a pending status with the numbers so far")
            assert pending[0].startswith("Canary 1.5.0 at 5%: ") and "≤ 2500" in pending[0], pending

            await wait_phase(plnt, "Ready", version="1.5.0", timeout=90)
            await wait_for(lambda: status_of(plnt)["smokeProgress"] is None, what="progress cleared after Canary")
            # The verdict reaches the forge after Ready, from a follower: waited for, not raced.
            await wait_for(lambda: [s for s in standin.statuses if s["sha"] == slow][-1]["state"] != "pending",
                           timeout=30, what="the verdict's commit status")
            final = [s for s in standin.statuses if s["sha"] == slow][-1]
            assert final["state"] == "success" and final["description"].startswith("Ready 1.5.0: p95 "), final
