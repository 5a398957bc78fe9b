"""The live comparison gate as users run it: `plnt up` in its own process (embedded Temporal, its two
gateway worker processes pushing each call to plnt's ledger, local runner processes; the runners'
model is MockBackend, a STAND-IN for a model server; recipes signed by the example's test authority,
a STAND-IN for Sigstore's public services). Real traffic flows through the gateway during the
rollouts: 1.3.0 serves as fast as 1.2.0 and is promoted; 1.5.0 answers right but 0.6 s slower per
call, passes its smoke test's 2.5 s budget, and is rolled back by the comparison with its stable."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

GATE = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: latency-vs-stable}
spec:
  compare: {minRequests: 20, window: 60s, p95Ratio: 1.5, p95SlackMs: 100, errorRatePoints: 1}
"""


class Traffic:
    """One client per URL given (a gateway), invoking review-responder until stopped; what answered:
    `versions` in order, `answered` by (version, track), `per_gateway` by URL."""

    def __init__(self, *urls: str, headers: dict[str, str] | None = None) -> None:
        self.headers = headers or {}
        self.versions: list[str] = []
        self.answered: Counter[tuple[str, str]] = Counter()
        self.per_gateway: Counter[str] = Counter()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(url,), daemon=True) for url in urls]

    def _run(self, url: str) -> None:
        with httpx.Client(trust_env=False, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    answer = client.post(f"{url}/workflows/review-responder/invoke", json=REVIEW, headers=self.headers)
                    self.versions.append(answer.json().get("version", "?"))
                    self.answered[(answer.headers.get("x-plnt-version", "?"), answer.headers.get("x-plnt-track", "?"))] += 1
                    self.per_gateway[url] += 1
                except (httpx.HTTPError, ValueError):
                    self.versions.append("error")

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_the_canary_is_compared_with_its_stable_release_on_real_traffic(
        spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    assert up.wait_ready()["version"] == "1.2.0"
    spec_repo.write("gates/latency-vs-stable.yaml", GATE)
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n",
                      "    steps:\n      - {weight: 50, pause: 3s, gates: [latency-vs-stable]}\n")
    spec_repo.commit("1.3.0 compared with 1.2.0 on real traffic")
    with Traffic(up.url, up.url) as traffic:
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted", timeout=120)
        history = httpx.get(f"{up.url}/workflows/review-responder/history", trust_env=False).json()
        (gates,) = [step for step in history["steps"] if step["step"] == "check_gates"]
        verdict = gates["detail"]["latency-vs-stable"]
        assert verdict.startswith("passed in ") and "vs stable" in verdict and "canary /" in verdict, verdict

        spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.5.0")
        spec_repo.commit("1.5.0: right, but 0.6 s slower per call")
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        rolled = wait_row(up, lambda r: r["phase"] == "RolledBack", "1.5.0 rolled back", timeout=150)
    reason = rolled["lastError"]
    assert reason.startswith("step 1/1 at 50%: gate latency-vs-stable (compare): p95 "), reason
    assert "over 1.5 x stable" in reason and "+ 100 ms" in reason, reason
    assert rolled["smokeTest"]["passed"], "the smoke test's own budget passed 1.5.0: only the comparison caught it"
    assert {"1.2.0", "1.3.0", "1.5.0"} <= set(traffic.versions) and "error" not in traffic.versions
    up.stop_and_check(signal.SIGTERM)
