"""validate: the saga's WorkflowRun at its commit, against what its backend offers and what this
plnt can deploy. Refuses, before anything is pulled, what could only fail later."""

from __future__ import annotations

from plnt.core.specs.models import ModelDeployment
from plnt.reconciler.errors import GpuClassUnavailable, InvalidSpec, UnknownBackend
from plnt.reconciler.saga.activities.base import SagaStep, boundary
from plnt.reconciler.saga.io import CanaryStepPlan, ValidatedSpec, ValidateInput
from temporalio import activity


class ValidateStep(SagaStep):
    @activity.defn(name="validate")
    @boundary
    async def validate(self, request: ValidateInput) -> ValidatedSpec:
        trusted, run = await self._deploy(request.saga)
        if run.spec.backend.pooled:
            # A pool deploys as processes of one local release, each on the backend it is placed on, or
            # as one Helm release per placed Kubernetes backend (drivers/helm_pool.py); not both at once.
            pool = {b.metadata.name: b for b in trusted.backends}
            members = run.spec.backend.members(pool)
            types = {pool[name].spec.type for name in members}
            if len(types) > 1:
                listed = ", ".join(f"{name} (type: {pool[name].spec.type})" for name in members)
                raise InvalidSpec(f"spec.backend: {run.spec.backend.describe()} mixes backend types ({listed}): a pool "
                                  "deploys on backends of one type (all local, or all kubernetes); narrow the pool "
                                  "or name one backend (spec.backend.cluster)")
        cluster = run.spec.backend.cluster or (trusted.backend.metadata.name if trusted.backend else None)
        backend = trusted.backend
        if backend is None:  # the loader refuses such a commit; kept for a spec set loaded without references
            raise UnknownBackend(f"spec.backend.cluster: no PlntBackend named {cluster!r}")
        gpu_class = run.spec.backend.gpu_class
        if gpu_class is not None and gpu_class not in backend.spec.gpu_classes:
            offered = ", ".join(backend.spec.gpu_classes) or "no GPU classes"
            raise GpuClassUnavailable(f"spec.backend.gpuClass: backend {cluster!r} offers {offered}, not {gpu_class!r}")
        if backend.spec.type not in self._backend_types:
            raise UnknownBackend(
                f"backend {cluster!r} is of type {backend.spec.type}; this plnt deploys to "
                f"{', '.join(self._backend_types)} backends"
            )
        if isinstance(run, ModelDeployment) and backend.spec.type == "kubernetes":
            # Refused before the pull: the pod's init container fetches and verifies the weights itself.
            model, runtime = run.spec.model, run.spec.runtime
            if model.registry.startswith("file:"):
                raise InvalidSpec(f"spec.model.registry: {model.registry!r} cannot be reached from a model-server pod "
                                  f"on Kubernetes backend {cluster!r}; publish the weights to an s3:// or oci:// "
                                  "registry (plnt model push)")
            if runtime.type != "llama.cpp" and run.spec.backend.gpu_count < 1:
                raise InvalidSpec(f"spec.backend.gpuCount: runtime {runtime.type} serves on GPUs only; set spec.backend."
                                  f"gpuCount to 1 or more (and spec.backend.gpuClass), or use runtime type llama.cpp, "
                                  "which runs on CPU")
            named = model.trust_policy
            if named is not None and not any(p.metadata.name == named and p.covers(model.name) for p in trusted.policies):
                # The pod's `plnt model fetch` applies the policies covering the model's name.
                raise InvalidSpec(f"spec.model.trustPolicy: RecipeTrustPolicy {named!r} does not list model "
                                  f"{model.name!r} in its spec.recipes; on Kubernetes backend {cluster!r} the pod "
                                  "verifies the weights with the policies covering the model's name: add it there")
        elif isinstance(run, ModelDeployment):
            if self._weights is None:
                raise InvalidSpec(f"ModelDeployment {run.key}: this plnt has no weights store (a worker without a "
                                  "state directory); run ModelDeployments with `plnt up`")
        elif backend.spec.type == "kubernetes" and run.spec.workflow.registry.startswith("file:"):
            # Refused before the pull: a runner pod fetches its recipe itself and sees no plnt disk.
            raise InvalidSpec(f"spec.workflow.registry: {run.spec.workflow.registry!r} cannot be reached from a "
                              f"runner pod on Kubernetes backend {cluster!r}; publish the recipe to an s3:// or "
                              f"oci:// registry")
        steps = run.spec.canary.plan_steps()
        return ValidatedSpec(backend_type=backend.spec.type, version=run.version, traffic_percent=steps[0].weight,
                             spec=run.spec.model_dump(mode="json", by_alias=True),
                             canary_steps=[CanaryStepPlan(weight=s.weight, pause_s=s.pause_s, manual=s.manual,
                                                         gates=run.spec.canary.step_gates(s)) for s in steps],
                             # (a preview deploys beside the branch's releases: it waits for nothing)
                             depends_on=list(run.spec.depends_on) if request.saga.preview is None else [])

