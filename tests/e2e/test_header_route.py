"""canary.headerRoute as users run it: `plnt up` in its own process (its gateway worker processes
follow the route table over the route watch, so the cohort travels the wire; embedded Temporal,
local runner processes; the runners' model is MockBackend, a STAND-IN for a model server; recipes
signed by the example's test authority, a STAND-IN for Sigstore's public services). A canary held at
0% serves the tester cohort only; once promoted, everyone gets it."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration


def versions(url: str, n: int, headers: dict[str, str] | None = None) -> set[str]:
    with httpx.Client(trust_env=False, timeout=30) as client:
        return {client.post(f"{url}/workflows/review-responder/invoke", json=REVIEW, headers=headers or {})
                .json()["version"] for _ in range(n)}


def test_a_tester_cohort_reaches_a_canary_no_one_else_sees(spec_repo: SpecRepo, tmp_path: Path,
                                                           started: list[PlntUp]) -> None:
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    headerRoute: {header: X-Cohort, value: testers}\n"
                      "    steps:\n      - {weight: 0, pause: manual}\n")
    spec_repo.commit("1.3.0 for the testers only, until someone says so")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    wait_row(up, lambda r: "waiting for a person" in r["message"], "the canary held at 0%")
    assert versions(up.url, 20, {"X-Cohort": "testers"}) == {"1.3.0"}
    assert versions(up.url, 40) == {"1.2.0"}
    assert versions(up.url, 20, {"X-Cohort": "everyone"}) == {"1.2.0"}
    resumed = subprocess.run([*PLNT, "rollout", "resume", "review-responder", "--url", up.url],
                             capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted")
    assert versions(up.url, 20) == {"1.3.0"} == versions(up.url, 10, {"X-Cohort": "testers"})
    up.stop_and_check(signal.SIGTERM)


def test_each_step_sends_its_own_cohort(spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    """steps[].headerRoute: the testers at the first step, then the staff (and no longer the testers)
    at the second, both at 0%: the cohort moves with the step, through the route watch's wire."""
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    steps:\n"
                      "      - {weight: 0, pause: manual, headerRoute: {header: X-Cohort, value: testers}}\n"
                      "      - {weight: 0, pause: manual, headerRoute: {header: X-Cohort, value: staff}}\n")
    spec_repo.commit("1.3.0 for the testers, then for the staff")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    wait_row(up, lambda r: "waiting for a person before step 2" in r["message"], "the first step held")
    assert versions(up.url, 10, {"X-Cohort": "testers"}) == {"1.3.0"}
    assert versions(up.url, 10, {"X-Cohort": "staff"}) == {"1.2.0"} == versions(up.url, 20)
    resumed = subprocess.run([*PLNT, "rollout", "resume", "review-responder", "--url", up.url],
                             capture_output=True, text=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    wait_row(up, lambda r: "waiting for a person before the promotion" in r["message"], "the second step held")
    assert versions(up.url, 10, {"X-Cohort": "staff"}) == {"1.3.0"}
    assert versions(up.url, 10, {"X-Cohort": "testers"}) == {"1.2.0"} == versions(up.url, 20)
    up.stop_and_check(signal.SIGTERM)
