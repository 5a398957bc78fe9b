"""The GitOps verbs on the embedded default, as a user runs them: `plnt up` in its own process
(embedded Temporal, real runner processes), and `plnt list`, `plnt run`, `plnt scale` and
`plnt rollback` as console commands against it and its spec repository (a local git repository
here; the pull-request path against a real Gitea is tests/forge/test_verbs_pull_requests.py).

The runners' model is MockBackend, a STAND-IN for a model server; recipes are signed by test
authorities (tests/sigstore_ca.py), STAND-INS for Sigstore's public services."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GIT_ENV, SpecRepo
from tests.e2e.test_plnt_up_process import PLNT, REVIEW, PlntUp, gateway_port
from tests.e2e.test_plnt_up_process import started as started  # noqa: F401 (the fixture: plnt processes killed after the test)

pytestmark = pytest.mark.integration


def plnt(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    # A person's git identity (the verbs that commit use it), and nothing else of theirs.
    return subprocess.run([*PLNT, *args], capture_output=True, text=True, timeout=120, input=stdin, check=False,
                          env={**os.environ, **GIT_ENV})


def wait_row(up: PlntUp, check: Any, what: str, timeout: float = 90.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    rows = None
    while time.monotonic() < deadline:
        assert up.process.poll() is None, up.why(f"plnt exited ({up.process.returncode})")
        for row in (rows := up.workflows()) or []:
            if row["name"] == "review-responder" and check(row):
                return row
        time.sleep(0.2)
    raise AssertionError(up.why(f"timed out after {timeout:.0f}s waiting for {what}; GET /workflows: {rows}"))


# A second workflow, whose output step streams its tokens (an llm.generate), with room for two runners.
TREND_MONITOR = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata:
  name: trend-monitor
spec:
  workflow:
    ref: trend-monitor@1.0.0
    registry: file:registry
  backend:
    cluster: local
  replicas: {min: 1, max: 2}
"""
POSTS = "the app is down again, so annoying\nlove the new dark mode @acme #darkmode"


def test_list_and_run_on_plnt_up(spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    spec_repo.write("workflowruns/trend-monitor.yaml", TREND_MONITOR)
    spec_repo.commit("trend-monitor")
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    up.wait_ready("trend-monitor")

    # plnt list: the table, one line per resource, and the JSON rows of GET /workflows.
    listed = plnt("list", "--url", up.url)
    assert listed.returncode == 0, up.why(listed.stderr)
    header, *lines = listed.stdout.splitlines()
    assert header.split() == ["KIND", "NAMESPACE/NAME", "PHASE", "STABLE", "CANARY", "BACKEND", "REPLICAS"]
    assert [line.split() for line in lines] == [
        ["WorkflowRun", "default/review-responder", "Ready", "1.2.0", "-", "local", "1/1", "(1)"],
        ["WorkflowRun", "default/trend-monitor", "Ready", "1.0.0", "-", "local", "1/1", "(1-2)"]], listed.stdout
    as_json = plnt("list", "-o", "json", "--url", up.url)
    row = {r["name"]: r for r in json.loads(as_json.stdout)}["review-responder"]
    assert (row["kind"], row["backend"], row["replicas"]) == ("WorkflowRun", "local", {"min": 1, "max": 1}), row
    bad = plnt("list", "-o", "yaml", "--url", up.url)
    assert bad.returncode == 2 and "--output must be table or json" in bad.stderr, bad.stderr

    # plnt run: inputs from the command line; the answer on stdout, what served it on stderr.
    ran = plnt("run", "review-responder", "--input", f"review={REVIEW['review']}", "--input",
               f"brand_voice={REVIEW['brand_voice']}", "--url", up.url)
    assert ran.returncode == 0, up.why(ran.stderr)
    assert "parking" in json.loads(ran.stdout)["reply"], ran.stdout
    assert ran.stderr == "served by review-responder 1.2.0 (stable)\n", ran.stderr  # its output step streams nothing
    # A workflow whose output step streams: its tokens on stderr as they came, then the answer.
    trend = plnt("run", "trend-monitor", "-i", f"posts={POSTS}", "--url", up.url)
    assert trend.returncode == 0, up.why(trend.stderr)
    summary = json.loads(trend.stdout)["summary"]
    *tokens, served = trend.stderr.splitlines()
    assert served == "served by trend-monitor 1.0.0 (stable)", trend.stderr
    assert summary and "\n".join(tokens).strip() == summary.strip(), trend.stderr

    # The same from a file (stdin), not streamed, the whole answer as JSON; --input wins over the file.
    whole = plnt("run", "review-responder", "--input-file", "-", "--input", "brand_voice=curt", "--no-stream",
                 "--json", "--url", up.url, stdin=json.dumps({**REVIEW, "brand_voice": "ignored"}))
    assert whole.returncode == 0, up.why(whole.stderr)
    body = json.loads(whole.stdout)
    assert body["version"] == "1.2.0" and "parking" in body["output"]["reply"], body

    # Clear errors, and exit codes that say what next.
    unknown = plnt("run", "no-such-workflow", "--input", "a=b", "--url", up.url)
    assert unknown.returncode == 1 and unknown.stderr.startswith("error: no-such-workflow: not_found"), unknown.stderr
    no_canary = plnt("run", "review-responder", "--input", "review=x", "--input", "brand_voice=y", "--track", "canary",
                     "--url", up.url)
    assert no_canary.returncode == 1 and "no_canary" in no_canary.stderr, no_canary.stderr
    missing = plnt("run", "review-responder", "--input", "review=only this", "--url", up.url)
    assert missing.returncode == 1 and "brand_voice" in missing.stderr, missing.stderr
    bad_input = plnt("run", "review-responder", "--input", "review", "--url", up.url)
    assert bad_input.returncode == 2 and "give KEY=VALUE" in bad_input.stderr, bad_input.stderr
    nobody = plnt("run", "review-responder", "--input", "a=b", "--url", "http://127.0.0.1:9")
    assert nobody.returncode == 2 and "no plnt answers" in nobody.stderr, nobody.stderr


def test_scale_and_rollback_committed_to_the_tracked_branch(spec_repo: SpecRepo, tmp_path: Path,
                                                            started: list[PlntUp]) -> None:
    """--commit-to-branch, where the repository takes direct pushes (this one: a local repository whose
    checked-out main accepts them): the commit lands on main, plnt rolls it out like any other."""
    # As git leaves a checkout, its checked-out main refuses a push: the error says what to set.
    refused = plnt("scale", "review-responder", "--replicas", "2", "--repo", str(spec_repo.path), "--commit-to-branch")
    assert refused.returncode == 3 and "git config receive.denyCurrentBranch updateInstead" in refused.stderr, \
        refused.stderr
    spec_repo.git("config", "receive.denyCurrentBranch", "updateInstead")
    up = PlntUp(spec_repo.path, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    repo = ("--repo", str(spec_repo.path))
    run_file = spec_repo.path / "workflowruns/review-responder.yaml"
    before = run_file.read_text()

    # Nothing is done without a way to propose it, nor for a name the specs do not hold.
    no_forge = plnt("scale", "review-responder", "--replicas", "2", *repo)
    assert no_forge.returncode == 2 and "a pull request needs --forge" in no_forge.stderr, no_forge.stderr
    unknown = plnt("scale", "no-such", "--replicas", "2", *repo, "--commit-to-branch")
    assert unknown.returncode == 1 and "no WorkflowRun or ModelDeployment default/no-such" in unknown.stderr, \
        unknown.stderr

    scaled = plnt("scale", "review-responder", "--replicas", "2", *repo, "--commit-to-branch")
    assert scaled.returncode == 0, up.why(scaled.stderr)
    assert "committed" in scaled.stdout and "to main" in scaled.stdout, scaled.stdout
    # One line changed in the file, its comments kept; the commit says who asked.
    assert run_file.read_text() == before.replace("replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    assert "plnt scale" in spec_repo.git("log", "-1", "--format=%B")
    wait_row(up, lambda row: row["replicas"] == {"min": 2, "max": 2} and row["phase"] == "Ready",
             "the two replicas rolled out")
    again = plnt("scale", "review-responder", "--replicas", "2", *repo, "--commit-to-branch")
    assert again.returncode == 1 and "nothing to scale" in again.stderr, again.stderr

    # A new version promoted, then rolled back to the one before it, which plnt's rollouts know.
    spec_repo.replace("workflowruns/review-responder.yaml", "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.commit("review-responder 1.3.0")
    wait_row(up, lambda row: row["version"] == "1.3.0" and row["phase"] == "Ready", "1.3.0 promoted", timeout=120)
    never = plnt("rollback", "review-responder", "--to", "1.5.0", "--url", up.url, *repo, "--commit-to-branch")
    assert never.returncode == 1 and "plnt never promoted 1.5.0" in never.stderr, never.stderr
    rolled = plnt("rollback", "review-responder", "--url", up.url, *repo, "--commit-to-branch")
    assert rolled.returncode == 0, up.why(rolled.stderr)
    assert "roll default/review-responder back to 1.2.0 (from 1.3.0)" in rolled.stdout, rolled.stdout
    assert "review-responder@1.2.0" in run_file.read_text()
    row = wait_row(up, lambda row: row["version"] == "1.2.0" and row["phase"] == "Ready", "1.2.0 rolled back to",
                   timeout=120)
    assert row["replicas"] == {"min": 2, "max": 2}, row  # a rollback changes the release, nothing else
    ran = plnt("run", "review-responder", "--input", "review=slow parking", "--input", "brand_voice=warm",
               "--url", up.url)
    assert ran.returncode == 0 and ran.stderr.endswith("served by review-responder 1.2.0 (stable)\n"), ran.stderr


def test_an_emergency_rollback_pins_at_once_and_shows_drift_until_its_commit_lands(
        spec_repo: SpecRepo, tmp_path: Path, started: list[PlntUp]) -> None:
    """`plnt rollback --now`: the stable release goes back to 1.2.0 at once (promoted once installed, no
    smoke test), held against newer commits and shown as drift, while the rollback waits as a pull request
    (on the DECLARED stand-in of GitHub's API, tests/forge_standin.py); the commit landing releases the pin."""
    from tests.forge_standin import ForgeStandin

    bare = tmp_path / "specs.git"  # the repository as the forge holds it; spec_repo is the author's clone
    spec_repo.git("clone", "-q", "--bare", str(spec_repo.path), str(bare))
    spec_repo.git("remote", "add", "origin", str(bare))
    up = PlntUp(bare, tmp_path / "state", gateway_port(), tmp_path / "plnt.log")
    started.append(up)
    up.wait_ready()
    spec_repo.replace("workflowruns/review-responder.yaml", "review-responder@1.2.0", "review-responder@1.3.0")
    spec_repo.commit("review-responder 1.3.0")
    spec_repo.git("push", "-q", "origin", "main")
    wait_row(up, lambda row: row["version"] == "1.3.0" and row["phase"] == "Ready", "1.3.0 promoted", timeout=120)

    token = tmp_path / "forge-token"
    token.write_text("a-forge-token\n")
    with ForgeStandin("github", "platform/specs", "a-forge-token") as forge:
        rolled = plnt("rollback", "review-responder", "--to", "1.2.0", "--now", "--reason", "1.3.0 answers rudely",
                      "--url", up.url, "--repo", str(bare), "--forge", "github", "--forge-api-url", forge.api_url,
                      "--forge-project", forge.project, "--forge-token-file", str(token))
        assert rolled.returncode == 0, up.why(rolled.stderr)
        assert "pinning default/review-responder to 1.2.0" in rolled.stderr, rolled.stderr
        [pull] = forge.pulls.values()
        assert pull["head"] == "plnt/rollback-review-responder-1.2.0", pull
    pinned = wait_row(up, lambda row: row["version"] == "1.2.0" and row["phase"] == "Ready", "the pin promoted")
    assert pinned["pin"]["version"] == "1.2.0" and pinned["pin"]["reason"] == "1.3.0 answers rudely", pinned
    history = plnt("history", "review-responder", "--url", up.url)
    assert "smoke_test" not in history.stdout, history.stdout  # promoted at once, as the saga's result says
    assert "1.2.0 promoted; pinned by " in history.stdout and "without a smoke test: 1.3.0 answers rudely" in \
        history.stdout, history.stdout

    # A newer commit that still names 1.3.0: held, shown as drift, nothing deployed.
    spec_repo.replace("workflowruns/review-responder.yaml", "invocations: 10", "invocations: 12")
    spec_repo.commit("a longer smoke test")
    spec_repo.git("push", "-q", "origin", "main")
    drift = "drift: pinned by a person"
    held = wait_row(up, lambda row: row["observedCommit"] == spec_repo.git("rev-parse", "HEAD")
                    and row["message"].startswith(drift), "the newer commit held as drift")
    assert held["version"] == "1.2.0" and "until the commit lands" in held["message"], held
    status = plnt("status", "--url", up.url)
    assert drift in status.stdout, status.stdout
    listed = plnt("list", "--url", up.url)
    assert listed.stdout.splitlines()[1].split()[3] == "1.2.0(pinned)", listed.stdout

    # The pull request merged: the commit naming 1.2.0 lands, the pin is released, plnt follows git again.
    spec_repo.git("fetch", "-q", "origin")
    spec_repo.git("merge", "-q", "--no-edit", "origin/plnt/rollback-review-responder-1.2.0")
    spec_repo.git("push", "-q", "origin", "main")
    released = wait_row(up, lambda row: row["pin"] is None and row["phase"] == "Ready"
                        and row["observedCommit"] == spec_repo.git("rev-parse", "HEAD"), "the pin released",
                        timeout=120)
    assert released["version"] == "1.2.0", released
