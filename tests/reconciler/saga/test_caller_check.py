"""The activities check which workflow scheduled them once per saga run (one describe on Temporal,
not one per step), and a new run under the same id (e.g. an impostor on another task queue) is
checked again. Real parts: a Temporal dev server (a fresh namespace), workflows started on it (no
worker polls their queues, so they stay running), plnt's SagaActivities and a git clone. The client
is wrapped to count describes (a spy; each call goes to Temporal as is)."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pytest
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.saga.activities import SagaActivities
from plnt.reconciler.saga.commit_specs import CommitSpecs
from plnt.reconciler.saga.io import ReleaseRef, saga_workflow_id
from plnt.reconciler.saga.temporal_server import connect
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.state import StateDir
from plnt.reconciler.status_store import StatusStore
from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from tests.conftest import SpecRepo
from tests.reconciler.saga.test_saga import ref_at

pytestmark = pytest.mark.integration


class DescribeSpy:
    def __init__(self, client: Any) -> None:
        self._client = client
        self.describes = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_workflow_handle(self, *args: Any, **kwargs: Any) -> Any:
        handle = self._client.get_workflow_handle(*args, **kwargs)
        spy = self

        class Counted:
            def __getattr__(self, name: str) -> Any:
                return getattr(handle, name)

            async def describe(self) -> Any:
                spy.describes += 1
                return await handle.describe()

        return Counted()


async def _in_workflow(client: Any, handle: WorkflowHandle[Any, Any], call: Any, request: Any) -> Any:
    env = ActivityEnvironment(client=client)
    env.info = dataclasses.replace(env.info, workflow_type="DeploySaga", workflow_id=handle.id,
                                   workflow_run_id=handle.result_run_id or "", activity_type="remove_release")
    return await env.run(call, request)


async def test_one_describe_per_saga_run(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
                                         temporal_namespace: str) -> None:
    source = GitSource(str(spec_repo.path), tmp_path / "clone")
    source.fetch()
    state = StateDir(tmp_path / "state").ensure()
    queue, other = f"q-{uuid.uuid4().hex}", f"impostor-{uuid.uuid4().hex}"
    activities = SagaActivities(driver=LocalDriver(state), statuses=StatusStore(state.status_file),
                                commit_specs=CommitSpecs(source), export_from_repo=source.export,
                                read_from_repo=source.read_file, recipe_cache=state.recipes, saga_task_queue=queue)
    client = DescribeSpy(await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter))
    ref = ref_at(spec_repo)
    compensation = ReleaseRef(saga=ref, track="canary")  # a deploy saga removing its canary: no commit check
    wid = saga_workflow_id(ref.namespace, ref.name)
    saga = await client.start_workflow("DeploySaga", "x", id=wid, task_queue=queue)
    try:
        for _ in range(3):
            assert await _in_workflow(client, saga, activities.remove_release, compensation) is None
        assert client.describes == 1
    finally:
        await saga.terminate("test over")
    impostor = await client.start_workflow("DeploySaga", "x", id=wid, task_queue=other)
    try:
        with pytest.raises(ApplicationError) as caught:
            await _in_workflow(client, impostor, activities.remove_release, compensation)
        assert caught.value.type == "UntrustedSagaInput" and f"runs on task queue {other!r}" in caught.value.message
        assert client.describes == 2
    finally:
        await impostor.terminate("test over")
