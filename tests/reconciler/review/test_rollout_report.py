"""Rollout verdicts as commit statuses (reconciler/review/rollout_report.py).

The description table is pure (statuses built by hand, no fakes needed). The reporter runs against
the DECLARED forge stand-in (tests/forge_standin.py: a real HTTP server checking GitHub's and
GitLab's documented request shapes), not a live forge, with a real StatusStore."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from plnt.core.status import Phase, RolloutMark, WorkflowRunStatus
from plnt.reconciler.review.forge import make_forge
from plnt.reconciler.review.rollout_report import (
    VERIFY_CONTEXT,
    RolloutReporter,
    context_for,
    refusal_reports,
    rollout_reports,
    smoke_summary,
    verdict,
)
from plnt.reconciler.status_store import StatusStore

from tests.forge_standin import ForgeStandin

TOKEN = "s3cr3t-forge-token-QRS"
C1 = "1" * 40
C2 = "2" * 40
BUDGET = {"invocations": 10, "p95BudgetMs": 2500.0, "errorBudgetPercent": 1.0, "ttftBudgetMs": None,
          "tpotBudgetMs": None, "concurrency": 2}
PASSED = {"passed": True, "reason": "smoke test passed: ...",
          "metrics": {"invocations": 10, "errors": 0, "error_percent": 0.0, "p50_ms": 30.1, "p95_ms": 41.2,
                      "max_ms": 50.0, "first_error": None, "ttft_p95_ms": None, "tpot_p95_ms": None}}
FAILED_REASON = "smoke test failed: error rate 100% over budget 1% (10/10 failed (first: HTTP 500: step boom))"


def status(phase: Phase, message: str = "", *, commit: str = C1, **fields: Any) -> WorkflowRunStatus:
    values: dict[str, Any] = dict(namespace="default", name="review-responder", phase=phase, message=message,
                                  attempted_version="1.3.0",
                                  rollout=RolloutMark(commit=commit, phase=phase, message=message, at=0.0))
    values.update(fields)
    return WorkflowRunStatus(**values)


LONG = "Failed: " + "x" * 500


@pytest.mark.parametrize(("st", "expected"), [
    # No saga record: nothing to report (the reconciler's own Pending, a status from before this feature).
    (WorkflowRunStatus(namespace="default", name="review-responder", phase=Phase.READY, version="1.2.0"), None),
    (status(Phase.PENDING, "install: new"), None),
    (status(Phase.DELETING, "removed from the repository; uninstalling"), None),
    (status(Phase.VERIFYING, "verifying 1.3.0"), ("pending", "Verifying: verifying 1.3.0")),
    (status(Phase.VERIFYING, "1.3.0 verified: signed by signer-a@example.com"),
     ("pending", "Verifying: 1.3.0 verified: signed by signer-a@example.com")),
    (status(Phase.DEPLOYING, "installing canary 1.3.0"), ("pending", "Deploying: installing canary 1.3.0")),
    (status(Phase.CANARY, "smoke-testing", traffic_percent=5, smoke_budget=BUDGET),
     ("pending", "Canary 1.3.0 at 5%: smoke test against p95 ≤ 2500 ms, errors ≤ 1%")),
    (status(Phase.CANARY, "smoke-testing", traffic_percent=5),
     ("pending", "Canary 1.3.0 at 5%: smoke test under way")),
    # Live: the running smoke test's numbers so far (status smokeProgress, from its heartbeats).
    (status(Phase.CANARY, "smoke-testing", traffic_percent=5, smoke_budget=BUDGET,
            smoke_progress={"done": 4, "of": 10, "metrics": {"p95_ms": 41.2, "error_percent": 0.0}}),
     ("pending", "Canary 1.3.0 at 5%: 4/10 calls, p95 41 ms ≤ 2500, errors 0% ≤ 1%")),
    (status(Phase.CANARY, "smoke-testing", traffic_percent=5, smoke_budget=BUDGET, smoke_progress={"done": 0, "of": 10}),
     ("pending", "Canary 1.3.0 at 5%: smoke test against p95 ≤ 2500 ms, errors ≤ 1%")),
    # A stepped canary: its place, its numbers so far, its pause.
    (status(Phase.CANARY, "step 2/3: smoke-testing canary 1.3.0 with 25% of traffic", traffic_percent=25,
            canary_step=2, canary_steps=3, smoke_budget=BUDGET,
            smoke_progress={"done": 4, "of": 10, "metrics": {"p95_ms": 41.2, "error_percent": 0.0}}),
     ("pending", "Canary 1.3.0 step 2/3 at 25%: 4/10 calls, p95 41 ms ≤ 2500, errors 0% ≤ 1%")),
    (status(Phase.CANARY, "step 2/3 passed at 25%; pausing 5m before step 3", traffic_percent=25,
            canary_step=2, canary_steps=3, smoke_budget=BUDGET),
     ("pending", "Canary 1.3.0 step 2/3 at 25%: passed, pausing 5m before step 3")),
    # Held for a person (plnt rollout), then what the person did.
    (status(Phase.CANARY, "step 1/2 passed at 20%; waiting for a person before step 2: plnt rollout resume rr "
            "(or promote, abort)", traffic_percent=20, canary_step=1, canary_steps=2, smoke_budget=BUDGET),
     ("pending", "Canary 1.3.0 step 1/2 at 20%: passed, waiting for a person before step 2: plnt rollout resume rr "
                 "(or promote, abort)")),
    (status(Phase.CANARY, "the canary passed; paused by ops before the promotion: plnt rollout resume rr (or "
            "promote, abort)", traffic_percent=5, smoke_budget=BUDGET),
     ("pending", "Canary 1.3.0 at 5%: passed, paused by ops before the promotion: plnt rollout resume rr (or "
                 "promote, abort)")),
    (status(Phase.ROLLED_BACK, "aborted by ops at step 1/2: not today", version="1.2.0", attempted_version="1.3.0"),
     ("failure", "RolledBack 1.3.0 (1.2.0 serving): aborted by ops at step 1/2: not today")),
    (status(Phase.READY, "1.3.0 promoted; promoted by ops at step 1/2, skipping what was left of its steps: hotfix",
            version="1.3.0", smoke_test=PASSED, smoke_budget=BUDGET),
     ("success", "Ready 1.3.0: promoted by ops at step 1/2, skipping what was left of its steps: hotfix")),
    (status(Phase.ROLLED_BACK, "step 2/3 at 25%: " + FAILED_REASON, version="1.2.0", attempted_version="1.4.0"),
     ("failure", "RolledBack 1.4.0 (1.2.0 serving): step 2/3 at 25%: error rate 100% over budget 1% (10/10 failed "
                 "(first: HTTP 500: step boom))")),
    (status(Phase.READY, "1.3.0 promoted; smoke test passed", version="1.3.0", smoke_test=PASSED, smoke_budget=BUDGET),
     ("success", "Ready 1.3.0: p95 41 ms ≤ 2500, errors 0% ≤ 1%")),
    (status(Phase.READY, "1.3.0 promoted", version="1.3.0", smoke_test=PASSED),
     ("success", "Ready 1.3.0: p95 41 ms, errors 0%")),
    (status(Phase.READY, "1.3.0 promoted; smoke test passed", version="1.3.0"),
     ("success", "Ready 1.3.0: 1.3.0 promoted; smoke test passed")),
    (status(Phase.ROLLED_BACK, FAILED_REASON, version="1.2.0", attempted_version="1.4.0"),
     ("failure", "RolledBack 1.4.0 (1.2.0 serving): error rate 100% over budget 1% (10/10 failed (first: HTTP 500: step boom))")),
    (status(Phase.ROLLED_BACK, FAILED_REASON, attempted_version="1.4.0"),
     ("failure", "RolledBack 1.4.0: error rate 100% over budget 1% (10/10 failed (first: HTTP 500: step boom))")),
    (status(Phase.FAILED, "RecipeUntrusted: no\nsignature", attempted_version="1.4.0"),
     ("failure", "Failed 1.4.0: RecipeUntrusted: no signature")),
    # Long reasons pass whole: the forge client truncates to its own limit (see the reporter test).
    (status(Phase.FAILED, LONG), ("failure", "Failed 1.3.0: " + LONG)),
    # Credentials in a reason never reach the forge.
    (status(Phase.FAILED, "cannot pull https://user:hunter2@registry/x"),
     ("failure", "Failed 1.3.0: cannot pull https://***@registry/x")),
])
def test_verdict_table(st: WorkflowRunStatus, expected: tuple[str, str] | None) -> None:
    assert verdict(st) == expected


def test_verdict_follows_the_saga_record_not_later_status_updates() -> None:
    """A RolledBack rollout later marked Ready "in sync" (its commit reverted) or carrying an invalid
    newer commit's error stays a failure on ITS commit: only the saga writes `rollout`."""
    rolled = status(Phase.ROLLED_BACK, FAILED_REASON, version="1.2.0", attempted_version="1.4.0")
    later = rolled.model_copy(update={"phase": Phase.READY, "message": "1.2.0 in sync", "observed_commit": C2,
                                      "last_error": "commit 222 is invalid"})
    assert verdict(later) == verdict(rolled)
    assert list(rollout_reports([later])) == [(C1, "plnt/default/review-responder")]


UNSIGNED = {"commit": C2, "trusted": False, "signer": None, "reason": "unsigned"}


@pytest.mark.parametrize(("source", "expected"), [
    ({}, {}),
    ({"newestCommit": C1, "untrusted": None, "problems": []}, {}),
    ({"newestCommit": C1, "held": {"commit": C1}, "problems": ["commit 111111111111 is held: ..."]}, {}),
    # A merge whose pull request brought an unsigned commit: on the merge and on that commit.
    ({"newestCommit": C1, "untrusted": UNSIGNED, "problems": [f"commit {C2[:12]} is not trusted: unsigned"]},
     {(C1, VERIFY_CONTEXT): ("failure", f"refused: commit {C2[:12]} is not trusted: unsigned"),
      (C2, VERIFY_CONTEXT): ("failure", f"refused: commit {C2[:12]} is not trusted: unsigned")}),
    # The head itself is the untrusted commit: one status.
    ({"newestCommit": C2, "untrusted": UNSIGNED, "problems": []},
     {(C2, VERIFY_CONTEXT): ("failure", f"refused: commit {C2[:12]} is not trusted")}),
])
def test_refusal_reports_table(source: dict[str, Any], expected: dict[tuple[str, str], tuple[str, str]]) -> None:
    assert refusal_reports(source) == expected


def test_smoke_summary_marks_a_measure_over_its_budget() -> None:
    slow = {"metrics": {**PASSED["metrics"], "p95_ms": 3100.0, "error_percent": 20.0, "ttft_p95_ms": 5.25}}
    assert smoke_summary(slow, {**BUDGET, "ttftBudgetMs": 100}) == \
        "p95 3100 ms > 2500, errors 20% > 1%, TTFT p95 5.25 ms ≤ 100"
    assert smoke_summary(None, BUDGET) is None


# --- the reporter against the forge stand-in -----------------------------------------------------------


@pytest.fixture(params=["github", "gitlab"])
def standin(request: pytest.FixtureRequest) -> Iterator[ForgeStandin]:
    project = "group/sub/specs" if request.param == "gitlab" else "owner/specs"
    with ForgeStandin(request.param, project, TOKEN, page_size=3) as s:
        yield s


def posted(s: ForgeStandin, sha: str, context: str) -> list[tuple[str, str]]:
    """(state, description) of every status the stand-in received for (sha, context), in order."""
    key = "context" if s.kind != "gitlab" else "name"
    state = "state" if s.kind != "gitlab" else "status"
    return [(st[state], st["description"]) for st in s.statuses if st["sha"] == sha and st[key] == context]


async def until(check: Any, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def record(store: StatusStore, phase: Phase, message: str, commit: str, **fields: Any) -> None:
    """What PhaseRecorder writes for a saga's phase."""
    store.update("default", "review-responder", phase=phase, message=message, observed_commit=commit,
                 rollout=RolloutMark(commit=commit, phase=phase, message=message, at=time.time()), **fields)


@pytest.mark.integration
async def test_reporter_posts_each_change_in_order_and_coalesces_bursts(
        standin: ForgeStandin, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    store = StatusStore(tmp_path / "status.json")
    calls: list[str] = []
    store.on_change = lambda: calls.append("routes")  # the existing callback keeps working
    forge = make_forge(standin.kind, standin.api_url, standin.project, TOKEN, attempts=1, backoff=0.01)
    reporter = RolloutReporter(forge, store, initial_backoff_s=0.05)
    stop = reporter.attach()
    ctx = context_for("default", "review-responder")
    try:
        # A burst (all before the task runs): coalesced to the newest verdict, one status.
        record(store, Phase.VERIFYING, "verifying 1.2.0", C1, attempted_version="1.2.0")
        record(store, Phase.DEPLOYING, "installing canary 1.2.0", C1)
        record(store, Phase.CANARY, "smoke", C1, traffic_percent=5, smoke_budget=BUDGET)
        assert calls == ["routes"] * 3
        await until(lambda: posted(standin, C1, ctx), "the first status")
        assert posted(standin, C1, ctx) == [("pending", "Canary 1.2.0 at 5%: smoke test against p95 ≤ 2500 ms, errors ≤ 1%")]
        # Written from another thread (on_change is then called there).
        await asyncio.to_thread(record, store, Phase.READY, "1.2.0 promoted", C1, version="1.2.0", smoke_test=PASSED)
        await until(lambda: len(posted(standin, C1, ctx)) == 2, "success")
        # Unrelated status updates (drift messages, "in sync") post nothing more.
        store.update("default", "review-responder", message="1.2.0 in sync", observed_commit=C2)
        await asyncio.sleep(0.3)
        # The next rollout, on its own commit; the first commit keeps its success.
        record(store, Phase.VERIFYING, "verifying 1.4.0", C2, attempted_version="1.4.0")
        await until(lambda: posted(standin, C2, ctx), "pending on the second commit")
        record(store, Phase.DEPLOYING, "installing canary 1.4.0", C2)  # pending -> pending
        await asyncio.sleep(0.3)
        record(store, Phase.ROLLED_BACK, FAILED_REASON + " " + "y" * 300, C2)
        await until(lambda: posted(standin, C2, ctx)[-1:] and posted(standin, C2, ctx)[-1][0] in ("failure", "failed"),
                    "failure on the second commit")
    finally:
        await stop()
        await forge.aclose()
    failed = "failed" if standin.kind == "gitlab" else "failure"
    assert posted(standin, C1, ctx) == [
        ("pending", "Canary 1.2.0 at 5%: smoke test against p95 ≤ 2500 ms, errors ≤ 1%"),
        ("success", "Ready 1.2.0: p95 41 ms ≤ 2500, errors 0% ≤ 1%")]
    second = posted(standin, C2, ctx)
    if standin.kind == "gitlab":  # GitLab refuses pending -> pending: the first pending description stays
        assert [s for s, _ in second] == ["pending", failed]
    else:
        assert second[:2] == [("pending", "Verifying: verifying 1.4.0"), ("pending", "Deploying: installing canary 1.4.0")]
        assert [s for s, _ in second] == ["pending", "pending", failed]
    description = second[-1][1]
    assert description.startswith("RolledBack 1.4.0 (1.2.0 serving): error rate 100% over budget 1%")
    assert len(description) <= forge.description_limit and description.endswith("…")
    # Never the same status twice in a row on one context.
    for sha in (C1, C2):
        seq = posted(standin, sha, ctx)
        assert all(a != b for a, b in zip(seq, seq[1:], strict=False))
    assert TOKEN not in caplog.text
    assert "rollout-status-dropped" not in caplog.text


@pytest.mark.integration
async def test_reporter_retries_an_unavailable_forge_and_survives_a_refusing_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    ctx = context_for("default", "review-responder")
    with ForgeStandin("github", "owner/specs", TOKEN) as s:
        s.fail.extend([(503, {}), (502, {}), (503, {})])  # down for three requests
        store = StatusStore(tmp_path / "status.json")
        forge = make_forge("github", s.api_url, s.project, TOKEN, attempts=1, backoff=0.01)
        reporter = RolloutReporter(forge, store, initial_backoff_s=0.05, max_backoff_s=0.2)
        stop = reporter.attach()
        try:
            record(store, Phase.READY, "1.2.0 promoted", C1, version="1.2.0", attempted_version="1.2.0",
                   smoke_test=PASSED, smoke_budget=BUDGET)
            await until(lambda: posted(s, C1, ctx), "the status after the forge came back")
            assert posted(s, C1, ctx) == [("success", "Ready 1.2.0: p95 41 ms ≤ 2500, errors 0% ≤ 1%")]
            assert "rollout-status-retry" in caplog.text
            # A token without the permission: logged once with what it needs; the reporter goes on.
            s.deny.add("status")
            for i in range(3):
                record(store, Phase.FAILED, f"reason {i}", C2, attempted_version="1.4.0")
                await asyncio.sleep(0.2)
            refusals = [r for r in caplog.records if "rollout-status-dropped" in r.getMessage()]
            assert len(refusals) == 1, [r.getMessage() for r in refusals]
            assert "Commit statuses: write" in refusals[0].getMessage()
            s.deny.clear()
            record(store, Phase.FAILED, "reason final", C2)
            await until(lambda: posted(s, C2, ctx), "a status once the token may post")
            assert posted(s, C2, ctx) == [("failure", "Failed 1.4.0: reason final")]
        finally:
            await stop()
            await forge.aclose()
    assert TOKEN not in caplog.text


@pytest.mark.integration
async def test_a_restarted_reporter_posts_nothing_already_on_the_forge(tmp_path: Path) -> None:
    """Every start re-derives the verdicts from the persisted statuses: what the forge already shows
    is not posted again (the stand-in keeps every status it receives)."""
    ctx = context_for("default", "review-responder")
    with ForgeStandin("github", "owner/specs", TOKEN) as s:
        store = StatusStore(tmp_path / "status.json")
        record(store, Phase.READY, "1.2.0 promoted", C1, version="1.2.0", attempted_version="1.2.0",
               smoke_test=PASSED, smoke_budget=BUDGET)
        for _ in range(2):  # plnt started twice on the same state directory
            forge = make_forge("github", s.api_url, s.project, TOKEN, attempts=1)
            reporter = RolloutReporter(forge, StatusStore(tmp_path / "status.json"))
            stop = reporter.attach()
            await until(lambda r=reporter: r.delivered == 1, "the verdict checked")  # type: ignore[misc]
            await stop()
            await forge.aclose()
        assert posted(s, C1, ctx) == [("success", "Ready 1.2.0: p95 41 ms ≤ 2500, errors 0% ≤ 1%")]
        assert len([r for r in s.requests if r.method == "POST"]) == 1
