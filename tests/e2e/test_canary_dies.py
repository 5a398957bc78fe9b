"""A canary whose runner dies during its rollout, on `plnt up` as users run it (its own process, embedded
Temporal, its gateway worker processes, local runner processes; the runners' model is MockBackend, a STAND-IN
for a model server; recipes signed by the example's test authority, a STAND-IN for Sigstore's services).

1.3.0 is rolled out with half the traffic and a comparison gate; while clients invoke, its runner is
SIGKILLed. Every request after that is answered (the gateway sends the canary's share, refused, to the
stable release), the failed attempts count against the canary in plnt's traffic ledger, and the comparison
gate rolls 1.3.0 back on them. The clients pause for the kill itself: a request in flight on a runner at the
instant it dies is answered 502 and not retried (it may have run a side-effecting step: docs/gateway.md,
tests/gateway/test_retries.py)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_kill_each_step import runners
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

GATE = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: errors-vs-stable}
spec:
  compare: {minRequests: 20, window: 90s, errorRatePoints: 1}
"""


class PausableTraffic:
    """Two clients invoking review-responder until stopped, that can be paused (no request in flight);
    every answer's status and (version, track)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statuses: Counter[int] = Counter()
        self.answered: Counter[tuple[str, str]] = Counter()
        self.failures: list[str] = []
        self._stop, self._go = threading.Event(), threading.Event()
        self._go.set()
        self._idle = [threading.Event(), threading.Event()]
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(2)]

    def _run(self, i: int) -> None:
        with httpx.Client(trust_env=False, timeout=30) as client:
            while not self._stop.is_set():
                if not self._go.is_set():
                    self._idle[i].set()
                    self._go.wait()
                    continue
                self._idle[i].clear()
                try:
                    answer = client.post(f"{self.url}/workflows/review-responder/invoke", json=REVIEW)
                    self.statuses[answer.status_code] += 1
                    self.answered[(answer.headers.get("x-plnt-version", "?"), answer.headers.get("x-plnt-track", "?"))] += 1
                    if answer.status_code != 200:
                        self.failures.append(answer.text[:300])
                except httpx.HTTPError as exc:
                    self.failures.append(f"{type(exc).__name__}: {exc}")

    def pause(self) -> None:
        self._go.clear()
        for idle in self._idle:
            assert idle.wait(30)

    def resume(self) -> None:
        self._go.set()

    def __enter__(self) -> PausableTraffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._go.set()
        for thread in self._threads:
            thread.join(timeout=30)


def gone(pid: int, timeout_s: float = 10.0) -> None:
    """Wait until `pid` has exited (a zombie counts: its sockets are closed)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} still runs {timeout_s:g}s after SIGKILL")


def retry_calls(up: PlntUp, timeout_s: float = 60.0) -> tuple[list[dict], list[dict]]:
    """The attempts the gateway retried after a refused connect and the retries that answered, once
    both show among the newest 1,000 calls."""
    deadline = time.monotonic() + timeout_s
    while True:
        calls = httpx.get(f"{up.url}/calls", params={"limit": 1000}, trust_env=False).json()
        retried = [c for c in calls if c["retried"] == "connect_refused"]
        answered = [c for c in calls if c["retry"] is not None]
        if retried and answered:
            return retried, answered
        assert time.monotonic() < deadline, f"no retried call after a refused connect within {timeout_s:g}s"
        time.sleep(0.1)


def test_a_canary_whose_runner_dies_loses_no_request_and_is_rolled_back(
        spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:  # noqa: F811
    state = tmp_path / "state"
    up = PlntUp(spec_repo.path, state, gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    assert up.wait_ready()["version"] == "1.2.0"
    spec_repo.write("gates/errors-vs-stable.yaml", GATE)
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n",
                      "    steps:\n      - {weight: 50, pause: 2s, gates: [errors-vs-stable]}\n")
    spec_repo.commit("1.3.0 with half the traffic, compared with 1.2.0")
    with PausableTraffic(up.url) as traffic:
        httpx.post(f"{up.url}/hooks/git", trust_env=False)
        wait_row(up, lambda r: r["phase"] == "Canary" and r.get("canaryPercent") == 50, "1.3.0 at 50%", timeout=120)
        deadline = time.monotonic() + 30
        while traffic.answered[("1.3.0", "canary")] < 5:  # the canary answers its share
            assert time.monotonic() < deadline, traffic.answered
            time.sleep(0.05)
        canary = [pid for pid in runners(state) if ".1.3.0." in os.readlink(f"/proc/{pid}/cwd")]
        assert len(canary) == 1, runners(state)
        traffic.pause()
        before = sum(traffic.statuses.values())
        assert traffic.failures == [], traffic.failures[:3]
        os.kill(canary[0], signal.SIGKILL)
        gone(canary[0])  # kill returns before the process is gone: a request sent before that may reach it
        traffic.resume()
        # Read while they are among the newest calls: the log keeps 1,000, and on a slow machine the
        # traffic until the rollback pushed them out before the end.
        retried, answered = retry_calls(up)
        rolled = wait_row(up, lambda r: r["phase"] == "RolledBack", "1.3.0 rolled back", timeout=150)
        time.sleep(0.5)  # a little traffic on 1.2.0 alone
    after = sum(traffic.statuses.values()) - before
    assert after > 20 and traffic.failures == [], traffic.failures[:3]  # no request lost
    assert set(traffic.statuses) == {200}
    reason = rolled["lastError"]
    assert "gate errors-vs-stable (compare)" in reason and "error rate" in reason, reason
    assert {(c["version"], c["track"], c["code"]) for c in retried} == {("1.3.0", "canary", 502)}
    assert {(c["version"], c["track"], c["retry"]["from"]) for c in answered} == {
        ("1.2.0", "stable", "canary 1.3.0")}
    metrics = httpx.get(f"{up.url}/metrics", trust_env=False).text
    assert 'plnt_gateway_retries_total{namespace="default",reason="connect_refused",workflow="review-responder"}' \
        in metrics
    up.stop_and_check(signal.SIGTERM)
