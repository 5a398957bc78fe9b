"""The quality gate as users run it: `plnt up` in its own process (embedded Temporal, local runner
processes; the runners' model is MockBackend, a STAND-IN for a model server; recipes signed by test
authorities, STAND-INS for Sigstore's public services). A release that is fast and answers 200 but
answers wrong is rolled back by its golden cases, the failing ones named; a right one is promoted."""

from __future__ import annotations

import re
import shutil
import signal
from pathlib import Path

import httpx
import pytest

from tests.attacks.live import AttackRepo, attack_repo  # noqa: F401 - the fixture
from tests.conftest import EXAMPLE
from tests.e2e.test_canary_steps import RUN_FILE, wait_row
from tests.e2e.test_plnt_up_process import REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

GATE = """\
apiVersion: plnt.work/v1
kind: Gate
metadata: {name: golden-answers}
spec:
  quality: {minPassRate: 1.0, maxDropVsStable: 0}
"""


def version_of_1_3_0(tmp_path: Path, version: str, *, wrong: bool) -> Path:
    """1.3.0's recipe as `version` (its golden cases too, plus a regex check); `wrong`: every review is
    classified as praise, fast and with HTTP 200."""
    target = tmp_path / f"review-responder-{version}"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / "1.3.0", target)
    for name in ("workflow.yaml", "golden.yaml"):
        path = target / name
        path.write_text(path.read_text().replace("1.3.0", version))
    golden = target / "golden.yaml"
    golden.write_text(golden.read_text().replace(
        '  - name: praise\n', '  - name: praise\n    checks: [{path: reply, regex: "(?i)warm regards"}]\n'))
    if wrong:
        steps = target / "steps.py"
        steps.write_text(steps.read_text().replace('"intent": ctx.results["classify_intent"]', '"intent": "praise"'))
    return target


def test_a_fast_but_wrong_release_is_rolled_back_by_its_golden_cases(
        attack_repo: AttackRepo, tmp_path: Path, started: list[PlntUp]) -> None:  # noqa: F811
    repo = attack_repo.repo
    repo.write("gates/golden-answers.yaml", GATE)
    repo.replace(RUN_FILE, "    trafficPercent: 5\n", "    trafficPercent: 5\n    gates: [golden-answers]\n")
    attack_repo.publish("review-responder", "1.6.0", source=version_of_1_3_0(tmp_path, "1.6.0", wrong=True))
    attack_repo.publish("review-responder", "1.7.0", source=version_of_1_3_0(tmp_path, "1.7.0", wrong=False))
    repo.commit("a quality gate; 1.6.0 (wrong) and 1.7.0 (right) published")
    up = PlntUp(repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    # The first install has no stable release to compare with: its golden cases alone decide.
    assert up.wait_ready(timeout=90)["version"] == "1.2.0"

    attack_repo.deploy("review-responder@1.6.0")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    rolled = wait_row(up, lambda r: r["phase"] == "RolledBack", "1.6.0 rolled back by its gate")
    reason = rolled["lastError"]
    assert reason.startswith("step 1/1 at 5%: gate golden-answers (quality): canary 1/4 golden cases passed (25%), "
                             "stable 0/4 (0%): below minPassRate 100%; failing: "), reason
    for case in ("mixed-review", "complaint", "question"):
        assert f"{case}: intent: expected " in reason, reason
    assert 'complaint: intent: expected "complaint", got "praise"' in reason
    assert "praise:" not in reason.split("failing: ", 1)[1], "the case 1.6.0 answers right is not listed"
    assert rolled["version"] == "1.2.0" and rolled["canaryVersion"] is None
    answer = httpx.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert answer.json()["version"] == "1.2.0", "the stable release keeps serving"
    history = httpx.get(f"{up.url}/workflows/review-responder/history", trust_env=False).json()
    (gates,) = [step for step in history["steps"] if step["step"] == "check_gates"]
    assert re.match(r"failed in \d+ ms: canary 1/4", gates["detail"]["golden-answers"]), gates

    attack_repo.deploy("review-responder@1.7.0")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    ready = wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.7.0", "1.7.0 promoted")
    history = httpx.get(f"{up.url}/workflows/review-responder/history", trust_env=False).json()
    (gates,) = [step for step in history["steps"] if step["step"] == "check_gates"]
    assert re.fullmatch(r"passed in \d+ ms: canary 4/4 golden cases passed \(100%\), stable 0/4 \(0%\)",
                        gates["detail"]["golden-answers"]), gates
    assert ready["canaryVersion"] is None
    up.stop_and_check(signal.SIGTERM)
