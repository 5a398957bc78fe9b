"""The deploy saga on a real Temporal server.

The activities here are FAKES registered under the real activity names (the pattern of Temporal's
samples): they let these tests drive the saga's control flow (retries, dead ends, compensation)
without runner processes. The real activities are exercised end to end in tests/e2e.

The last tests run the real `validate` activity in Temporal's ActivityEnvironment (no server), with
stand-ins for what it does not use: no driver, repository readers that return nothing.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import pytest
from plnt.reconciler.activities import SagaActivities
from plnt.reconciler.saga import DeploySaga
from plnt.reconciler.saga_io import (
    PhaseUpdate,
    PulledRecipeInfo,
    Release,
    ReleaseRef,
    SagaInput,
    SagaResult,
    ValidatedSpec,
    ValidateInput,
)
from plnt.reconciler.settings import RetrySettings
from plnt.reconciler.smoke import SmokeMetrics, SmokeResult
from plnt.reconciler.status import Phase, StatusStore
from plnt.reconciler.temporal_server import connect
from temporalio import activity
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import Worker

# No module-wide mark: tests that request a server fixture are marked integration by tests/hygiene.py.

SPEC = {
    "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "rr", "namespace": "default"},
    "spec": {"workflow": {"ref": "rr@1.0.0", "registry": "file:registry"}, "backend": {"cluster": "local"}},
}
BACKENDS = {"local": {"apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "local"}, "spec": {"type": "local"}}}
FAST_RETRY = RetrySettings(initial_interval_s=0.05, maximum_interval_s=0.1, maximum_attempts=3)


class FakeActivities:
    """Fake activities: record calls; `fail` maps an activity name to the error it raises."""

    def __init__(self, fail: dict[str, Exception] | None = None, smoke_passes: bool = True) -> None:
        self.calls: Counter[str] = Counter()
        self.phases: list[Phase | None] = []
        self.removed: list[str] = []
        self.fail = fail or {}
        self.smoke_passes = smoke_passes

    def _enter(self, name: str) -> None:
        self.calls[name] += 1
        if name in self.fail:
            raise self.fail[name]

    def all(self) -> list[Any]:
        @activity.defn(name="record_phase")
        async def record_phase(update: PhaseUpdate) -> None:
            self.phases.append(update.phase)

        @activity.defn(name="validate")
        async def validate(request: ValidateInput) -> ValidatedSpec:
            self._enter("validate")
            return ValidatedSpec(backend_type="local", version="1.0.0")

        @activity.defn(name="pull_recipe")
        async def pull_recipe(request: Any) -> PulledRecipeInfo:
            self._enter("pull_recipe")
            return PulledRecipeInfo(directory="/recipes/x", digest="sha256:x", version="1.0.0", signer="release@test")

        @activity.defn(name="install_release")
        async def install_release(request: Any) -> Release:
            self._enter("install_release")
            return Release(release_id="r", namespace="default", name="rr", track="canary", version="1.0.0",
                           spec_fingerprint="f", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")

        @activity.defn(name="smoke_test")
        async def smoke_test(request: Any) -> SmokeResult:
            self._enter("smoke_test")
            metrics = SmokeMetrics(invocations=1, errors=0, error_percent=0, p50_ms=1, p95_ms=1, max_ms=1)
            return SmokeResult(passed=self.smoke_passes, reason="fake verdict", metrics=metrics)

        @activity.defn(name="promote_release")
        async def promote_release(request: ReleaseRef) -> Release:
            self._enter("promote_release")
            return Release(release_id="r", namespace="default", name="rr", track="stable", version="1.0.0",
                           spec_fingerprint="f", recipe_digest="d", recipe_dir="/x", endpoint="http://127.0.0.1:1")

        @activity.defn(name="remove_release")
        async def remove_release(request: ReleaseRef) -> None:
            self.removed.append(request.track)
            self._enter("remove_release")

        return [record_phase, validate, pull_recipe, install_release, smoke_test, promote_release, remove_release]


async def run_saga(address: str, namespace: str, fakes: FakeActivities, action: str = "deploy") -> SagaResult:
    client = await connect(address, namespace, data_converter=pydantic_data_converter)
    queue = f"q-{uuid.uuid4().hex}"
    saga = SagaInput(action=action, namespace="default", name="rr", commit="c0ffee", spec=SPEC, backends=BACKENDS,
                     fingerprint="sha256:f", version="1.0.0", retry=FAST_RETRY)
    async with Worker(client, task_queue=queue, workflows=[DeploySaga], activities=fakes.all()):
        return await client.execute_workflow("DeploySaga", saga, id=saga.workflow_id, task_queue=queue, result_type=SagaResult)


async def test_happy_path_walks_every_phase(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities()
    result = await run_saga(temporal_address, temporal_namespace, fakes)
    assert result.phase is Phase.READY
    # Verifying twice: before the pull, then with who signed the recipe.
    assert fakes.phases == [Phase.VERIFYING, Phase.VERIFYING, Phase.DEPLOYING, Phase.CANARY, Phase.READY]
    assert fakes.removed == []


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


async def test_uninstall_removes_both_tracks_and_the_status(temporal_address: str, temporal_namespace: str) -> None:
    fakes = FakeActivities()
    result = await run_saga(temporal_address, temporal_namespace, fakes, action="uninstall")
    assert fakes.removed == ["canary", "stable"]
    assert fakes.phases == [Phase.DELETING, None]
    assert result.reason == "uninstalled"


# --- the real validate activity, unit-tested with Temporal's ActivityEnvironment ---------------


def real_activities(tmp_path: Any) -> SagaActivities:
    return SagaActivities(driver=None, statuses=StatusStore(tmp_path / "status.json"),  # type: ignore[arg-type]
                          export_from_repo=lambda *a: False, read_from_repo=lambda *a: b"", recipe_cache=tmp_path)


@pytest.mark.parametrize(("spec_edit", "backends", "error_type", "message"), [
    ({"backend": {"cluster": "gpu-east"}}, BACKENDS, "UnknownBackend", "no PlntBackend named 'gpu-east' (known: local)"),
    ({"backend": {"cluster": "local", "gpuClass": "nvidia.com/h100", "gpuCount": 1}}, BACKENDS, "GpuClassUnavailable",
     "offers no GPU classes, not 'nvidia.com/h100'"),
    ({"replicas": {"min": 0}}, BACKENDS, "InvalidSpec", "WorkflowRun is invalid"),
])
async def test_validate_dead_ends_are_non_retryable(tmp_path: Any, spec_edit: dict[str, Any], backends: dict[str, Any],
                                                   error_type: str, message: str) -> None:
    spec = {**SPEC, "spec": {**SPEC["spec"], **spec_edit}}
    with pytest.raises(ApplicationError) as caught:
        await ActivityEnvironment().run(real_activities(tmp_path).validate, ValidateInput(spec=spec, backends=backends))
    assert caught.value.type == error_type and caught.value.non_retryable
    assert message in caught.value.message


async def test_validate_accepts_a_good_spec(tmp_path: Any) -> None:
    result = await ActivityEnvironment().run(real_activities(tmp_path).validate, ValidateInput(spec=SPEC, backends=BACKENDS))
    assert result == ValidatedSpec(backend_type="local", version="1.0.0")


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
    from plnt.reconciler.activities import check_requirements
    from plnt.reconciler.errors import GpuClassUnavailable
    from plnt.reconciler.specs import BackendPlacement, Requirements

    requirements, asked = Requirements.model_validate(needs), BackendPlacement.model_validate(placement)
    if message is None:
        check_requirements(requirements, asked, recipe="r@1.0.0")
        return
    with pytest.raises(GpuClassUnavailable, match=message):
        check_requirements(requirements, asked, recipe="r@1.0.0")
