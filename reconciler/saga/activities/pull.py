"""pull_recipe: the recipe (or a model's weights) fetched and verified against the trust policies
at the saga's commit, into plnt's verified cache (or weights store). Recipe code is never imported
here: a recipe is checked as data, and only its runner process imports it."""

from __future__ import annotations

import asyncio

from plnt.core.specs.models import BackendPlacement, ModelDeployment, Requirements
from plnt.reconciler.errors import GpuClassUnavailable
from plnt.reconciler.recipes.pull import pull_recipe
from plnt.reconciler.saga.activities.base import SagaStep, boundary, on_kubernetes, with_heartbeats
from plnt.reconciler.saga.activities.weights import weights_check
from plnt.reconciler.saga.commit_specs import TrustedSaga
from plnt.reconciler.saga.io import PulledRecipeInfo, PullInput, recipe_inputs
from temporalio import activity


def check_requirements(needs: Requirements, placement: BackendPlacement, *, recipe: str) -> None:
    """What the recipe says it needs against what the WorkflowRun asks its backend for.

    (The backend's offer was checked at validation: the WorkflowRun's gpuClass is one it has.)
    """
    if needs.gpu_class is not None and placement.gpu_class != needs.gpu_class:
        asked = placement.gpu_class or "no GPU"
        raise GpuClassUnavailable(f"recipe {recipe} needs {needs.gpu_count or 1} x {needs.gpu_class}; the WorkflowRun "
                                  f"asks for {asked}: set spec.backend.gpuClass: {needs.gpu_class}")
    if needs.gpu_count > placement.gpu_count:
        raise GpuClassUnavailable(f"recipe {recipe} needs {needs.gpu_count} GPUs; the WorkflowRun asks for "
                                  f"{placement.gpu_count}: raise spec.backend.gpuCount")


class Transferred:
    """The bytes a pull has transferred so far (set from the pulling thread): its heartbeats' details."""

    def __init__(self) -> None:
        self.bytes = 0

    def __call__(self, done: int) -> None:
        self.bytes = done


class PullStep(SagaStep):
    @activity.defn(name="pull_recipe")
    @boundary
    async def pull_recipe(self, request: PullInput) -> PulledRecipeInfo:
        trusted, run = await self._deploy(request.saga)
        if isinstance(run, ModelDeployment):
            return await self._pull_weights(trusted, run)
        transferred = Transferred()
        pulled = await with_heartbeats(asyncio.to_thread(
            pull_recipe, run.spec.workflow, commit=request.saga.commit, cache=self._cache, policies=trusted.policies,
            read_from_repo=self._read, export_from_repo=self._export, registry_options=self._registry_options,
            limits=self._limits, progress=transferred, policy_commit=trusted.policy_commit,
        ), details=lambda: transferred.bytes)
        check_requirements(pulled.workflow.requirements, run.spec.backend, recipe=run.spec.workflow.ref)
        return PulledRecipeInfo(digest=pulled.digest, version=pulled.version,
                                signer=f"{pulled.signature.identity} ({pulled.signature.issuer})",
                                transferred_bytes=pulled.transferred_bytes, inputs=recipe_inputs(pulled.workflow))

    async def _pull_weights(self, trusted: TrustedSaga, run: ModelDeployment) -> PulledRecipeInfo:
        """The model's signed manifest verified (the policies at the saga's commit, the spec's pin),
        then every file fetched into the weights store, hashed as it streams. On a Kubernetes backend
        only the manifest (see below)."""
        source, verify = weights_check(trusted, run, self._registry_options, self._read)
        if on_kubernetes(trusted):
            # Decision: on Kubernetes the files are NOT downloaded into plnt's store. The pod's init
            # container (`plnt model fetch`) fetches them into its own volume and checks every file
            # against this same signed manifest and pin, with the same policies; a copy here would
            # never be served, would cost a transfer of the whole model (GPU-sized models are tens to
            # hundreds of GB) and plnt's disk budget, and would make the pod's copy no more trusted.
            # What must happen before any pod starts does happen here, fail closed: the signature is
            # verified against the policies at the saga's commit and the manifest against the spec's
            # root-digest pin (install_release verifies it again). A file missing or altered in the
            # registry is the init container's to catch: the pod never serves, the canary is removed.
            verified = await with_heartbeats(asyncio.to_thread(lambda: verify(source.signature())))
            return PulledRecipeInfo(digest=verified.manifest.root_digest, version=run.spec.model.version,
                                    signer=f"{verified.signature.identity} ({verified.signature.issuer})",
                                    transferred_bytes=0)
        assert self._weights is not None  # validate refused a ModelDeployment without a store
        transferred = Transferred()
        pulled = await with_heartbeats(self._weights.pull(source, verify, progress=transferred),
                                       details=lambda: transferred.bytes)
        return PulledRecipeInfo(digest=pulled.root_digest, version=run.spec.model.version, signer=pulled.signer,
                                transferred_bytes=pulled.transferred_bytes)
