"""Which rollout transitions a status change makes (reconciler/review/notify.events_of), as a table."""

from __future__ import annotations

from typing import Any

import pytest
from plnt.core.status import Phase, RolloutMark, WorkflowRunStatus
from plnt.reconciler.review.notify import events_of

C = "c0ffee" * 6 + "c0ff"


def status(phase: Phase, message: str = "", **fields: Any) -> WorkflowRunStatus:
    return WorkflowRunStatus(namespace="default", name="rr", phase=phase, message=message, version="1.2.0",
                             attempted_version="1.3.0", saga_id=fields.pop("saga_id", "s1"),
                             rollout=RolloutMark(commit=C, phase=phase, message=message, at=0.0), **fields)


READY = status(Phase.READY, "1.2.0 in sync")
VERIFYING = status(Phase.VERIFYING, "verifying 1.3.0")
STEP1 = status(Phase.CANARY, "step 1/2: smoke-testing", canary_step=1, canary_steps=2, traffic_percent=10)
STEP1_PROGRESS = status(Phase.CANARY, "step 1/2: smoke-testing", canary_step=1, canary_steps=2, traffic_percent=10,
                        smoke_progress={"done": 3, "of": 10})
WAITING = status(Phase.CANARY, "step 1/2 passed at 10%; waiting for a person before step 2: ...", canary_step=1,
                 canary_steps=2, traffic_percent=10)
PAUSED = status(Phase.CANARY, "step 1/2 passed at 10%; paused by ops before step 2: ...", canary_step=1,
                canary_steps=2, traffic_percent=10)
STEP2 = status(Phase.CANARY, "step 2/2: smoke-testing", canary_step=2, canary_steps=2, traffic_percent=50)
ONE_STEP = status(Phase.CANARY, "smoke-testing canary 1.3.0 with 5% of traffic", traffic_percent=5)


@pytest.mark.parametrize(("old", "new", "kinds"), [
    (READY, VERIFYING, ["started"]),
    (None, VERIFYING, ["started"]),
    (VERIFYING, VERIFYING.model_copy(update={"message": "1.3.0 verified"}), []),
    (status(Phase.ROLLED_BACK, saga_id="s0"), VERIFYING, ["started"]),
    (VERIFYING.model_copy(update={"saga_id": "s0"}), VERIFYING, ["started"]),  # a new saga, same phase
    (status(Phase.DEPLOYING), STEP1, ["step"]),
    (STEP1, STEP1_PROGRESS, []),
    (STEP1, WAITING, ["paused"]),
    (WAITING, WAITING.model_copy(update={"smoke_progress": {"done": 1}}), []),
    (WAITING, PAUSED, []),  # still waiting for a person
    (STEP1, PAUSED, ["paused"]),
    (WAITING, STEP2, ["step"]),
    (status(Phase.DEPLOYING), ONE_STEP, []),
    (STEP2, status(Phase.READY, "1.3.0 promoted; ..."), ["promoted"]),
    (READY, READY.model_copy(update={"message": "1.2.0 in sync again"}), []),
    (STEP1, status(Phase.ROLLED_BACK, "step 1/2 at 10%: smoke test failed", last_error="step 1/2 at 10%: x"),
     ["rolled_back"]),
    (WAITING, status(Phase.ROLLED_BACK, "aborted by ops at step 1/2", last_error="aborted by ops at step 1/2"),
     ["aborted"]),
    (VERIFYING, status(Phase.FAILED, "VerificationFailed: unsigned"), ["failed"]),
    (status(Phase.PENDING), READY, []),  # a first "in sync" with no rollout under way
])
def test_transitions(old: WorkflowRunStatus | None, new: WorkflowRunStatus, kinds: list[str]) -> None:
    assert [e.kind for e in events_of(old, new)] == kinds


def test_an_event_says_what_where_and_which_commit() -> None:
    (event,) = events_of(STEP1, WAITING)
    assert (event.version, event.serving, event.commit, event.step, event.steps, event.weight) == (
        "1.3.0", "1.2.0", C, 1, 2, 10)
    assert event.text() == ("plnt: default/rr 1.3.0 paused (commit c0ffeec0ffee): step 1/2 passed at 10%; waiting "
                            "for a person before step 2: ...")
    (aborted,) = events_of(WAITING, status(Phase.ROLLED_BACK, "x", last_error="aborted by ops at step 1/2: no"))
    assert aborted.message == "aborted by ops at step 1/2: no"
