"""A ModelDeployment's weights in the saga: where they are published and how their signature is
checked (pull_recipe and install_release both check), and plnt's store of verified weights, which
the steps pull into and collect from."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path

from plnt.core.specs.models import ModelDeployment, RecipeTrustPolicy
from plnt.reconciler.drivers.protocol import ReleaseDriver
from plnt.reconciler.errors import InvalidSpec, PlntError, UntrustedSagaInput
from plnt.reconciler.recipes.pull import ReadFromRepo
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.recipes.trust import VerifiedWeights, policies_for, verify_weights_signature
from plnt.reconciler.recipes.weights import Progress, PulledWeights, WeightsSource, WeightsStore
from plnt.reconciler.saga.commit_specs import TrustedSaga

log = logging.getLogger(__name__)

PULLED_KEPT_S = 3600.0  # weights pulled but not installed (a saga between its steps) are not collected for this long

WeightsCheck = Callable[[bytes | None], VerifiedWeights]  # a signature bundle -> the verified manifest


def model_policies(trusted: TrustedSaga, run: ModelDeployment) -> list[RecipeTrustPolicy]:
    """The policies the model's weights are verified with: the one spec.model.trustPolicy names,
    else those covering the model's name; from the saga's commit."""
    model = run.spec.model
    if model.trust_policy is not None:
        return [p for p in trusted.policies if p.metadata.name == model.trust_policy]
    return policies_for(model.name, trusted.policies)


def weights_check(trusted: TrustedSaga, run: ModelDeployment, registry_options: RegistryOptions,
                  read_from_repo: ReadFromRepo) -> tuple[WeightsSource, WeightsCheck]:
    """Where the model's weights are published, and the check of their signature bundle (the
    model's policies, their trusted roots read from the saga's commit, the spec's pin)."""
    from plnt.reconciler.recipes.weights_sources import (
        open_weights_source,  # (boto3/oras clients load only when models are used)
    )

    model = run.spec.model
    policies = model_policies(trusted, run)
    commit = trusted.policy_commit or trusted.ref.commit
    try:
        source = open_weights_source(model.registry, model.name, model.version, registry_options)
    except ValueError:  # a relative file: URL (inside the spec repository)
        raise InvalidSpec(f"spec.model.registry: {model.registry!r}: weights are not kept in the spec repository; "
                          "publish them to file:///ABSOLUTE/DIR (with --allow-file-registry), s3:// or oci:// "
                          "(plnt model push)") from None

    def verify(bundle: bytes | None) -> VerifiedWeights:
        return verify_weights_signature(bundle, model=model.name, policies=policies, pin=model.root_digest,
                                        load_trusted_root=lambda path: read_from_repo(commit, path))

    return source, verify


def verified_weights(weights: ModelWeights | None, run: ModelDeployment, digest: str) -> Path:
    """The store's verified model directory for what the spec pins (pull_recipe assembled it)."""
    if weights is None or digest != run.spec.model.root_digest:
        raise UntrustedSagaInput(f"weights {digest} are not what {run.key} pins ({run.spec.model.root_digest})")
    directory = weights.model_dir(digest)
    if not directory.is_dir():
        raise UntrustedSagaInput(f"weights {digest} of {run.key} are not in plnt's store: pull_recipe must "
                                 "verify them first")
    return directory


class ModelWeights:
    """plnt's store of verified weights as the saga steps use it: one pull or collection at a time
    (canary and stable share blobs), and weights pulled but not yet installed kept from collection
    a while."""

    def __init__(self, store: WeightsStore) -> None:
        self._store = store
        self._lock = asyncio.Lock()
        self._pulled: dict[str, float] = {}  # root digest -> when it was pulled

    async def pull(self, source: WeightsSource, verify: WeightsCheck, progress: Progress) -> PulledWeights:
        async with self._lock:
            pulled = await asyncio.to_thread(self._store.pull, source, verify, progress=progress)
        self._pulled[pulled.root_digest] = time.monotonic()
        return pulled

    def installed(self, digest: str) -> None:
        """A release record references these weights from here on: no longer kept for the pull's sake."""
        self._pulled.pop(digest, None)

    def model_dir(self, root_digest: str) -> Path:
        return self._store.model_dir(root_digest)

    async def collect(self, driver: ReleaseDriver) -> None:
        """Removes from the store the weights no model release references (nor a pull not yet
        installed): after a promotion (the old stable's) or a removal (a rolled-back canary's)."""
        if not await asyncio.to_thread(self._store.holds_anything):
            return  # every removal of 1,000 WorkflowRuns would read the live state (Helm: helm list) for nothing
        now = time.monotonic()
        self._pulled = {digest: at for digest, at in self._pulled.items() if now - at < PULLED_KEPT_S}
        try:
            keep = {release.recipe_digest for live in (await driver.live()).values()
                    for release in (live.stable, live.canary) if release is not None and release.model is not None}
            keep |= set(self._pulled)
            async with self._lock:
                removed = await asyncio.to_thread(self._store.collect, keep)
        except (OSError, PlntError) as exc:  # the next promotion or removal collects again; the step succeeded
            log.warning("weights-collect-failed error=%s", exc)
            return
        if removed:
            log.info("weights-collected models=%s (no release references them)", ",".join(removed))
