"""A pass starts all the sagas it plans at once, within max_concurrent_sagas, on real Temporal.

Real parts: a git repository of WorkflowRuns, plnt's GitSource, DriverSet over a LocalDriver, the
StatusStore, the Reconciler and a Temporal dev server (a fresh namespace). No worker polls the
task queue, so the started sagas wait there: this is about how they are started. The Temporal
client is wrapped to count start calls in flight (a spy; each call goes to Temporal as is)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from plnt.core.status import Phase
from plnt.reconciler.control.loop import Reconciler
from plnt.reconciler.drivers.driver_set import DriverSet
from plnt.reconciler.drivers.local import LocalDriver
from plnt.reconciler.saga.io import SagaResult, saga_workflow_id
from plnt.reconciler.saga.temporal_server import connect
from plnt.reconciler.settings import Settings
from plnt.reconciler.source.git import GitSource
from plnt.reconciler.state import StateDir
from plnt.reconciler.status_store import StatusStore
from temporalio.client import WorkflowExecutionStatus
from temporalio.contrib.pydantic import pydantic_data_converter

from tests.conftest import SpecRepo

pytestmark = pytest.mark.integration


class StartSpy:
    """The real client, with start_workflow counted: how many are in flight at once."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.in_flight = self.most = self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def start_workflow(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(0.05)  # a slower Temporal: starts one after the other would never overlap
            return await self._client.start_workflow(*args, **kwargs)
        finally:
            self.in_flight -= 1


def no_helm(backend: Any) -> Any:
    raise AssertionError("no Kubernetes backend here")


@pytest.mark.parametrize(("runs", "max_sagas", "started"), [(4, 8, 4), (5, 3, 3)])
async def test_a_pass_starts_its_sagas_at_once(spec_repo: SpecRepo, tmp_path: Path, temporal_address: str,
                                               temporal_namespace: str, runs: int, max_sagas: int,
                                               started: int) -> None:
    template = (spec_repo.path / "workflowruns" / "review-responder.yaml").read_text()
    for i in range(1, runs):
        spec_repo.write(f"workflowruns/rr-{i}.yaml", template.replace("name: review-responder\n", f"name: rr-{i}\n", 1))
    spec_repo.commit(f"{runs} WorkflowRuns")
    state = StateDir(tmp_path / "state").ensure()
    source = GitSource(str(spec_repo.path), state.source_clone)
    statuses = StatusStore(state.status_file)
    client = StartSpy(await connect(temporal_address, temporal_namespace, data_converter=pydantic_data_converter))
    settings = Settings(repo=str(spec_repo.path), state_dir=state.root, max_concurrent_sagas=max_sagas,
                        temporal_namespace=temporal_namespace)
    reconciler = Reconciler(settings=settings, source=source, client=client, statuses=statuses,  # type: ignore[arg-type]
                            driver=DriverSet(LocalDriver(state), state, make_helm=no_helm), state=state)
    try:
        await reconciler.reconcile_once()
        assert client.calls == started
        assert client.most == started, "the pass's sagas were started one after the other"
        assert len(reconciler.running_sagas) == started
        for key in reconciler.running_sagas:
            namespace, name = key.split("/")
            assert statuses.get(key).phase is Phase.PENDING  # type: ignore[union-attr]
            handle = client.get_workflow_handle(saga_workflow_id(namespace, name), result_type=SagaResult)
            assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
    finally:
        for key in reconciler.running_sagas:
            namespace, name = key.split("/")
            await client.get_workflow_handle(saga_workflow_id(namespace, name)).terminate("test over")
        await reconciler.close()
