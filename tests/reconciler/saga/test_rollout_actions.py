"""A person's hand on a running saga (plnt rollout pause|resume|promote|abort): the saga's `act`
update and `rollout` query, through plnt's client functions (saga/rollout.py), on a real Temporal
server. The activities are the FAKES of test_saga.py (a smoke test that takes `smoke_s`, heartbeating):
this is about the saga's control flow; tests/e2e/test_rollout_actions.py runs it end to end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from plnt.core.status import Phase
from plnt.reconciler.app import SAGA_RUNNER
from plnt.reconciler.saga.history import saga_history
from plnt.reconciler.saga.io import CanaryStepPlan, RolloutAction, RolloutState, SagaResult
from plnt.reconciler.saga.rollout import NoRollout, RolloutActionRefused, act_on_rollout, rollout_state
from plnt.reconciler.saga.temporal_server import connect
from plnt.reconciler.saga.workflow import DeploySaga
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tests.reconciler.saga.test_saga import COMMIT, FINGERPRINT, FakeActivities, run_saga

pytestmark = pytest.mark.integration

Handle = WorkflowHandle[Any, SagaResult]


def action(verb: str, *, commit: str = COMMIT, fingerprint: str = FINGERPRINT, reason: str = "") -> RolloutAction:
    return RolloutAction(verb=verb, commit=commit, fingerprint=fingerprint, by="ops@test", reason=reason)  # type: ignore[arg-type]


async def until(client: Client, check: Callable[[RolloutState], bool], what: str, timeout_s: float = 20) -> RolloutState:
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        try:
            state = await rollout_state(client, "default", "rr")
            if check(state):
                return state
        except NoRollout:
            pass
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s:.0f}s; last state: {state}")


def messages(fakes: FakeActivities) -> list[str]:
    return [u.message for u in fakes.updates]


async def accepted_actions(handle: Handle) -> list[str]:
    """The actions the saga's history recorded (updates accepted)."""
    history = await handle.fetch_history()
    return [e.workflow_execution_update_accepted_event_attributes.accepted_request.input.name
            for e in history.events if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]


async def test_a_manual_pause_waits_for_a_person_and_resume_goes_on(temporal_address: str,
                                                                    temporal_namespace: str) -> None:
    steps = [CanaryStepPlan(weight=5, pause_s=0, manual=True), CanaryStepPlan(weight=50, pause_s=0)]
    fakes = FakeActivities(steps=steps)
    client = await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter)
    seen: list[Any] = []

    async def person(handle: Handle) -> None:
        state = await until(client, lambda s: s.waiting_for_person, "the saga waiting for a person")
        assert (state.canary_step, state.canary_steps, state.commit) == (1, 2, COMMIT)
        await asyncio.sleep(0.5)
        assert fakes.traffic_steps == [], "a manual pause holds the next step until a person resumes"
        # Meant for another rollout: refused, not recorded, nothing moves.
        with pytest.raises(RolloutActionRefused, match=r"this rollout is commit c0ffeec0ffee .* names commit aaaaaaaaaaaa"):
            await act_on_rollout(client, "default", "rr", action("resume", commit="a" * 40))
        with pytest.raises(RolloutActionRefused, match="names commit c0ffeec0ffee .spec sha256:eeee"):
            await act_on_rollout(client, "default", "rr", action("resume", fingerprint="sha256:" + "e" * 64))
        seen.append(await act_on_rollout(client, "default", "rr", action("resume", reason="looks good")))
        seen.append(await accepted_actions(handle))

    histories: list[Any] = []
    result = await run_saga(temporal_address, temporal_namespace, fakes, meanwhile=person, histories=histories)
    assert result.phase is Phase.READY, result
    assert fakes.traffic_steps == [2] and fakes.calls["promote_release"] == 1
    assert seen[0] == "resumed (step 1/2)"
    # A worker that restarts (plnt killed while the saga waited for a person) replays the history with
    # the action in it, command for command, under plnt's runner and in the sandbox.
    for runner in (SAGA_RUNNER, SandboxedWorkflowRunner()):
        replayer = Replayer(workflows=[DeploySaga], workflow_runner=runner, data_converter=pydantic_data_converter)
        await replayer.replay_workflow(histories[0])
    assert seen[1] == ["act"], "only the accepted action is in the history"
    assert "step 1/2 passed at 5%; waiting for a person before step 2: plnt rollout resume rr (or promote, abort)" \
        in messages(fakes)
    history = await saga_history(client, "default", "rr")  # what plnt history and the UI's timeline show
    assert [(a.verb, a.by, a.reason) for a in history.actions] == [("resume", "ops@test", "looks good")]


async def test_pause_holds_before_the_next_step_until_resume(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(steps=[CanaryStepPlan(weight=5, pause_s=0), CanaryStepPlan(weight=50, pause_s=0)],
                           smoke_s=1.0)
    client = await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter)

    async def person(handle: Handle) -> None:
        await until(client, lambda s: s.canary_step == 1 and s.step == "smoke_test", "step 1's smoke test")
        with pytest.raises(RolloutActionRefused, match="nothing to resume: the rollout is not paused .step 1/2."):
            await act_on_rollout(client, "default", "rr", action("resume"))
        assert (await act_on_rollout(client, "default", "rr", action("pause"))).startswith("paused")
        with pytest.raises(RolloutActionRefused, match="already paused by ops@test"):
            await act_on_rollout(client, "default", "rr", action("pause"))
        await until(client, lambda s: "paused by" in " ".join(messages(fakes)), "the hold in the status", 10)
        assert "step 1/2 passed at 5%; paused by ops@test before step 2: plnt rollout resume rr (or promote, abort)" \
            in messages(fakes)
        await asyncio.sleep(0.5)
        assert fakes.traffic_steps == [] and fakes.calls["smoke_test"] == 1
        state = await rollout_state(client, "default", "rr")
        assert state.paused_by == "ops@test" and state.actions == ["pause by ops@test"]
        await act_on_rollout(client, "default", "rr", action("resume"))

    result = await run_saga(temporal_address, temporal_namespace, fakes, meanwhile=person)
    assert result.phase is Phase.READY and fakes.traffic_steps == [2] and fakes.calls["smoke_test"] == 2


async def test_abort_cancels_the_smoke_test_and_rolls_back_for_good(temporal_address: str,
                                                                    temporal_namespace: str) -> None:
    fakes = FakeActivities(smoke_s=60.0)  # the one-step canary, a long smoke test
    client = await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter)

    async def person(handle: Handle) -> None:
        await until(client, lambda s: s.step == "smoke_test", "the smoke test under way")
        answer = await act_on_rollout(client, "default", "rr", action("abort", reason="wrong answers"))
        assert answer.startswith("aborting")
        with pytest.raises((RolloutActionRefused, NoRollout), match="already aborting|no rollout"):
            await act_on_rollout(client, "default", "rr", action("promote"))

    started = time.monotonic()
    result = await run_saga(temporal_address, temporal_namespace, fakes, meanwhile=person)
    assert time.monotonic() - started < 30, "abort does not wait for the smoke test to end"
    assert result.phase is Phase.ROLLED_BACK
    assert result.reason == "aborted by ops@test at step 1/1: wrong answers"
    assert fakes.removed == ["canary"] and fakes.calls["promote_release"] == 0
    rolled_back = fakes.updates[-1]
    assert rolled_back.phase is Phase.ROLLED_BACK and rolled_back.fields["last_error"] == result.reason
    with pytest.raises(NoRollout, match="no rollout of default/rr is under way"):
        await rollout_state(client, "default", "rr")
    with pytest.raises(NoRollout):
        await act_on_rollout(client, "default", "rr", action("resume"))


async def test_promote_skips_a_timed_pause_and_the_steps_left(temporal_address: str, temporal_namespace: str) -> None:
    steps = [CanaryStepPlan(weight=5, pause_s=3600), CanaryStepPlan(weight=50, pause_s=0)]
    fakes = FakeActivities(steps=steps)
    client = await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter)

    async def person(handle: Handle) -> None:
        await until(client, lambda s: "pausing 1h" in " ".join(messages(fakes)), "step 1's pause")
        await act_on_rollout(client, "default", "rr", action("promote", reason="hotfix"))

    result = await run_saga(temporal_address, temporal_namespace, fakes, meanwhile=person)
    assert result.phase is Phase.READY
    assert result.reason == ("1.0.0 promoted; promoted by ops@test at step 1/2, skipping what was left of its "
                             "steps: hotfix")
    assert fakes.traffic_steps == [] and fakes.calls["smoke_test"] == 1 and fakes.calls["promote_release"] == 1


async def test_resume_ends_a_timed_pause_early(temporal_address: str, temporal_namespace: str) -> None:
    steps = [CanaryStepPlan(weight=5, pause_s=3600), CanaryStepPlan(weight=50, pause_s=0)]
    fakes = FakeActivities(steps=steps)
    client = await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter)

    async def person(handle: Handle) -> None:
        await until(client, lambda s: "pausing 1h" in " ".join(messages(fakes)), "step 1's pause")
        await act_on_rollout(client, "default", "rr", action("resume"))

    result = await run_saga(temporal_address, temporal_namespace, fakes, meanwhile=person)
    assert result.phase is Phase.READY and fakes.traffic_steps == [2] and fakes.calls["smoke_test"] == 2
