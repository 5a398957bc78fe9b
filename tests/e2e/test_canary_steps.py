"""A stepped canary (canary.steps) as users run it: `plnt up` in its own process (embedded Temporal,
local runner processes; the runners' model is MockBackend, a STAND-IN for a model server), recipes
signed by test authorities (tests/sigstore_ca.py, STAND-INS for Sigstore's public services)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
STEPS = """\
    steps:
      - {weight: 20}
      - {weight: 60, pause: 8s}
"""


def row(plnt: PlntUp) -> dict[str, Any] | None:
    return next((r for r in plnt.workflows() or [] if r["name"] == "review-responder"), None)


def wait_row(plnt: PlntUp, check: Any, what: str, timeout: float = 90) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        assert plnt.process.poll() is None, plnt.why(f"plnt exited waiting for {what}")
        last = row(plnt)
        if last is not None and check(last):
            return last
        time.sleep(0.1)
    raise AssertionError(plnt.why(f"timed out waiting for {what}; last row: {last}"))


def test_a_stepped_canary_moves_its_share_survives_a_kill_in_its_pause_and_rolls_back_a_failed_step(
        spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    state_dir = tmp_path / "state"
    port = gateway_port()
    first = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-1.log")
    started.append(first)
    assert first.wait_ready()["version"] == "1.2.0"
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", STEPS)
    spec_repo.commit("1.3.0 in two steps: 20%, then 60% for 8 s")
    httpx.post(f"{first.url}/hooks/git", trust_env=False)

    # Step 2 of 2: the canary has 60% of the traffic while the step's pause runs.
    paused = wait_row(first, lambda r: r["canaryStep"] == 2 and "pausing" in r["message"], "step 2's pause")
    assert (paused["phase"], paused["canaryVersion"], paused["canaryPercent"], paused["canarySteps"]) == (
        "Canary", "1.3.0", 60, 2), paused
    versions = [httpx.post(f"{first.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30,
                           trust_env=False).json()["version"] for _ in range(60)]
    assert 20 <= versions.count("1.3.0") <= 55, f"60% of 60 calls to the canary, give or take: {versions.count('1.3.0')}"

    # plnt killed in the pause (SIGKILL: no clean-up): a new plnt resumes the same saga there.
    first.record_descendants()
    first.process.kill()
    first.process.wait()
    second = PlntUp(spec_repo.path, state_dir, port, tmp_path / "plnt-2.log")
    started.append(second)
    done = wait_row(second, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted")
    assert done["sagaId"] == paused["sagaId"], second.why(f"another saga finished: {done}")
    assert "saga-started" not in second.log(), second.why("a second saga was started instead of resuming")
    assert (done["canaryPercent"], done["canaryStep"], done["canarySteps"]) == (0, None, None), done

    # A version whose first step fails is rolled back from there; 1.3.0 keeps serving.
    spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
    spec_repo.commit("1.4.0 in two steps")
    httpx.post(f"{second.url}/hooks/git", trust_env=False)
    rolled = wait_row(second, lambda r: r["phase"] == "RolledBack", "1.4.0 rolled back")
    assert rolled["lastError"].startswith("step 1/2 at 20%: smoke test failed"), rolled
    assert rolled["version"] == "1.3.0" and rolled["canaryVersion"] is None
    answer = httpx.post(f"{second.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert answer.json()["version"] == "1.3.0"
    second.stop_and_check(signal.SIGTERM)
