"""The deploy saga on a real Temporal server.

The activities in the first half are FAKES registered under the real activity names (the pattern of
Temporal's samples): they let these tests drive the saga's control flow (retries, dead ends,
compensation, refusals) without runner processes. The second half runs the REAL activities (with
Temporal's ActivityEnvironment, a real git repository and plnt's own clone of it); they are also
exercised end to end in tests/e2e and tests/attacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.loader import load_directory
from plnt.core.status import Phase
from plnt.reconciler.app import SAGA_RUNNER
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.saga import progress as saga_progress
from plnt.reconciler.saga.activities import SagaActivities
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.saga.io import (
    CanaryStepInput,
    CanaryStepPlan,
    GateInput,
    GateResults,
    GateVerdict,
    InstallInput,
    PhaseUpdate,
    PulledRecipeInfo,
    Release,
    ReleaseRef,
    SagaInput,
    SagaRef,
    SagaResult,
    SmokeInput,
    ValidatedSpec,
    ValidateInput,
)
from plnt.reconciler.saga.smoke import SmokeMetrics, SmokeResult
from plnt.reconciler.saga.temporal_server import connect
from plnt.reconciler.saga.workflow import DeploySaga
from plnt.reconciler.settings import RetrySettings
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.state import StateDir
from plnt.reconciler.status_store import StatusStore
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Replayer, Worker, WorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tests.conftest import SpecRepo
from tests.fake_driver import FakeDriver

pytestmark = pytest.mark.integration

COMMIT = "c0ffee" * 6 + "c0ff"
FINGERPRINT = "sha256:" + "f" * 64
FAST_RETRY = RetrySettings(initial_interval_s=0.05, maximum_interval_s=0.1, maximum_attempts=3)


class FakeActivities:
    """Fake activities: record calls; `fail` maps an activity name to the error it raises."""

    def __init__(self, fail: dict[str, Exception] | None = None, smoke_passes: bool | list[bool] = True,
                 steps: list[CanaryStepPlan] | None = None, smoke_s: float = 0.0,
                 gate_verdicts: list[list[GateVerdict]] | None = None) -> None:
        """smoke_passes: one verdict for every smoke test, or one per smoke test in turn; steps: the
        canary steps validate reads (a stepped canary), none: the one-step form; smoke_s: how long
        each smoke test takes (heartbeating, so it can be cancelled); gate_verdicts: what check_gates
        answers, one list per call in turn."""
        self.calls: Counter[str] = Counter()
        self.phases: list[Phase | None] = []
        self.updates: list[PhaseUpdate] = []  # progress and outcomes, with their messages
        self.removed: list[str] = []
        self.traffic_steps: list[int] = []  # set_canary_traffic's steps, in order
        self.fail = fail or {}
        self.smoke_passes = smoke_passes
        self.steps = steps or []
        self.smoke_s = smoke_s
        self.smoke_cancelled = 0
        self.gate_verdicts = gate_verdicts or []
        self.gated_steps: list[int] = []

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.fail:
            raise self.fail[name]

    def all(self) -> list[Any]:
        @activity.defn(name="record_phase")
        async def record_phase(update: PhaseUpdate) -> None:
            self.phases.append(update.phase)
            self.updates.append(update)

        @activity.defn(name="validate")
        async def validate(request: ValidateInput) -> ValidatedSpec:
            self._enter("validate")
            return ValidatedSpec(backend_type="local", version="1.0.0", traffic_percent=5, spec={},
                                 canary_steps=self.steps)

        @activity.defn(name="pull_recipe")
        async def pull_recipe(request: Any) -> PulledRecipeInfo:
            self._enter("pull_recipe")
            return PulledRecipeInfo(digest="sha256:x", version="1.0.0", signer="release@test")

        @activity.defn(name="install_release")
        async def install_release(request: Any) -> Release:
            self._enter("install_release")
            return Release(release_id="r", namespace="default", name="rr", track="canary", version="1.0.0",
                           spec_fingerprint="f", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")

        @activity.defn(name="smoke_test")
        async def smoke_test(request: Any) -> SmokeResult:
            self._enter("smoke_test")
            until = time.monotonic() + self.smoke_s
            try:
                while time.monotonic() < until:
                    activity.heartbeat()
                    await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.smoke_cancelled += 1
                raise
            metrics = SmokeMetrics(invocations=1, errors=0, error_percent=0, p50_ms=1, p95_ms=1, max_ms=1)
            verdicts = self.smoke_passes
            passed = verdicts if isinstance(verdicts, bool) else verdicts[self.calls["smoke_test"] - 1]
            return SmokeResult(passed=passed, reason="fake verdict", metrics=metrics)

        @activity.defn(name="set_canary_traffic")
        async def set_canary_traffic(request: CanaryStepInput) -> Release:
            self._enter("set_canary_traffic")
            self.traffic_steps.append(request.step)
            return Release(release_id="r", namespace="default", name="rr", track="canary", version="1.0.0",
                           spec_fingerprint="f", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1",
                           traffic_percent=self.steps[request.step - 1].weight)

        @activity.defn(name="check_gates")
        async def check_gates(request: GateInput) -> GateResults:
            self._enter("check_gates")
            self.gated_steps.append(request.step)
            return GateResults(verdicts=self.gate_verdicts[self.calls["check_gates"] - 1])

        @activity.defn(name="promote_release")
        async def promote_release(request: ReleaseRef) -> Release:
            self._enter("promote_release")
            return Release(release_id="r", namespace="default", name="rr", track="stable", version="1.0.0",
                           spec_fingerprint="f", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")

        @activity.defn(name="remove_release")
        async def remove_release(request: ReleaseRef) -> None:
            self.removed.append(request.track)
            self._enter("remove_release")

        return [record_phase, validate, pull_recipe, install_release, smoke_test, set_canary_traffic, check_gates,
                promote_release, remove_release]


async def run_saga(address: str, namespace: str, fakes: FakeActivities, action: str = "deploy",
                   raw: dict[str, Any] | None = None, workflow_id: str | None = None,
                   runner: WorkflowRunner | None = None, histories: list[Any] | None = None,
                   progress_sink: bool = True,
                   meanwhile: Callable[[WorkflowHandle[Any, SagaResult]], Awaitable[None]] | None = None) -> SagaResult:
    """Runs DeploySaga on a fresh task queue; `raw` replaces the input with any JSON (a forged one).

    In Temporal's sandbox unless `runner` says otherwise: plnt's own workers run the saga without it
    (SAGA_RUNNER), so these tests are where a non-deterministic call in the saga is caught. The saga's
    history is appended to `histories` when given. Its progress statuses go to `fakes.phases` beside
    its outcomes (record_phase), as plnt's PhaseRecorder takes both; `progress_sink=False` registers
    no sink. `meanwhile(handle)` runs while the saga runs (a person's actions on it).
    """
    client = await connect(address, namespace, data_converter=pydantic_data_converter)
    queue = f"q-{uuid.uuid4().hex}"
    saga = SagaInput(action=action, namespace="default", name="rr", commit=COMMIT,
                     fingerprint=FINGERPRINT if action == "deploy" else None,
                     version="1.0.0" if action == "deploy" else None, retry=FAST_RETRY)
    def sink(update: PhaseUpdate) -> None:
        fakes.phases.append(update.phase)
        fakes.updates.append(update)

    unregister = saga_progress.register(namespace, queue, sink, asyncio.get_running_loop()) if progress_sink else None
    # Any exception fails the saga here: a bug (a call the sandbox refuses, say) ends the test at once
    # instead of retrying its workflow task until the test times out.
    async with Worker(client, task_queue=queue, workflows=[DeploySaga], activities=fakes.all(),
                      workflow_runner=runner or SandboxedWorkflowRunner(), workflow_failure_exception_types=[Exception]):
        handle = await client.start_workflow("DeploySaga", saga if raw is None else raw,
                                             id=workflow_id or saga.workflow_id,
                                             task_queue=queue, result_type=SagaResult)
        try:
            if meanwhile is not None:
                await meanwhile(handle)
            return await handle.result()
        finally:
            if histories is not None:
                histories.append(await handle.fetch_history())
            if unregister is not None:
                await unregister()


async def test_happy_path_walks_every_phase(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities()
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY
    # Verifying twice: before the pull, then with who signed the recipe.
    assert fakes.phases == [Phase.VERIFYING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, Phase.READY]
    assert fakes.removed == []


@pytest.mark.parametrize("smoke_passes", [True, False], ids=["promoted", "rolled-back"])
async def test_the_saga_plnt_runs_unsandboxed_replays_in_the_sandbox_and_back(
        temporal_address: str, temporal_namespace: str, smoke_passes: bool) -> None:
    """plnt's workers run DeploySaga outside the sandbox (SAGA_RUNNER). Its history replays command for
    command inside the sandbox, which refuses a non-deterministic call, and a sandboxed run's history
    replays under plnt's runner: the two runners make the same saga."""
    histories: list[Any] = []
    plnt_run = await run_saga(temporal_address, temporal_namespace, FakeActivities(smoke_passes=smoke_passes),
                              runner=SAGA_RUNNER, histories=histories)
    sandboxed_run = await run_saga(temporal_address, temporal_namespace, FakeActivities(smoke_passes=smoke_passes),
                                   histories=histories)
    assert plnt_run == sandboxed_run
    assert plnt_run.phase is (Phase.READY if smoke_passes else Phase.ROLLED_BACK)
    plnt_history, sandboxed_history = histories
    # Markers of the status writes, the steps scheduled, and the end: a history worth replaying.
    assert len(plnt_history.events) > 20
    for history, runner in ((plnt_history, SandboxedWorkflowRunner()), (sandboxed_history, SAGA_RUNNER)):
        replayer = Replayer(workflows=[DeploySaga], workflow_runner=runner, data_converter=pydantic_data_converter)
        await replayer.replay_workflow(history)  # raises on any difference


HISTORIES = Path(__file__).parent / "histories"


def status_writes(history: WorkflowHistory) -> list[str]:
    """The markers a saga's history holds: a local activity's (record_phase) or a patch's."""
    kinds = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            name = event.marker_recorded_event_attributes.marker_name
            kinds.append({"core_patch": "patch", "core_local_activity": "local-activity"}.get(name, name))
    return kinds


async def test_progress_comes_from_the_saga_and_only_the_outcome_is_a_local_activity(
        temporal_address: str, temporal_namespace: str) -> None:
    """Verifying, Deploying and Canary cost no local activity (two workflow activations and a history
    marker each); the outcome does: it must be on disk before the saga ends."""
    histories: list[Any] = []
    for smoke_passes in (True, False):
        fakes = FakeActivities(smoke_passes=smoke_passes)
        await run_saga(temporal_address, temporal_namespace, fakes, runner=SAGA_RUNNER, histories=histories)
        outcome = Phase.READY if smoke_passes else Phase.ROLLED_BACK
        assert fakes.phases == [Phase.VERIFYING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, outcome]
    for history in histories:
        assert status_writes(history) == ["patch", "local-activity"]


async def test_replayed_progress_is_not_reported_again(temporal_address: str, temporal_namespace: str) -> None:
    """A worker that replays a saga's history (after a restart, or when its cache evicted the saga)
    reports none of the progress the saga reported when it ran: it would set the status back."""
    histories: list[Any] = []
    await run_saga(temporal_address, temporal_namespace, FakeActivities(), runner=SAGA_RUNNER, histories=histories)
    (history,) = histories
    queue = history.events[0].workflow_execution_started_event_attributes.task_queue.name
    reported: list[str] = []
    marker_arrived = asyncio.Event()

    def sink(update: PhaseUpdate) -> None:
        reported.append(update.name)
        if update.name == "marker":
            marker_arrived.set()

    replayer = Replayer(workflows=[DeploySaga], workflow_runner=SAGA_RUNNER, data_converter=pydantic_data_converter)
    namespace = replayer.config()["namespace"]
    unregister = saga_progress.register(namespace, queue, sink, asyncio.get_running_loop())
    try:
        await replayer.replay_workflow(history)
        # Reports reach this loop in the order they were made: once a marker reported after the
        # replay has arrived, any report the replay made would have arrived before it.
        saga_progress.report(namespace, queue, PhaseUpdate(namespace="default", name="marker"))
        await asyncio.wait_for(marker_arrived.wait(), 10)
    finally:
        await unregister()
    assert reported == ["marker"]


async def test_without_a_progress_sink_the_saga_still_writes_its_outcome(
        temporal_address: str, temporal_namespace: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    fakes = FakeActivities()
    result = await run_saga(temporal_address, temporal_namespace, fakes, runner=SAGA_RUNNER, progress_sink=False)
    assert result.phase is Phase.READY
    assert fakes.phases == [Phase.READY]
    assert "no progress sink in this process" in caplog.text


async def test_one_progress_sink_per_task_queue_in_a_process() -> None:
    unregister = saga_progress.register("default", "q-one", lambda update: None, asyncio.get_running_loop())
    try:
        with pytest.raises(ValueError, match="already reports progress for task queue 'q-one'"):
            saga_progress.register("default", "q-one", lambda update: None, asyncio.get_running_loop())
    finally:
        await unregister()
    await saga_progress.register("default", "q-one", lambda update: None, asyncio.get_running_loop())()


@pytest.mark.parametrize("path", sorted(HISTORIES.glob("deploy-saga-*.json")), ids=lambda path: path.stem)
async def test_a_saga_recorded_before_progress_from_the_saga_replays(path: Path) -> None:
    """Sagas that were running when plnt was upgraded go on under the new code: a history recorded by
    the code before (a local activity per status write, no patch marker) replays under plnt's runner
    and in the sandbox. (Recorded from f72a08d by running these tests' sagas under SAGA_RUNNER.)"""
    history = WorkflowHistory.from_json("plnt-default-rr", json.loads(path.read_text()))
    assert "patch" not in status_writes(history) and status_writes(history).count("local-activity") >= 2
    for runner in (SAGA_RUNNER, SandboxedWorkflowRunner()):
        replayer = Replayer(workflows=[DeploySaga], workflow_runner=runner, data_converter=pydantic_data_converter)
        await replayer.replay_workflow(history)  # raises on any difference


STEPS = [CanaryStepPlan(weight=5, pause_s=0), CanaryStepPlan(weight=25, pause_s=1.0), CanaryStepPlan(weight=50, pause_s=0)]


async def test_a_stepped_canary_goes_through_each_step_then_promotes(temporal_address: str,
                                                                    temporal_namespace: str) -> None:
    fakes = FakeActivities(steps=STEPS)
    started = time.monotonic()
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY
    assert time.monotonic() - started >= 1.0, "step 2's pause is a timer the saga waits on"
    assert fakes.calls["smoke_test"] == 3 and fakes.traffic_steps == [2, 3] and fakes.calls["promote_release"] == 1
    canary = [(u.fields.get("canary_step"), u.fields.get("traffic_percent"), u.message) for u in fakes.updates
              if u.phase is Phase.CANARY]
    assert canary == [
        (1, 5, "step 1/3: smoke-testing canary 1.0.0 with 5% of traffic"),
        (2, 25, "step 2/3: smoke-testing canary 1.0.0 with 25% of traffic"),
        (None, None, "step 2/3 passed at 25%; pausing 1s before step 3"),
        (3, 50, "step 3/3: smoke-testing canary 1.0.0 with 50% of traffic"),
    ]
    ready = fakes.updates[-1]
    assert ready.phase is Phase.READY and (ready.fields["canary_step"], ready.fields["canary_steps"]) == (None, None)


async def test_a_failed_step_rolls_back_from_where_it_was(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(steps=STEPS, smoke_passes=[True, False, True])
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.ROLLED_BACK
    assert result.reason == "step 2/3 at 25%: fake verdict"
    assert fakes.traffic_steps == [2] and fakes.calls["promote_release"] == 0 and fakes.removed == ["canary"]


async def test_failed_smoke_test_rolls_back(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(smoke_passes=False)
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.ROLLED_BACK and result.reason == "fake verdict"
    assert fakes.removed == ["canary"] and fakes.calls["promote_release"] == 0


async def test_dead_end_is_not_retried_and_compensates(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"validate": ApplicationError("no backend 'x'", type="UnknownBackend", non_retryable=True)})
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.FAILED
    assert result.reason == "UnknownBackend: no backend 'x'"
    assert fakes.calls["validate"] == 1
    assert fakes.calls["install_release"] == 0


async def test_transient_failure_is_retried_up_to_the_limit(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"install_release": ApplicationError("port taken", type="DriverError")})
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.FAILED and "DriverError: port taken" in result.reason
    assert fakes.calls["install_release"] == 3
    assert fakes.removed == ["canary"]


async def test_compensation_that_fails_never_fails_the_saga(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"smoke_test": ApplicationError("boom", type="Boom", non_retryable=True),
                                 "remove_release": ApplicationError("cannot remove", type="DriverError")})
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.FAILED and "Boom: boom" in result.reason
    assert fakes.phases[-1] is Phase.FAILED



async def test_plnt_up_log_formatter_does_not_break_a_saga_that_logs(temporal_address: str, temporal_namespace: str) -> None:
    """`plnt up` puts its redacting formatter on the root handlers; the saga's compensation warning
    (logged inside Temporal's workflow sandbox) must format without importing anything there, or the
    workflow task fails and the saga never ends (the formatter once imported git lazily)."""
    import logging

    from plnt.reconciler.cli.common import RedactingFormatter

    records: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler = Collect()
    handler.setFormatter(RedactingFormatter("%(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        fakes = FakeActivities(fail={"smoke_test": ApplicationError("boom", type="Boom", non_retryable=True),
                                     "remove_release": ApplicationError("cannot remove", type="DriverError")})
        result = await run_saga(temporal_address, temporal_namespace, fakes)
    finally:
        root.removeHandler(handler)
    assert result.phase is Phase.FAILED and "Boom: boom" in result.reason
    assert any("compensation failed" in line for line in records), records[-5:]

async def test_uninstall_removes_both_tracks_and_the_status(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities()
    result = await run_saga(temporal_address, temporal_namespace, fakes, action="uninstall")
    assert fakes.removed == ["canary", "stable"]
    assert fakes.phases == [Phase.DELETING, None]
    assert result.reason == "uninstalled"


async def test_a_refused_saga_writes_no_status_and_compensates_nothing(temporal_address: str,
                                                                      temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"validate": ApplicationError("commit c0ffeec0ffee is not on branch 'main'",
                                                              type="UntrustedSagaInput", non_retryable=True)})
    with pytest.raises(WorkflowFailureError) as caught:
        await run_saga(temporal_address, temporal_namespace, fakes)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UntrustedSagaInput"
    assert cause.message == "refused: commit c0ffeec0ffee is not on branch 'main'"
    assert fakes.phases == [] and fakes.removed == [] and fakes.calls["pull_recipe"] == 0


async def test_a_refusal_after_validate_compensates_and_fails_like_any_other(temporal_address: str,
                                                                              temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"smoke_test": ApplicationError("commit c0ffeec0ffee is not on branch 'main'",
                                                                type="UntrustedSagaInput", non_retryable=True)})
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.FAILED and result.reason == "UntrustedSagaInput: commit c0ffeec0ffee is not on branch 'main'"
    assert fakes.removed == ["canary"] and fakes.phases[-1] is Phase.FAILED


async def test_a_refused_uninstall_writes_no_status(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(fail={"remove_release": ApplicationError("WorkflowRun default/rr is still in commit x",
                                                                    type="UntrustedSagaInput", non_retryable=True)})
    with pytest.raises(WorkflowFailureError) as caught:
        await run_saga(temporal_address, temporal_namespace, fakes, action="uninstall")
    assert "refused: WorkflowRun default/rr is still in commit x" in str(caught.value.cause)
    assert fakes.phases == [] and fakes.removed == ["canary"]


@pytest.mark.parametrize(("raw", "workflow_id", "message"), [
    ({"action": "deploy", "namespace": "default", "name": "rr", "commit": COMMIT, "fingerprint": FINGERPRINT,
      "version": "1.0.0", "trust_policies": {"mine": {"spec": {"signers": []}}}},
     None, "Extra inputs are not permitted"),
    ({"action": "deploy", "namespace": "default", "name": "rr", "commit": "HEAD~1", "fingerprint": FINGERPRINT,
      "version": "1.0.0"}, None, "String should match pattern"),
    ({"action": "deploy", "namespace": "default", "name": "rr", "commit": COMMIT, "fingerprint": FINGERPRINT,
      "version": "1.0.0"}, "plnt-default-rr-2", "runs as workflow plnt-default-rr, not plnt-default-rr-2"),
])
async def test_a_forged_input_fails_the_saga_before_any_activity(temporal_address: str, temporal_namespace: str,
                                                                 raw: dict[str, Any], workflow_id: str | None,
                                                                 message: str) -> None:
    fakes = FakeActivities()
    with pytest.raises(WorkflowFailureError) as caught:
        await run_saga(temporal_address, temporal_namespace, fakes, raw=raw, workflow_id=workflow_id)
    cause = caught.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "UntrustedSagaInput" and cause.non_retryable
    assert cause.message.startswith("refused: ") and message in cause.message
    assert sum(fakes.calls.values()) == 0 and fakes.phases == []


# --- the real activities, with Temporal's ActivityEnvironment and a real clone ----------------


@pytest.fixture
def clone(spec_repo: SpecRepo, tmp_path: Path) -> GitSource:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    return source


def real_activities(tmp_path: Path, source: GitSource, backend_types: tuple[str, ...] = ("local",)) -> SagaActivities:
    """The real activities, without the check of which workflow calls them (there is none here:
    tests/attacks/test_saga.py proves that check through a live plnt)."""
    state = StateDir(tmp_path / "state").ensure()
    return SagaActivities(driver=LocalDriver(state), statuses=StatusStore(state.status_file),
                          commit_specs=CommitSpecs(source), export_from_repo=source.export,
                          read_from_repo=source.read_file, recipe_cache=state.recipes,
                          supported_backend_types=backend_types, saga_task_queue=None)


def ref_at(repo: SpecRepo, **changes: Any) -> SagaRef:
    """What plnt's reconciler would name for review-responder at the repository's HEAD."""
    specs, problems = load_directory(repo.path)
    assert problems == []
    run = specs.workflow_runs["default/review-responder"]
    values: dict[str, Any] = dict(action="deploy", namespace="default", name="review-responder",
                                  commit=repo.git("rev-parse", "HEAD"), fingerprint=run.fingerprint(),
                                  version=run.spec.workflow.version)
    return SagaRef(**{**values, **changes})


async def refused(call: Any, request: Any) -> str:
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(call, request)
    assert caught.value.type == "UntrustedSagaInput" and caught.value.non_retryable
    return caught.value.message


async def test_validate_reads_the_spec_from_the_commit(spec_repo: SpecRepo, clone: GitSource, tmp_path: Path) -> None:
    result = await ActivityEnvironment().run(real_activities(tmp_path, clone).validate, ValidateInput(saga=ref_at(spec_repo)))
    assert (result.backend_type, result.version, result.traffic_percent) == ("local", "1.2.0", 5)
    assert result.spec["workflow"]["registry"] == "file:registry"


async def test_validate_refuses_what_the_commit_does_not_say(spec_repo: SpecRepo, clone: GitSource,
                                                             tmp_path: Path) -> None:
    activities = real_activities(tmp_path, clone)
    good = ref_at(spec_repo)
    # A commit that exists in the repository but on another branch, and one that does not exist.
    spec_repo.git("checkout", "-q", "-b", "attacker")
    spec_repo.replace("workflowruns/review-responder.yaml", "review-responder@1.2.0", "review-responder@1.3.0")
    side = ref_at(spec_repo, commit=spec_repo.commit("on another branch"))
    spec_repo.git("checkout", "-q", "main")
    clone.resolve("attacker")  # plnt's clone has the object, yet it is not on the tracked branch
    cases = {
        "off-branch": (side, f"commit {side.commit[:12]} is not on branch 'main'"),
        "made-up": (good.model_copy(update={"commit": "0123456789" * 4}), "commit 012345678901 is not on branch 'main'"),
        "fingerprint": (good.model_copy(update={"fingerprint": FINGERPRINT}),
                        f"with fingerprint {FINGERPRINT}; commit {good.commit[:12]} gives version 1.2.0 with fingerprint "
                        f"{good.fingerprint}"),
        "version": (good.model_copy(update={"version": "1.3.0"}), "asks for default/review-responder version 1.3.0"),
        "other run": (good.model_copy(update={"name": "payroll"}), f"commit {good.commit[:12]} has no WorkflowRun default/payroll"),
        "uninstall": (good.model_copy(update={"action": "uninstall", "fingerprint": None, "version": None}),
                      "is a deploy step; this saga is an uninstall"),
    }
    for case, (ref, message) in cases.items():
        assert message in await refused(activities.validate, ValidateInput(saga=ref)), case


async def test_an_invalid_commit_and_an_unsupported_backend(spec_repo: SpecRepo, clone: GitSource,
                                                            tmp_path: Path) -> None:
    good = ref_at(spec_repo)
    helm_only = real_activities(tmp_path, clone, backend_types=("kubernetes",))
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(helm_only.validate, ValidateInput(saga=good))
    assert caught.value.type == "UnknownBackend" and "this plnt deploys to kubernetes backends" in caught.value.message
    spec_repo.replace("workflowruns/review-responder.yaml", "cluster: local", "cluster: nowhere")
    bad = good.model_copy(update={"commit": spec_repo.commit("unknown backend")})
    clone.fetch()
    message = await refused(real_activities(tmp_path, clone).validate, ValidateInput(saga=bad))
    assert f"commit {bad.commit[:12]} has 1 spec problem(s) and plnt starts no saga for it" in message


async def test_a_pool_deploys_on_backends_of_one_type_and_its_placement_is_checked_against_the_commit(
        spec_repo: SpecRepo, clone: GitSource, tmp_path: Path) -> None:
    """A pool of local backends validates; one mixing local and Kubernetes members is refused at
    validate, one of Kubernetes members only gets a Kubernetes backend's checks. The install step takes the saga's placement only within the commit's pool and for
    the replica count the commit asks (the input is not trusted)."""
    spec_repo.write("backends/east.yaml", "apiVersion: plnt.work/v1\nkind: PlntBackend\n"
                                          "metadata: {name: east, labels: {pool: agents}}\nspec: {type: local}\n")
    spec_repo.replace("workflowruns/review-responder.yaml", "cluster: local", "refs: [local, east]")
    spec_repo.replace("workflowruns/review-responder.yaml", "replicas: {min: 1, max: 1}", "replicas: {min: 2, max: 2}")
    spec_repo.commit("a pool")
    clone.fetch()
    activities = real_activities(tmp_path, clone)
    ref = ref_at(spec_repo)
    valid = await ActivityEnvironment().run(activities.validate, ValidateInput(saga=ref))
    assert valid.backend_type == "local"
    digest = "sha256:" + "a" * 64
    for placement, why in [
        (None, "default/review-responder names a pool (refs [local, east]) at its commit; the saga names no "
               "placement for its replicas"),
        ({"local": 1, "elsewhere": 1}, "the saga places default/review-responder on elsewhere, outside its pool "
                                       "refs [local, east] at the commit (local, east)"),
        ({"local": 1, "east": 2}, "the saga places 3 replicas of default/review-responder ({'local': 1, 'east': 2}); "
                                  "its commit asks for 2"),
        ({"local": 2, "east": 0}, "the saga places 2 replicas of default/review-responder ({'local': 2, 'east': 0}); "
                                  "its commit asks for 2"),
    ]:
        message = await refused(activities.install_release,
                                InstallInput(saga=ref, track="canary", recipe_digest=digest, placement=placement))
        assert message == why
    # Within the pool and at the count: the placement passes (what stops it here is the unverified recipe).
    assert "is not plnt's verified copy" in await refused(activities.install_release, InstallInput(
        saga=ref, track="canary", recipe_digest=digest, placement={"local": 1, "east": 1}))

    spec_repo.write("backends/east.yaml", "apiVersion: plnt.work/v1\nkind: PlntBackend\n"
                                          "metadata: {name: east, labels: {pool: agents}}\n"
                                          "spec: {type: kubernetes, kubernetes: {context: kind}}\n")
    spec_repo.commit("east is a cluster")
    clone.fetch()
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(activities.validate, ValidateInput(saga=ref_at(spec_repo)))
    assert caught.value.type == "InvalidSpec" and caught.value.non_retryable
    assert caught.value.message == (
        "spec.backend: refs [local, east] mixes backend types (local (type: local), east (type: kubernetes)): a pool "
        "deploys on backends of one type (all local, or all kubernetes); narrow the pool or name one backend "
        "(spec.backend.cluster)")

    # A pool of Kubernetes backends only deploys (one Helm release per placed backend): what validate
    # refuses of it here is what it refuses of one Kubernetes backend, a recipe a pod cannot fetch.
    spec_repo.write("backends/west.yaml", "apiVersion: plnt.work/v1\nkind: PlntBackend\n"
                                          "metadata: {name: west, labels: {pool: agents}}\n"
                                          "spec: {type: kubernetes, kubernetes: {context: kind}}\n")
    spec_repo.replace("workflowruns/review-responder.yaml", "refs: [local, east]", "refs: [east, west]")
    spec_repo.commit("a pool of two clusters")
    clone.fetch()
    both = real_activities(tmp_path, clone, backend_types=("local", "kubernetes"))
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(both.validate, ValidateInput(saga=ref_at(spec_repo)))
    assert caught.value.type == "InvalidSpec"
    assert caught.value.message.startswith("spec.workflow.registry: 'file:"), caught.value.message
    assert "cannot be reached from a runner pod on Kubernetes backend 'east'" in caught.value.message


async def test_later_steps_act_only_on_what_plnt_verified_and_installed(spec_repo: SpecRepo, clone: GitSource,
                                                                        tmp_path: Path) -> None:
    activities = real_activities(tmp_path, clone)
    ref = ref_at(spec_repo)
    message = await refused(activities.install_release,
                            InstallInput(saga=ref, track="canary", recipe_digest="sha256:" + "a" * 64))
    assert "is not plnt's verified copy of review-responder@1.2.0 from file:registry" in message
    assert "a saga installs a canary" in await refused(
        activities.install_release, InstallInput(saga=ref, track="stable", recipe_digest="sha256:" + "a" * 64))
    assert "has no canary release of fingerprint" in await refused(activities.smoke_test, SmokeInput(saga=ref))
    assert "has no canary release of fingerprint" in await refused(activities.promote_release, ReleaseRef(saga=ref))
    assert "removes only its canary" in await refused(activities.remove_release, ReleaseRef(saga=ref, track="stable"))
    # Compensation works whatever became of the commit (nothing to remove here: a no-op).
    gone = ref.model_copy(update={"commit": "0123456789" * 4})
    assert await ActivityEnvironment().run(activities.remove_release, ReleaseRef(saga=gone, track="canary")) is None
    uninstall = ref.model_copy(update={"action": "uninstall", "fingerprint": None, "version": None})
    assert "is still in commit" in await refused(activities.remove_release, ReleaseRef(saga=uninstall, track="stable"))


async def test_status_is_written_only_from_plnt_s_own_saga(clone: GitSource, tmp_path: Path) -> None:
    activities = real_activities(tmp_path, clone)
    update = PhaseUpdate(namespace="default", name="rr", phase=Phase.READY, fields={"version": "9.9.9"})
    message = await refused(activities.record_phase, update)
    assert "only as a local activity of plnt's own DeploySaga" in message
    local = ActivityEnvironment()
    local.info = dataclasses.replace(local.info, is_local=True)
    await local.run(activities.record_phase, update)
    statuses = StatusStore(tmp_path / "state" / "status.json")
    assert statuses.get("default/rr").version == "9.9.9"  # type: ignore[union-attr]


@pytest.mark.parametrize(("needs", "placement", "message"), [
    ({"gpuClass": "nvidia.com/h100", "gpuCount": 2}, {"cluster": "c"}, "needs 2 x nvidia.com/h100; the WorkflowRun asks for no GPU"),
    ({"gpuClass": "nvidia.com/h100", "gpuCount": 2}, {"cluster": "c", "gpuClass": "nvidia.com/a10g", "gpuCount": 2},
     "asks for nvidia.com/a10g"),
    ({"gpuClass": "nvidia.com/h100", "gpuCount": 2}, {"cluster": "c", "gpuClass": "nvidia.com/h100", "gpuCount": 1},
     "needs 2 GPUs"),
    ({}, {"cluster": "c"}, None),
    ({"gpuClass": "nvidia.com/h100", "gpuCount": 1}, {"cluster": "c", "gpuClass": "nvidia.com/h100", "gpuCount": 1}, None),
])
def test_recipe_requirements_against_the_workflowrun(needs: dict[str, Any], placement: dict[str, Any],
                                                      message: str | None) -> None:
    from plnt.core.specs.models import BackendPlacement, Requirements
    from plnt.reconciler.errors import GpuClassUnavailable
    from plnt.reconciler.saga.activities.pull import check_requirements

    requirements, asked = Requirements.model_validate(needs), BackendPlacement.model_validate(placement)
    if message is None:
        check_requirements(requirements, asked, recipe="r@1.0.0")
        return
    with pytest.raises(GpuClassUnavailable, match=message):
        check_requirements(requirements, asked, recipe="r@1.0.0")


async def test_install_hands_the_driver_the_policies_and_roots_the_pull_verified_with(
    spec_repo: SpecRepo, clone: GitSource, tmp_path: Path,
) -> None:
    """The driver (the declared FAKE, tests/fake_driver.py, in the Helm driver's place) receives, with
    the install, the trust policies covering the recipe and their trusted roots, read from the saga's commit."""
    from plnt.reconciler.saga.io import PullInput

    spec_repo.write("trust/other.yaml", (spec_repo.path / "trust" / "policy.yaml").read_text()
                    .replace("name: ", "name: translate-only-", 1).replace("review-responder", "translate"))
    spec_repo.commit("a policy that does not cover review-responder")
    clone.fetch()
    activities = real_activities(tmp_path, clone)
    ref = ref_at(spec_repo)
    pulled = await ActivityEnvironment().run(activities.pull_recipe, PullInput(saga=ref))
    driver = FakeDriver(endpoint="http://recorded.invalid")
    activities._driver = driver  # type: ignore[assignment]
    await ActivityEnvironment().run(activities.install_release,
                                    InstallInput(saga=ref, track="canary", recipe_digest=pulled.digest))
    [(request,)] = driver.called("install")
    assert request.recipe_digest == pulled.digest
    specs, _ = load_directory(spec_repo.path)
    covering = [p for p in specs.trust_policies.values() if p.covers("review-responder")]
    assert list(request.trust.policies) == covering and len(covering) < len(specs.trust_policies)
    [path] = {p.spec.trust_root.trusted_root_file for p in covering}
    assert request.trust.trusted_roots == {path: (spec_repo.path / path).read_text()}
    assert "trust" not in request.release().model_dump(), "a release record carries no policies"


# --- a ModelDeployment's saga: install and promote wait for the model ----------------------------


def scheduled_timeouts(history: WorkflowHistory) -> dict[str, float]:
    """Each scheduled activity's start-to-close timeout, in seconds, as the saga's history holds it."""
    out: dict[str, float] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attributes = event.activity_task_scheduled_event_attributes
            out[attributes.activity_type.name] = attributes.start_to_close_timeout.ToTimedelta().total_seconds()
    return out


async def test_a_model_sagas_install_and_promote_wait_for_the_model(temporal_address: str,
                                                                    temporal_namespace: str) -> None:
    """saga.py takes each step's timeout from the saga's input: a ModelDeployment's input (as the
    reconciler builds it, with model_step_timeouts) schedules install_release and promote_release with
    the model's helm wait plus the margin, every other step as a WorkflowRun's; both histories replay.
    FakeActivities on a real Temporal dev server."""
    from plnt.reconciler.drivers.helm import model_step_timeouts

    model_retry = FAST_RETRY.model_copy(update={"step_timeouts": model_step_timeouts(FAST_RETRY.step_timeouts, 1800)})
    saga = SagaInput(action="deploy", namespace="default", name="rr", commit=COMMIT, fingerprint=FINGERPRINT,
                     version="1.0.0", retry=model_retry)
    histories: list[Any] = []
    model_run = await run_saga(temporal_address, temporal_namespace, FakeActivities(), raw=saga.model_dump(mode="json"),
                               runner=SAGA_RUNNER, histories=histories)
    runner_run = await run_saga(temporal_address, temporal_namespace, FakeActivities(), runner=SAGA_RUNNER,
                                histories=histories)
    assert model_run.phase is runner_run.phase is Phase.READY
    model_history, runner_history = histories
    runner_steps = {"validate": 30, "pull_recipe": 300, "install_release": 180, "smoke_test": 900, "promote_release": 180}
    assert scheduled_timeouts(runner_history) == runner_steps
    assert scheduled_timeouts(model_history) == {**runner_steps, "install_release": 2100, "promote_release": 2100}
    for history in histories:
        replayer = Replayer(workflows=[DeploySaga], workflow_runner=SAGA_RUNNER, data_converter=pydantic_data_converter)
        await replayer.replay_workflow(history)  # raises on any difference


class SagaInputSpy:
    """The real Temporal client, with every saga input it starts recorded (a spy: each start goes on)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.inputs: dict[str, SagaInput] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def start_workflow(self, workflow: str, saga: SagaInput, **kwargs: Any) -> Any:
        self.inputs[saga.key] = saga
        return await self._client.start_workflow(workflow, saga, **kwargs)


async def test_the_reconciler_gives_a_model_deployment_the_models_step_timeouts(
        spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str) -> None:
    """A real Reconciler pass over the example repository with a ModelDeployment added (a real git
    repository, GitSource, DriverSet over a LocalDriver that is never started, a real Temporal dev
    server where no worker polls, so the sagas wait): the ModelDeployment's saga input carries
    install/promote timeouts of model_install_timeout_s + 300 s; the WorkflowRuns' carry plnt's own."""
    from plnt.reconciler.control.loop import Reconciler
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.saga.io import saga_workflow_id
    from plnt.reconciler.settings import Settings

    spec_repo.write("modeldeployments/smollm2.yaml", (spec_repo.path / "models" / "smollm2.yaml").read_text())
    spec_repo.commit("a ModelDeployment")
    state = StateDir(tmp_path / "state").ensure()
    client = SagaInputSpy(await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter))
    settings = Settings(repo=str(spec_repo.path), state_dir=state.root, temporal_namespace=temporal_namespace,
                        model_install_timeout_s=2400)

    def no_helm(backend: Any, specs: Any) -> Any:
        raise AssertionError("no Kubernetes backend here")

    reconciler = Reconciler(settings=settings, source=GitSource(str(spec_repo.path), state.source_clone),
                            client=client, statuses=StatusStore(state.status_file),  # type: ignore[arg-type]
                            driver=DriverSet(LocalDriver(state), state, make_helm=no_helm), state=state)
    try:
        await reconciler.reconcile_once()
        model = client.inputs.pop("default/smollm2")
        assert client.inputs, "the example's WorkflowRuns were started too"
        steps = model.retry.step_timeouts
        assert (steps.install_release, steps.promote_release) == (2700, 2700)
        defaults = settings.temporal.retry.step_timeouts
        assert steps.model_copy(update={"install_release": 180, "promote_release": 180}) == defaults
        assert model.retry.model_copy(update={"step_timeouts": defaults}) == settings.temporal.retry
        for key, saga in client.inputs.items():
            assert saga.retry == settings.temporal.retry, key
    finally:
        for key in reconciler.running_sagas:
            namespace, name = key.split("/")
            await client.get_workflow_handle(saga_workflow_id(namespace, name)).terminate("test over")
        await reconciler.close()


GATED = [CanaryStepPlan(weight=5, pause_s=0, gates=["golden"]), CanaryStepPlan(weight=50, pause_s=0, gates=["golden", "errors"])]
PASS = GateVerdict(name="golden", type="quality", passed=True, reason="canary 4/4 golden cases passed (100%)")


async def test_each_step_checks_its_gates_after_its_smoke_test(temporal_address: str, temporal_namespace: str) -> None:
    errors = GateVerdict(name="errors", type="metric", passed=True, reason="value 0 <= max 0.01")
    fakes = FakeActivities(steps=GATED, gate_verdicts=[[PASS], [PASS, errors]])
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY
    assert fakes.gated_steps == [1, 2] and fakes.calls["smoke_test"] == 2
    assert "step 2/2 passed at 50%; checking gates golden, errors" in [u.message for u in fakes.updates]


async def test_a_failing_gate_rolls_back_with_its_reason(temporal_address: str, temporal_namespace: str) -> None:
    wrong = GateVerdict(name="golden", type="quality", passed=False, failing=["complaint: intent: wrong"],
                        reason="canary 3/4 golden cases passed (75%): below minPassRate 100%; failing: complaint: "
                               'intent: expected "complaint", got "praise"')
    fakes = FakeActivities(steps=GATED, gate_verdicts=[[wrong]])
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.ROLLED_BACK
    assert result.reason == f"step 1/2 at 5%: gate golden (quality): {wrong.reason}"
    assert fakes.traffic_steps == [] and fakes.removed == ["canary"] and fakes.calls["promote_release"] == 0


async def test_a_one_step_canary_with_gates_checks_them(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities(steps=[CanaryStepPlan(weight=5, pause_s=0, gates=["golden"])], gate_verdicts=[[PASS]])
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY and fakes.gated_steps == [1]


async def test_gates_judge_after_the_steps_pause(temporal_address: str, temporal_namespace: str) -> None:
    """The pause is the step's soak: its gates run after it, on what the canary did meanwhile."""
    steps = [CanaryStepPlan(weight=5, pause_s=1.0, gates=["golden"])]
    fakes = FakeActivities(steps=steps, gate_verdicts=[[PASS]])
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY
    messages = [u.message for u in fakes.updates if u.phase is Phase.CANARY]
    assert messages[1:] == ["step 1/1 passed at 5%; pausing 1s before its gates",
                            "step 1/1 passed at 5%; checking gates golden"], messages
