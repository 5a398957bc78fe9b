"""promote_release, set_canary_traffic and remove_release: the canary made the stable release, moved
to a step of a stepped canary, or a release removed (a deploy saga's compensation removing its
canary, or an uninstall). Promotion and removal may leave weights no release references any more:
they are collected from the store."""

from __future__ import annotations

from plnt.core.specs.models import ModelDeployment
from plnt.reconciler.errors import UntrustedSagaInput
from plnt.reconciler.saga.activities.base import SagaStep, boundary, with_heartbeats
from plnt.reconciler.saga.io import CanaryStepInput, ReleaseRef
from plnt.reconciler.state import Release
from temporalio import activity


class PromoteRemoveSteps(SagaStep):
    @activity.defn(name="promote_release")
    @boundary
    async def promote_release(self, request: ReleaseRef) -> Release:
        _, run = await self._deploy(request.saga)
        live = await self._live_of(run)
        # A retried promote finds its own work: the stable release is already the one this saga made.
        promoted = live is not None and live.canary is None and live.stable is not None \
            and live.stable.spec_fingerprint == run.fingerprint()
        if not promoted:
            await self._release_of(run, "canary")
        stable = await with_heartbeats(self._driver.promote(run.metadata.namespace, run.metadata.name))
        if isinstance(run, ModelDeployment):
            await self._collect_weights()  # the previous stable's weights, if nothing else uses them
        return stable

    @activity.defn(name="set_canary_traffic")
    @boundary
    async def set_canary_traffic(self, request: CanaryStepInput) -> Release:
        _, run = await self._deploy(request.saga)
        step = self._step_at(run, request.step)
        await self._release_of(run, "canary")  # the canary this saga installed, nobody else's
        return await with_heartbeats(self._driver.set_traffic(run.metadata.namespace, run.metadata.name, step.weight,
                                                              canary_header=run.spec.canary.step_canary_header(step)))

    @activity.defn(name="remove_release")
    @boundary
    async def remove_release(self, request: ReleaseRef) -> None:
        try:
            await self._remove_release(request)
        finally:
            await self._collect_weights()

    async def _remove_release(self, request: ReleaseRef) -> None:
        ref = request.saga
        await self._check_caller(ref)
        if ref.action == "deploy":
            # Compensation: plnt's own saga removing its canary needs no commit check (its commit
            # may have left the branch by a force-push mid-saga; the canary must go all the same).
            if request.track != "canary":
                raise UntrustedSagaInput("a deploy saga removes only its canary")
        else:
            trusted = await self._specs.resolve(ref)  # an uninstall needs the WorkflowRun gone at its commit
            knows = getattr(self._driver, "knows", None)
            if knows is not None and not knows(ref.namespace, ref.name):
                # This worker never saw the install (a new pod): look on every backend of the commit.
                await with_heartbeats(self._driver.remove_anywhere(  # type: ignore[attr-defined]
                    ref.namespace, ref.name, request.track, trusted.backends))
                return
        await with_heartbeats(self._driver.remove(ref.namespace, ref.name, request.track))

    async def _collect_weights(self) -> None:
        if self._weights is not None:  # (a plnt that deploys no models keeps no weights)
            await self._weights.collect(self._driver)
