"""Saga activities: the only code that touches the outside world during a deploy.

Each is idempotent (a retried activity finds its own earlier work) and maps plnt's errors at the
boundary: NeedsHuman becomes a non-retryable ApplicationError named after the error class.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from plnt.runner.recipe import load_golden, load_recipe_dir
from pydantic import ValidationError
from temporalio import activity
from temporalio.exceptions import ApplicationError

from .archive import ExtractLimits
from .driver import InstallRequest, ReleaseDriver
from .errors import GpuClassUnavailable, InvalidSpec, NeedsHuman, PlntError, UnknownBackend
from .recipes import ExportFromRepo, ReadFromRepo, RecipeCache, pull_recipe
from .registries import RegistryOptions
from .saga_io import (
    InstallInput,
    PhaseUpdate,
    PulledRecipeInfo,
    PullInput,
    ReleaseRef,
    SmokeInput,
    ValidatedSpec,
    ValidateInput,
)
from .smoke import SmokeResult, judge, measure, summarise
from .specs import BackendPlacement, PlntBackend, RecipeTrustPolicy, Requirements, WorkflowRun
from .state import Release
from .status import StatusStore

T = TypeVar("T")

HEARTBEAT_EVERY_S = 1.0


async def _with_heartbeats(work: Awaitable[T], details: Callable[[], object] = lambda: None) -> T:
    """Run `work` while heartbeating from the activity's own task.

    Heartbeats let Temporal notice a dead worker within the heartbeat timeout (instead of the
    whole start-to-close timeout) and deliver cancellation to a running activity.
    """
    task = asyncio.ensure_future(work)
    try:
        while not task.done():
            activity.heartbeat(details())
            await asyncio.wait({task}, timeout=HEARTBEAT_EVERY_S)
    except asyncio.CancelledError:
        task.cancel()
        raise
    return task.result()


def _boundary(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """Map plnt errors to Temporal's: the exception type decides whether Temporal retries."""

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return await fn(*args, **kwargs)
        except PlntError as exc:
            reason = getattr(exc, "reason", None)  # e.g. VerificationFailed: which check failed
            message = f"{reason}: {exc}" if reason else str(exc)
            raise ApplicationError(message, type=type(exc).__name__, non_retryable=isinstance(exc, NeedsHuman)) from exc

    return wrapper


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


class SagaActivities:
    def __init__(
        self,
        *,
        driver: ReleaseDriver,
        statuses: StatusStore,
        export_from_repo: ExportFromRepo,
        read_from_repo: ReadFromRepo,
        recipe_cache: Path,
        registry_options: RegistryOptions = RegistryOptions(),
        limits: ExtractLimits = ExtractLimits(),
        smoke_request_timeout_s: float = 30.0,
        supported_backend_types: tuple[str, ...] = ("local",),
    ) -> None:
        self._driver = driver
        self._statuses = statuses
        self._export = export_from_repo
        self._read = read_from_repo
        self._cache = RecipeCache(recipe_cache)
        self._registry_options = registry_options
        self._limits = limits
        self._smoke_timeout_s = smoke_request_timeout_s
        self._backend_types = supported_backend_types

    def all(self) -> list[Callable[..., Any]]:
        return [self.record_phase, self.validate, self.pull_recipe, self.install_release,
                self.smoke_test, self.promote_release, self.remove_release]

    @activity.defn(name="record_phase")
    async def record_phase(self, update: PhaseUpdate) -> None:
        if update.phase is None:
            self._statuses.remove(update.namespace, update.name)
            return
        fields = dict(update.fields)
        if update.commit is not None:
            fields["observed_commit"] = update.commit
        if update.saga_id is not None:
            fields["saga_id"] = update.saga_id
        self._statuses.update(update.namespace, update.name, phase=update.phase, message=update.message, **fields)

    @activity.defn(name="validate")
    @_boundary
    async def validate(self, request: ValidateInput) -> ValidatedSpec:
        try:
            run = WorkflowRun.model_validate(request.spec)
        except ValidationError as exc:
            raise InvalidSpec(f"WorkflowRun is invalid: {exc}") from exc
        cluster = run.spec.backend.cluster
        if cluster not in request.backends:
            known = ", ".join(sorted(request.backends)) or "none"
            raise UnknownBackend(f"spec.backend.cluster: no PlntBackend named {cluster!r} (known: {known})")
        backend = PlntBackend.model_validate(request.backends[cluster])
        gpu_class = run.spec.backend.gpu_class
        if gpu_class is not None and gpu_class not in backend.spec.gpu_classes:
            offered = ", ".join(backend.spec.gpu_classes) or "no GPU classes"
            raise GpuClassUnavailable(f"spec.backend.gpuClass: backend {cluster!r} offers {offered}, not {gpu_class!r}")
        if backend.spec.type not in self._backend_types:
            raise UnknownBackend(
                f"backend {cluster!r} is of type {backend.spec.type}; this plnt deploys to "
                f"{', '.join(self._backend_types)} backends"
            )
        return ValidatedSpec(backend_type=backend.spec.type, version=run.spec.workflow.version)

    @activity.defn(name="pull_recipe")
    @_boundary
    async def pull_recipe(self, request: PullInput) -> PulledRecipeInfo:
        run = WorkflowRun.model_validate(request.spec)
        policies = [RecipeTrustPolicy.model_validate(doc) for doc in request.trust_policies.values()]
        transferred = 0

        def progress(done: int) -> None:  # called from the pulling thread
            nonlocal transferred
            transferred = done

        pulled = await _with_heartbeats(asyncio.to_thread(
            pull_recipe, run.spec.workflow, commit=request.commit, cache=self._cache, policies=policies,
            read_from_repo=self._read, export_from_repo=self._export, registry_options=self._registry_options,
            limits=self._limits, progress=progress,
        ), details=lambda: transferred)
        recipe = await asyncio.to_thread(load_recipe_dir, pulled.directory)
        check_requirements(recipe.workflow.requirements, run.spec.backend, recipe=run.spec.workflow.ref)
        return PulledRecipeInfo(directory=str(pulled.directory), digest=pulled.digest, version=pulled.version,
                                signer=f"{pulled.signature.identity} ({pulled.signature.issuer})",
                                transferred_bytes=pulled.transferred_bytes)

    @activity.defn(name="install_release")
    @_boundary
    async def install_release(self, request: InstallInput) -> Release:
        return await _with_heartbeats(self._driver.install(InstallRequest(
            namespace=request.namespace, name=request.name, track=request.track, version=request.version,
            spec_fingerprint=request.fingerprint, recipe_digest=request.recipe_digest,
            recipe_dir=request.recipe_dir, traffic_percent=request.traffic_percent,
        )))

    @activity.defn(name="smoke_test")
    @_boundary
    async def smoke_test(self, request: SmokeInput) -> SmokeResult:
        run = WorkflowRun.model_validate(request.spec)
        budget = run.spec.canary.smoke_test
        cases = await asyncio.to_thread(load_golden, Path(request.recipe_dir))
        samples = await _with_heartbeats(measure(
            request.endpoint, [case.input for case in cases],
            invocations=budget.invocations, concurrency=budget.concurrency, timeout_s=self._smoke_timeout_s,
            # Streamed when a TTFT or TPOT budget is set, so the tokens can be timed.
            stream=budget.ttft_budget_ms is not None or budget.tpot_budget_ms is not None,
        ))
        return judge(summarise(samples), budget)

    @activity.defn(name="promote_release")
    @_boundary
    async def promote_release(self, request: ReleaseRef) -> Release:
        return await _with_heartbeats(self._driver.promote(request.namespace, request.name))

    @activity.defn(name="remove_release")
    @_boundary
    async def remove_release(self, request: ReleaseRef) -> None:
        await _with_heartbeats(self._driver.remove(request.namespace, request.name, request.track))
