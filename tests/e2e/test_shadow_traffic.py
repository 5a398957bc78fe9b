"""Shadow traffic as users run it: `plnt up` in its own process (its gateway worker processes mirror
the requests and push their calls to plnt's ledger; embedded Temporal, local runner processes; the
runners' model is MockBackend, a STAND-IN for a model server; recipes signed by the example's test
authority, a STAND-IN for Sigstore's public services). A canary at 0% with every invocation mirrored
to it is judged by a compare gate on that shadow traffic and promoted: no caller got an answer from
it before its promotion."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_compare_gate import Traffic
from tests.e2e.test_plnt_up_process import PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

GATE = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: shadow-vs-stable}
spec:
  compare: {minRequests: 20, window: 60s, p95Ratio: 1.5, p95SlackMs: 100}
"""


def test_a_canary_judged_on_shadow_traffic_alone(spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    spec_repo.write("gates/shadow-vs-stable.yaml", GATE)
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    shadowPercent: 100\n    steps:\n"
                      "      - {weight: 0, pause: 3s, gates: [shadow-vs-stable]}\n")
    spec_repo.commit("1.3.0 in the shadow of 1.2.0")
    with Traffic(up.url) as traffic:
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted", timeout=120)
    assert "error" not in traffic.versions
    history = httpx.get(f"{up.url}/workflows/review-responder/history", trust_env=False).json()
    (gates,) = [step for step in history["steps"] if step["step"] == "check_gates"]
    verdict = gates["detail"]["shadow-vs-stable"]
    assert verdict.startswith("passed in ") and "canary /" in verdict, verdict
    calls = httpx.get(f"{up.url}/calls", params={"limit": 1000}, trust_env=False).json()
    assert {c["version"] for c in calls if c["track"] == "shadow"} == {"1.3.0"}, "mirrors went to the canary"
    assert not [c for c in calls if c["track"] == "canary"], "no caller was answered by the canary (0%)"
    up.stop_and_check(signal.SIGTERM)
