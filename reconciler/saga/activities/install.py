"""install_release: the saga's canary, from plnt's verified copy of the recipe (or weights), with
the trust it was verified with for a driver whose pods verify it themselves."""

from __future__ import annotations

import asyncio
import functools

from plnt.core.specs.models import Canary, Deployable, ModelCanary, ModelDeployment, RecipeTrustPolicy, replica_count
from plnt.reconciler.drivers.model_runtime import gguf_file
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.errors import InvalidSpec, UntrustedSagaInput
from plnt.reconciler.plan.autoscale import ScalePolicy
from plnt.reconciler.recipes.trust import policies_for
from plnt.reconciler.saga.activities.base import SagaStep, boundary, on_kubernetes, with_heartbeats
from plnt.reconciler.saga.activities.weights import model_policies, verified_weights, weights_check
from plnt.reconciler.saga.commit_specs import TrustedSaga
from plnt.reconciler.saga.io import InstallInput
from plnt.reconciler.state import ModelServing, Release
from temporalio import activity


class InstallStep(SagaStep):
    @activity.defn(name="install_release")
    @boundary
    async def install_release(self, request: InstallInput) -> Release:
        trusted, run = await self._deploy(request.saga)
        if request.track != "canary":
            raise UntrustedSagaInput("a saga installs a canary; only promote_release makes a stable release")
        placement = checked_placement(trusted, run, request.placement)
        if isinstance(run, ModelDeployment):
            return await self._install_model(trusted, run, request.recipe_digest, placement)
        recipe_dir = self._verified_recipe(run, request.recipe_digest)
        trust = await self._trust(trusted, policies_for(run.spec.workflow.name, trusted.policies))
        return await with_heartbeats(self._driver.install(InstallRequest(
            namespace=run.metadata.namespace, name=run.metadata.name, track="canary",
            version=run.spec.workflow.version, spec_fingerprint=run.fingerprint(), recipe_digest=request.recipe_digest,
            recipe_dir=str(recipe_dir), traffic_percent=run.spec.canary.plan_steps()[0].weight, trust=trust,
            canary_header=first_step_header(run.spec.canary), shadow_percent=run.spec.canary.shadow_percent,
            llm_model=f"{run.metadata.namespace}/{run.spec.model}" if run.spec.model else None,
            replicas=replica_count(run.spec), replicas_max=autoscaled_max(run), placement=placement,
        )))

    async def _install_model(self, trusted: TrustedSaga, run: ModelDeployment, digest: str,
                             placement: dict[str, int] | None) -> Release:
        """The canary of a model: served from plnt's verified store directory (local), or by a pod that
        fetches the weights itself (Kubernetes), its manifest verified again here (the file llama.cpp
        loads is named from it) and the trust it was verified with handed to the pod."""
        runtime, model = run.spec.runtime, run.spec.model
        trust = await self._trust(trusted, model_policies(trusted, run))
        if on_kubernetes(trusted):
            if digest != model.root_digest:
                raise UntrustedSagaInput(f"weights {digest} are not what {run.key} pins ({model.root_digest})")
            source, verify = weights_check(trusted, run, self._registry_options, self._read)
            verified = await with_heartbeats(asyncio.to_thread(lambda: verify(source.signature())))
            model_file, recipe_dir = "", ""  # no copy of plnt's: the pod fetches into its own volume
            if runtime.type == "llama.cpp":
                ggufs = [item.name for item in verified.manifest.files if item.name.endswith(".gguf")]
                if len(ggufs) != 1:
                    raise InvalidSpec(f"a llama.cpp model holds exactly one .gguf file; the signed manifest of "
                                      f"{model.name}@{model.version} lists {len(ggufs)}")
                model_file = ggufs[0]
        else:
            directory = verified_weights(self._weights, run, digest)
            model_file = str((await asyncio.to_thread(gguf_file, directory)).relative_to(directory))
            recipe_dir = str(directory)
        release = await with_heartbeats(self._driver.install(InstallRequest(
            namespace=run.metadata.namespace, name=run.metadata.name, track="canary", version=run.version,
            spec_fingerprint=run.fingerprint(), recipe_digest=digest, recipe_dir=recipe_dir,
            traffic_percent=run.spec.canary.plan_steps()[0].weight, trust=trust,
            canary_header=first_step_header(run.spec.canary), shadow_percent=run.spec.canary.shadow_percent,
            model=ModelServing(runtime=runtime.type, model_file=model_file, alias=run.metadata.name,
                               context_length=runtime.context_length, threads=runtime.threads,
                               args=tuple(runtime.args), registry=model.registry, model_name=model.name,
                               memory_mib=runtime.resources.memory_mi_b if runtime.resources else None),
            replicas=replica_count(run.spec), replicas_max=autoscaled_max(run), placement=placement,
        )))
        if self._weights is not None:
            self._weights.installed(digest)
        return release

    async def _trust(self, trusted: TrustedSaga, policies: list[RecipeTrustPolicy]) -> RecipeTrust:
        """These policies and their trusted roots, read from the saga's commit: what pull_recipe
        verified with, for runners that verify it themselves (Kubernetes pods)."""
        read_root = functools.partial(self._read, trusted.policy_commit or trusted.ref.commit)
        return await asyncio.to_thread(RecipeTrust.of, policies, read_root)


def autoscaled_max(run: Deployable) -> int | None:
    """replicas.max of a spec the autoscaler scales (None: a fixed count)."""
    policy = ScalePolicy.of(run)
    return policy.max if policy is not None else None


def first_step_header(canary: Canary | ModelCanary) -> tuple[str, str] | None:
    return canary.step_canary_header(canary.plan_steps()[0])


def checked_placement(trusted: TrustedSaga, run: Deployable, placement: dict[str, int] | None) -> dict[str, int] | None:
    """A pool's placement from the (untrusted) saga input, checked against the commit: every backend in
    the run's pool, each count positive, their sum its replica count. Where replicas go depends on live
    capacity, so the reconciler decides it; what it may name is the commit's. None for one backend."""
    if not run.spec.backend.pooled:
        if placement is not None:
            raise UntrustedSagaInput(f"{run.key} names one backend at its commit; the saga names a placement")
        return None
    if not placement:
        raise UntrustedSagaInput(f"{run.key} names a pool ({run.spec.backend.describe()}) at its commit; the saga "
                                 "names no placement for its replicas")
    members = run.spec.backend.members({b.metadata.name: b for b in trusted.backends})
    strangers = sorted(set(placement) - set(members))
    if strangers:
        raise UntrustedSagaInput(f"the saga places {run.key} on {', '.join(strangers)}, outside its pool "
                                 f"{run.spec.backend.describe()} at the commit ({', '.join(members) or 'no backend'})")
    if any(count < 1 for count in placement.values()) or sum(placement.values()) != replica_count(run.spec):
        raise UntrustedSagaInput(f"the saga places {sum(placement.values())} replicas of {run.key} "
                                 f"({placement}); its commit asks for {replica_count(run.spec)}")
    return dict(placement)
