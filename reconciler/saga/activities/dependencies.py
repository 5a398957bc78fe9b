"""wait_for_dependencies: a rollout whose spec names dependsOn waits, before anything of it is pulled
or installed, until each dependency's spec at the same commit is promoted (its stable release has
that spec's fingerprint), and fails (DependencyFailed) when one was rolled back or failed there."""

from __future__ import annotations

import asyncio

from plnt.core.specs.models import Deployable, run_key
from plnt.core.status import Phase
from plnt.reconciler.errors import DependencyFailed
from plnt.reconciler.saga.activities.base import SagaStep, boundary, with_heartbeats
from plnt.reconciler.saga.io import DependenciesInput
from temporalio import activity

POLL_S = 0.5


class DependenciesStep(SagaStep):
    @activity.defn(name="wait_for_dependencies")
    @boundary
    async def wait_for_dependencies(self, request: DependenciesInput) -> None:
        trusted, run = await self._deploy(request.saga)
        for name in run.spec.depends_on:
            dependency = trusted.dependencies.get(name)
            if dependency is None:  # the loader refuses such a commit
                raise DependencyFailed(f"commit {request.saga.commit[:12]} has no {name} in {run.metadata.namespace}")
            await with_heartbeats(self._promoted(dependency))

    async def _promoted(self, dependency: Deployable) -> None:
        namespace, name = dependency.metadata.namespace, dependency.metadata.name
        wanted = dependency.fingerprint()
        while True:
            live = await self._live(namespace, name)
            if live is not None and live.stable is not None and live.stable.spec_fingerprint == wanted:
                return
            status = self._statuses.get(run_key(namespace, name)) if self._statuses is not None else None
            if status is not None and status.phase in (Phase.ROLLED_BACK, Phase.FAILED) \
                    and status.attempted_fingerprint == wanted:
                raise DependencyFailed(
                    f"dependsOn: {dependency.kind} {namespace}/{name} {status.phase.value} at this commit "
                    f"({status.last_error or status.message}); fix it, then commit a change to try again")
            await asyncio.sleep(POLL_S)
