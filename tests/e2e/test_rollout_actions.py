"""A person's hand on a rollout as users have it: `plnt up` in its own process (embedded Temporal,
local runner processes; the runners' model is MockBackend, a STAND-IN for a model server; recipes
signed by test authorities, STAND-INS for Sigstore's public services), driven with the `plnt rollout`
and `plnt history` commands as a user would type them."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE, row, wait_row
from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

MANUAL_STEPS = """\
    steps:
      - {weight: %d, pause: manual}
      - {weight: 60}
"""


def plnt(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*PLNT, *args], capture_output=True, text=True, timeout=60)


def test_pause_resume_promote_and_abort_from_the_command_line(spec_repo: SpecRepo, tmp_path: Path,
                                                              started: list[PlntUp]) -> None:
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    first = up.wait_ready()
    url = ("--url", up.url)

    # 1.3.0, its first step held until a person resumes.
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(RUN_FILE, "    trafficPercent: 5\n", MANUAL_STEPS % 20)
    upgrade = spec_repo.commit("1.3.0: 20%, held for a person, then 60%")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    waiting = wait_row(up, lambda r: "waiting for a person" in r["message"], "step 1 waiting for a person")
    assert (waiting["phase"], waiting["canaryStep"], waiting["canaryPercent"]) == ("Canary", 1, 20), waiting

    shown = plnt("rollout", "show", "review-responder", *url)
    assert shown.returncode == 0, shown.stderr
    assert f"rollout of 1.3.0 at commit {upgrade[:12]}: step 1/2, waiting for a person" in shown.stdout, shown.stdout

    # Meant for the rollout before (the commit a person saw earlier): refused, nothing moves.
    stale = plnt("rollout", "resume", "review-responder", *url, "--commit", first["observedCommit"][:10])
    assert stale.returncode == 1 and f"deploys commit {upgrade[:12]}, not {first['observedCommit'][:10]}" in stale.stderr, \
        stale.stderr
    state = httpx.get(f"{up.url}/workflows/review-responder/rollout", trust_env=False).json()
    forged = httpx.post(f"{up.url}/workflows/review-responder/rollout/promote", trust_env=False,
                        json={"commit": first["observedCommit"], "fingerprint": state["fingerprint"], "by": "test"})
    assert forged.status_code == 409 and "refused: this rollout is commit" in forged.json()["error"]["message"], \
        forged.text
    time.sleep(1.5)
    assert row(up)["canaryStep"] == 1, "a refused action moved the rollout"

    paused = plnt("rollout", "pause", "review-responder", *url, "--by", "ops", "--reason", "watching the 20%")
    assert paused.returncode == 0 and "paused" in paused.stdout, paused.stderr
    resumed = plnt("rollout", "resume", "review-responder", *url, "--commit", upgrade[:7], "--by", "ops")
    assert resumed.returncode == 0 and "resumed (step 1/2)" in resumed.stdout, resumed.stderr
    done = wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.3.0", "1.3.0 promoted")
    history = plnt("history", "review-responder", *url)
    assert history.returncode == 0, history.stderr
    assert "pause by ops at " in history.stdout and "watching the 20%" in history.stdout, history.stdout
    assert "resume by ops at " in history.stdout, history.stdout
    over = plnt("rollout", "resume", "review-responder", *url)
    assert over.returncode == 1 and "no rollout of default/review-responder is under way" in over.stderr, over.stderr

    # Back to 1.2.0, aborted at its held step: rolled back, and it stays so (no new saga) until a new commit.
    spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.2.0")
    spec_repo.commit("back to 1.2.0")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    wait_row(up, lambda r: "waiting for a person" in r["message"] and r["canaryVersion"] == "1.2.0", "1.2.0 held")
    aborted = plnt("rollout", "abort", "review-responder", *url, "--by", "ops", "--reason", "not today")
    assert aborted.returncode == 0 and "aborting" in aborted.stdout, aborted.stderr
    rolled = wait_row(up, lambda r: r["phase"] == "RolledBack", "1.2.0 aborted")
    assert rolled["lastError"] == "aborted by ops at step 1/2: not today", rolled
    assert (rolled["version"], rolled["canaryVersion"]) == ("1.3.0", None), rolled
    time.sleep(4)  # four reconcile passes (--interval 1)
    still = row(up)
    assert (still["phase"], still["sagaId"]) == ("RolledBack", rolled["sagaId"]), f"the abort did not hold: {still}"
    answer = httpx.post(f"{up.url}/workflows/review-responder/invoke", json=REVIEW, timeout=30, trust_env=False)
    assert answer.json()["version"] == "1.3.0", "the promoted release keeps serving"

    # A new commit is a new rollout: promoted by hand from its held step.
    spec_repo.replace(RUN_FILE, MANUAL_STEPS % 20, MANUAL_STEPS % 25)
    spec_repo.commit("1.2.0 again, 25% first")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    wait_row(up, lambda r: "waiting for a person" in r["message"] and r["canaryPercent"] == 25, "the new rollout held")
    promoted = plnt("rollout", "promote", "review-responder", *url, "--by", "ops", "--reason", "hotfix")
    assert promoted.returncode == 0, promoted.stderr
    ready = wait_row(up, lambda r: r["phase"] == "Ready" and r["version"] == "1.2.0", "1.2.0 promoted by hand")
    assert done["sagaId"] != ready["sagaId"]
    saga = httpx.get(f"{up.url}/workflows/review-responder/history", trust_env=False).json()
    assert saga["reason"] == "1.2.0 promoted; promoted by ops at step 1/2, skipping what was left of its steps: hotfix"
    assert [(a["verb"], a["by"], a["reason"]) for a in saga["actions"]] == [("promote", "ops", "hotfix")]
    up.stop_and_check(signal.SIGTERM)
