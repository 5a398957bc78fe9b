"""dependsOn as users run it: `plnt up` in its own process (embedded Temporal, local runner
processes; the runners' model is MockBackend, a STAND-IN for a model server; recipes signed by the
example's test authority, a STAND-IN for Sigstore's public services). post-generator depends on
review-responder: in one commit changing both, its saga waits for review-responder's promotion;
when review-responder is rolled back, post-generator's rollout fails naming it, and keeps serving
what it served."""

from __future__ import annotations

import signal
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import pytest

from tests.conftest import SpecRepo
from tests.e2e.test_canary_steps import RUN_FILE
from tests.e2e.test_plnt_up_process import PLNT, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration

POST_FILE = "workflowruns/post-generator.yaml"


def history(up: PlntUp, name: str) -> dict:
    return httpx.get(f"{up.url}/workflows/{name}/history", trust_env=False).json()


def started_at(saga: dict, step: str) -> str:
    return next(s["started_at"] for s in saga["steps"] if s["step"] == step)


def ended_at(saga: dict, step: str) -> str:
    s = next(s for s in saga["steps"] if s["step"] == step)
    return (datetime.fromisoformat(s["started_at"]) + timedelta(milliseconds=s["duration_ms"])).isoformat()


def row(up: PlntUp, name: str) -> dict:
    return next(r for r in up.workflows() or [] if r["name"] == name)


def test_a_dependant_waits_for_its_dependency_and_fails_with_it(spec_repo: SpecRepo, tmp_path: Path,
                                                                started: list[PlntUp]) -> None:
    text = (spec_repo.path / RUN_FILE).read_text()
    spec_repo.write(POST_FILE, text.replace("name: review-responder", "name: post-generator")
                    .replace("review-responder@1.2.0", "post-generator@1.0.0") + "  dependsOn: [review-responder]\n")
    spec_repo.commit("post-generator, after review-responder")
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready("post-generator", timeout=90)
    up.wait_ready()

    # One commit changes both: the plan says the order, and the dependant's install waits for it.
    spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.replace(POST_FILE, "invocations: 10", "invocations: 12")
    spec_repo.commit("both change")
    plan = subprocess.run([*PLNT, "plan", "--repo", str(spec_repo.path), "--base", "HEAD~1", "--head", "HEAD"],
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 0, plan.stderr
    line = next(line for line in plan.stdout.splitlines() if "default/post-generator" in line)
    assert "(after review-responder)" in line, plan.stdout
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    up.wait_ready(timeout=90)
    up.wait_ready("post-generator", timeout=90)
    for _ in range(100):
        post = history(up, "post-generator")
        if post.get("phase") == "Ready" and post["steps"][-1]["step"] == "promote_release":
            break
        time.sleep(0.2)
    review = history(up, "review-responder")
    assert [s["step"] for s in post["steps"]][:2] == ["validate", "wait_for_dependencies"], post["steps"]
    assert started_at(post, "install_release") >= ended_at(review, "promote_release"), (post, review)

    # The dependency rolled back at the next commit: the dependant fails, naming it; its release stays.
    spec_repo.replace(RUN_FILE, "review-responder@1.3.0", "review-responder@1.4.0")
    spec_repo.replace(POST_FILE, "invocations: 12", "invocations: 14")
    spec_repo.commit("1.4.0 (broken) and post-generator")
    httpx.post(f"{up.url}/hooks/git", trust_env=False)
    for _ in range(300):
        failed = row(up, "post-generator")
        if failed["phase"] == "Failed":
            break
        time.sleep(0.2)
    assert failed["phase"] == "Failed", up.why(str(failed))
    assert failed["lastError"].startswith("DependencyFailed: dependsOn: WorkflowRun default/review-responder "
                                          "RolledBack at this commit (smoke test failed"), failed
    assert failed["version"] == "1.0.0" and row(up, "review-responder")["phase"] == "RolledBack"
    post = history(up, "post-generator")
    assert "install_release" not in [s["step"] for s in post["steps"]], "nothing of it was installed"
    up.stop_and_check(signal.SIGTERM)
