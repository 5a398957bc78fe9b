"""Saga activities: the only code that touches the outside world during a deploy.

Each is idempotent (a retried activity finds its own earlier work) and maps plnt's errors at the
boundary: NeedsHuman becomes a non-retryable ApplicationError named after the error class.

Their inputs are not trusted: anyone who reaches the Temporal namespace can start a DeploySaga or
schedule an activity on plnt's task queue. Each activity takes a SagaRef (a WorkflowRun at a commit)
and reads what decides trust from plnt's own clone (`CommitSpecs`): the spec, its backend and the
trust policies at that commit; the recipe directory from plnt's verified cache; the smoke-test
endpoint from the driver's own canary record. Recipe code is never imported here: a recipe is
checked as data, and only its runner process imports it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

from plnt.core.recipe import RecipeError, load_golden
from plnt.core.specs.models import (
    BackendPlacement,
    Deployable,
    ModelDeployment,
    RecipeTrustPolicy,
    Requirements,
    WorkflowRun,
    run_key,
)
from plnt.core.status import Phase, RolloutMark
from plnt.reconciler.drivers.model_runtime import gguf_file
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust, ReleaseDriver
from plnt.reconciler.errors import (
    GpuClassUnavailable,
    InvalidRecipe,
    InvalidSpec,
    ModelNotServing,
    NeedsHuman,
    PlntError,
    RetryLater,
    UnknownBackend,
    UntrustedSagaInput,
)
from plnt.reconciler.recipes.archive import ExtractLimits
from plnt.reconciler.recipes.pull import ExportFromRepo, ReadFromRepo, RecipeCache, pull_recipe
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.recipes.trust import policies_for, verify_weights_signature
from plnt.reconciler.recipes.weights import WeightsStore
from plnt.reconciler.saga import progress as saga_progress
from plnt.reconciler.saga.commit_specs import CommitSpecs, TrustedSaga
from plnt.reconciler.saga.io import (
    InstallInput,
    PhaseUpdate,
    PulledRecipeInfo,
    PullInput,
    ReleaseRef,
    SagaRef,
    SmokeInput,
    ValidatedSpec,
    ValidateInput,
    recipe_inputs,
    saga_workflow_id,
)
from plnt.reconciler.saga.smoke import Sample, SmokeResult, judge, measure, progress_of, summarise
from plnt.reconciler.state import LiveWorkflow, ModelServing, Release
from plnt.reconciler.status_store import StatusStore
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

T = TypeVar("T")
log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 1.0
MODEL_WAIT_POLL_S = 0.5
PULLED_KEPT_S = 3600.0  # weights pulled but not installed (a saga between its steps) are not collected for this long  # a bound WorkflowRun's smoke test waits for its model's promotion this often
TRUSTED_RUNS_KEPT = 4096  # saga runs whose task queue was checked, kept (oldest dropped first)
# The SDK sends heartbeats on to Temporal at most this often (its default: 80% of the 10 s heartbeat
# timeout): their details are a running smoke test's live numbers (status smokeProgress, the forge status).
HEARTBEAT_THROTTLE = timedelta(seconds=2)


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


def _on_kubernetes(trusted: TrustedSaga) -> bool:
    return trusted.backend is not None and trusted.backend.spec.type == "kubernetes"


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


class PhaseRecorder:
    """The saga's status writes. Runs where the status lives: beside the DeploySaga workflow (in
    `plnt up`, or in `plnt reconcile` when the roles run apart), never on a worker.

    A saga's outcome comes as the `record_phase` local activity, and is on disk when it returns; its
    progress on the way comes from the saga's own code through `saga_progress`, written behind.
    """

    def __init__(self, statuses: StatusStore) -> None:
        self._statuses = statuses

    @activity.defn(name="record_phase")
    @_boundary
    async def record_phase(self, update: PhaseUpdate) -> None:
        # Only DeploySaga's own code (running on plnt's worker) may write status: it calls this as a
        # local activity, which nobody else can schedule on plnt's worker.
        if not activity.info().is_local:
            raise UntrustedSagaInput("record_phase runs only as a local activity of plnt's own DeploySaga")
        if update.phase is None:
            self._statuses.remove(update.namespace, update.name)
            return
        await self._statuses.record(update.namespace, update.name, **self._fields(update))

    def report_progress(self, namespace: str, task_queue: str) -> Callable[[], Awaitable[None]]:
        """Sagas of this process on `task_queue` write their progress here; returns the unregister call.
        On the event loop: the writes are made on it."""
        return saga_progress.register(namespace, task_queue, self._progress, asyncio.get_running_loop())

    def _progress(self, update: PhaseUpdate) -> None:
        if update.phase is not None:
            self._statuses.update_nowait(update.namespace, update.name, **self._fields(update))

    @staticmethod
    def _fields(update: PhaseUpdate) -> dict[str, Any]:
        assert update.phase is not None
        fields = dict(update.fields)
        if update.commit is not None:
            fields["observed_commit"] = update.commit
            # The rollout's own record: only this saga writes it (rollout statuses and notes follow it).
            fields["rollout"] = RolloutMark(commit=update.commit, phase=update.phase, message=update.message,
                                            at=time.time())
        if update.saga_id is not None:
            fields["saga_id"] = update.saga_id
        return {**fields, "phase": update.phase, "message": update.message}


class SagaActivities:
    def __init__(
        self,
        *,
        driver: ReleaseDriver,
        statuses: StatusStore | None,
        commit_specs: CommitSpecs,
        export_from_repo: ExportFromRepo,
        read_from_repo: ReadFromRepo,
        recipe_cache: Path,
        registry_options: RegistryOptions = RegistryOptions(),
        limits: ExtractLimits = ExtractLimits(),
        smoke_request_timeout_s: float = 30.0,
        supported_backend_types: tuple[str, ...] = ("local",),
        saga_task_queue: str | None,
        weights: WeightsStore | None = None,
    ) -> None:
        """`weights`: where ModelDeployments' verified weights are kept (None: this plnt deploys none).
        `saga_task_queue`: the queue plnt's DeploySaga runs on; an activity scheduled by any other
        workflow is refused. None skips that check: only for tests that run an activity outside any workflow."""
        self._driver = driver
        # None on a worker of split roles: the reconciler records phases (PhaseRecorder).
        self._recorder = PhaseRecorder(statuses) if statuses is not None else None
        self._statuses = statuses
        self._specs = commit_specs
        self._export = export_from_repo
        self._read = read_from_repo
        self._cache = RecipeCache(recipe_cache)
        self._registry_options = registry_options
        self._limits = limits
        self._smoke_timeout_s = smoke_request_timeout_s
        self._backend_types = supported_backend_types
        self._saga_task_queue = saga_task_queue
        self._weights = weights
        self._weights_lock = asyncio.Lock()  # one pull (or collection) at a time: canary and stable share blobs
        # Weights pulled and not yet installed (root digest -> when): kept from collection a while.
        self._pulled: dict[str, float] = {}
        # Saga runs (workflow id, run id) found on plnt's task queue: one describe per saga, not one
        # per step (each is a Temporal round trip; 5 per saga were measured in bench/saga_profile.py).
        self._trusted_runs: dict[tuple[str, str], None] = {}

    def all(self) -> list[Callable[..., Any]]:
        """Every activity of the saga, for `plnt up` (one worker runs the saga and all its steps)."""
        if self._recorder is None:
            raise ValueError("SagaActivities without a status store has no record_phase: use remote()")
        return [self._recorder.record_phase, *self.remote()]

    def remote(self) -> list[Callable[..., Any]]:
        """The steps a `plnt worker` runs: all but record_phase (a local activity of the saga)."""
        return [self.validate, self.pull_recipe, self.install_release, self.smoke_test, self.promote_release,
                self.remove_release]

    @property
    def recorder(self) -> PhaseRecorder:
        if self._recorder is None:
            raise AttributeError("the status writes run beside the saga (PhaseRecorder), not on this worker")
        return self._recorder

    @property
    def record_phase(self) -> Callable[[PhaseUpdate], Awaitable[None]]:
        if self._recorder is None:
            raise AttributeError("record_phase runs beside the saga (PhaseRecorder), not on this worker")
        return self._recorder.record_phase

    async def _check_caller(self, ref: SagaRef) -> None:
        """Only plnt's own DeploySaga for this WorkflowRun, running on plnt's task queue, may call.

        Temporal lets any workflow in the namespace schedule an activity on any task queue; the
        workflow type and id come from the server, and its task queue from describing it.
        """
        if self._saga_task_queue is None:
            return
        info = activity.info()
        expected = saga_workflow_id(ref.namespace, ref.name)
        if info.workflow_type != "DeploySaga" or info.workflow_id != expected:
            raise UntrustedSagaInput(f"{info.activity_type} for {ref.key} runs only in plnt's DeploySaga {expected}, "
                                     f"not in workflow {info.workflow_type} {info.workflow_id}")
        run = (info.workflow_id, info.workflow_run_id)
        if run in self._trusted_runs:
            return  # this very run was described already: a run's task queue never changes
        try:
            caller = await activity.client().get_workflow_handle(info.workflow_id, run_id=info.workflow_run_id).describe()
        except RPCError as exc:
            raise RetryLater(f"cannot describe the workflow {info.workflow_id} that scheduled {info.activity_type}: "
                             f"{exc.message}") from exc
        if caller.task_queue != self._saga_task_queue:
            raise UntrustedSagaInput(f"{info.activity_type} for {ref.key}: workflow {info.workflow_id} runs on task queue "
                                     f"{caller.task_queue!r}, not plnt's {self._saga_task_queue!r}")
        self._trusted_runs[run] = None
        if len(self._trusted_runs) > TRUSTED_RUNS_KEPT:
            del self._trusted_runs[next(iter(self._trusted_runs))]  # the oldest: its saga is long over

    async def _deploy(self, ref: SagaRef) -> tuple[TrustedSaga, Deployable]:
        """The saga's WorkflowRun as its commit gives it, or UntrustedSagaInput."""
        await self._check_caller(ref)
        if ref.action != "deploy":
            raise UntrustedSagaInput(f"{activity.info().activity_type} is a deploy step; this saga is an {ref.action}")
        trusted = await self._specs.resolve(ref)
        assert trusted.run is not None
        remember = getattr(self._driver, "remember", None)
        if remember is not None and trusted.backend is not None:
            remember(trusted.run, trusted.backend)  # a worker learns each WorkflowRun's backend from its commit
        return trusted, trusted.run

    @activity.defn(name="validate")
    @_boundary
    async def validate(self, request: ValidateInput) -> ValidatedSpec:
        trusted, run = await self._deploy(request.saga)
        cluster = run.spec.backend.cluster
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
        return ValidatedSpec(backend_type=backend.spec.type, version=run.version,
                             traffic_percent=run.spec.canary.traffic_percent,
                             spec=run.spec.model_dump(mode="json", by_alias=True))

    @activity.defn(name="pull_recipe")
    @_boundary
    async def pull_recipe(self, request: PullInput) -> PulledRecipeInfo:
        trusted, run = await self._deploy(request.saga)
        if isinstance(run, ModelDeployment):
            return await self._pull_weights(trusted, run)
        transferred = 0

        def progress(done: int) -> None:  # called from the pulling thread
            nonlocal transferred
            transferred = done

        pulled = await _with_heartbeats(asyncio.to_thread(
            pull_recipe, run.spec.workflow, commit=request.saga.commit, cache=self._cache, policies=trusted.policies,
            read_from_repo=self._read, export_from_repo=self._export, registry_options=self._registry_options,
            limits=self._limits, progress=progress, policy_commit=trusted.policy_commit,
        ), details=lambda: transferred)
        check_requirements(pulled.workflow.requirements, run.spec.backend, recipe=run.spec.workflow.ref)
        return PulledRecipeInfo(digest=pulled.digest, version=pulled.version,
                                signer=f"{pulled.signature.identity} ({pulled.signature.issuer})",
                                transferred_bytes=pulled.transferred_bytes, inputs=recipe_inputs(pulled.workflow))

    async def _pull_weights(self, trusted: TrustedSaga, run: ModelDeployment) -> PulledRecipeInfo:
        """The model's signed manifest verified (the policies at the saga's commit, the spec's pin),
        then every file fetched into the weights store, hashed as it streams. On a Kubernetes backend
        only the manifest (see below)."""
        source, verify = self._weights_check(trusted, run)
        if _on_kubernetes(trusted):
            # Decision: on Kubernetes the files are NOT downloaded into plnt's store. The pod's init
            # container (`plnt model fetch`) fetches them into its own volume and checks every file
            # against this same signed manifest and pin, with the same policies; a copy here would
            # never be served, would cost a transfer of the whole model (GPU-sized models are tens to
            # hundreds of GB) and plnt's disk budget, and would make the pod's copy no more trusted.
            # What must happen before any pod starts does happen here, fail closed: the signature is
            # verified against the policies at the saga's commit and the manifest against the spec's
            # root-digest pin (install_release verifies it again). A file missing or altered in the
            # registry is the init container's to catch: the pod never serves, the canary is removed.
            verified = await _with_heartbeats(asyncio.to_thread(lambda: verify(source.signature())))
            return PulledRecipeInfo(digest=verified.manifest.root_digest, version=run.spec.model.version,
                                    signer=f"{verified.signature.identity} ({verified.signature.issuer})",
                                    transferred_bytes=0)
        assert self._weights is not None  # validate refused a ModelDeployment without a store
        transferred = 0

        def progress(done: int) -> None:  # called from the pulling thread
            nonlocal transferred
            transferred = done

        async def pull() -> Any:
            async with self._weights_lock:
                return await asyncio.to_thread(self._weights.pull, source, verify, progress=progress)  # type: ignore[union-attr]

        pulled = await _with_heartbeats(pull(), details=lambda: transferred)
        self._pulled[pulled.root_digest] = time.monotonic()
        return PulledRecipeInfo(digest=pulled.root_digest, version=run.spec.model.version, signer=pulled.signer,
                                transferred_bytes=pulled.transferred_bytes)

    def _model_policies(self, trusted: TrustedSaga, run: ModelDeployment) -> list[RecipeTrustPolicy]:
        """The policies the model's weights are verified with: the one spec.model.trustPolicy names,
        else those covering the model's name; from the saga's commit."""
        model = run.spec.model
        if model.trust_policy is not None:
            return [p for p in trusted.policies if p.metadata.name == model.trust_policy]
        return policies_for(model.name, trusted.policies)

    def _weights_check(self, trusted: TrustedSaga, run: ModelDeployment) -> tuple[Any, Callable[[bytes | None], Any]]:
        """Where the model's weights are published, and the check of their signature bundle (the
        model's policies, their trusted roots read from the saga's commit, the spec's pin)."""
        from plnt.reconciler.recipes.weights_sources import (
            open_weights_source,  # (boto3/oras clients load only when models are used)
        )

        model = run.spec.model
        policies = self._model_policies(trusted, run)
        commit = trusted.policy_commit or trusted.ref.commit
        try:
            source = open_weights_source(model.registry, model.name, model.version, self._registry_options)
        except ValueError:  # a relative file: URL (inside the spec repository)
            raise InvalidSpec(f"spec.model.registry: {model.registry!r}: weights are not kept in the spec repository; "
                              "publish them to file:///ABSOLUTE/DIR (with --allow-file-registry), s3:// or oci:// "
                              "(plnt model push)") from None

        def verify(bundle: bytes | None) -> Any:
            return verify_weights_signature(bundle, model=model.name, policies=policies, pin=model.root_digest,
                                            load_trusted_root=lambda path: self._read(commit, path))

        return source, verify

    def _verified_weights(self, run: ModelDeployment, digest: str) -> Path:
        """The store's verified model directory for what the spec pins (pull_recipe assembled it)."""
        if self._weights is None or digest != run.spec.model.root_digest:
            raise UntrustedSagaInput(f"weights {digest} are not what {run.key} pins ({run.spec.model.root_digest})")
        directory = self._weights.model_dir(digest)
        if not directory.is_dir():
            raise UntrustedSagaInput(f"weights {digest} of {run.key} are not in plnt's store: pull_recipe must "
                                     "verify them first")
        return directory

    def _verified_recipe(self, run: WorkflowRun, digest: str) -> Path:
        """The recipe directory of plnt's own verified cache entry for what the run names."""
        source = run.spec.workflow
        entry = self._cache.lookup(source.registry, source.name, source.version)
        if entry is None or f"sha256:{entry.name}" != digest:
            raise UntrustedSagaInput(f"recipe {digest} is not plnt's verified copy of {source.ref} from "
                                     f"{source.registry}: pull_recipe must verify it first")
        return entry / "recipe"

    @activity.defn(name="install_release")
    @_boundary
    async def install_release(self, request: InstallInput) -> Release:
        trusted, run = await self._deploy(request.saga)
        if request.track != "canary":
            raise UntrustedSagaInput("a saga installs a canary; only promote_release makes a stable release")
        if isinstance(run, ModelDeployment):
            return await self._install_model(trusted, run, request.recipe_digest)
        recipe_dir = self._verified_recipe(run, request.recipe_digest)
        trust = await asyncio.to_thread(self._recipe_trust, trusted, run)
        return await _with_heartbeats(self._driver.install(InstallRequest(
            namespace=run.metadata.namespace, name=run.metadata.name, track="canary",
            version=run.spec.workflow.version, spec_fingerprint=run.fingerprint(), recipe_digest=request.recipe_digest,
            recipe_dir=str(recipe_dir), traffic_percent=run.spec.canary.traffic_percent, trust=trust,
            llm_model=f"{run.metadata.namespace}/{run.spec.model}" if run.spec.model else None,
        )))

    async def _install_model(self, trusted: TrustedSaga, run: ModelDeployment, digest: str) -> Release:
        """The canary of a model: served from plnt's verified store directory (local), or by a pod that
        fetches the weights itself (Kubernetes), its manifest verified again here (the file llama.cpp
        loads is named from it) and the trust it was verified with handed to the pod."""
        runtime, model = run.spec.runtime, run.spec.model
        trust = await asyncio.to_thread(RecipeTrust.of, self._model_policies(trusted, run),
                                        functools.partial(self._read, trusted.policy_commit or trusted.ref.commit))
        if _on_kubernetes(trusted):
            if digest != model.root_digest:
                raise UntrustedSagaInput(f"weights {digest} are not what {run.key} pins ({model.root_digest})")
            source, verify = self._weights_check(trusted, run)
            verified = await _with_heartbeats(asyncio.to_thread(lambda: verify(source.signature())))
            model_file, recipe_dir = "", ""  # no copy of plnt's: the pod fetches into its own volume
            if runtime.type == "llama.cpp":
                ggufs = [item.name for item in verified.manifest.files if item.name.endswith(".gguf")]
                if len(ggufs) != 1:
                    raise InvalidSpec(f"a llama.cpp model holds exactly one .gguf file; the signed manifest of "
                                      f"{model.name}@{model.version} lists {len(ggufs)}")
                model_file = ggufs[0]
        else:
            directory = self._verified_weights(run, digest)
            model_file = str((await asyncio.to_thread(gguf_file, directory)).relative_to(directory))
            recipe_dir = str(directory)
        release = await _with_heartbeats(self._driver.install(InstallRequest(
            namespace=run.metadata.namespace, name=run.metadata.name, track="canary", version=run.version,
            spec_fingerprint=run.fingerprint(), recipe_digest=digest, recipe_dir=recipe_dir,
            traffic_percent=run.spec.canary.traffic_percent, trust=trust,
            model=ModelServing(runtime=runtime.type, model_file=model_file, alias=run.metadata.name,
                               context_length=runtime.context_length, threads=runtime.threads,
                               args=tuple(runtime.args), registry=model.registry, model_name=model.name,
                               memory_mib=runtime.resources.memory_mi_b if runtime.resources else None),
        )))
        self._pulled.pop(digest, None)  # the release record references them from here on
        return release

    def _recipe_trust(self, trusted: TrustedSaga, run: WorkflowRun) -> RecipeTrust:
        """The policies covering the recipe and their trusted roots, from the saga's commit: what
        pull_recipe verified with, for runners that verify the recipe themselves (Kubernetes pods)."""
        covering = tuple(policies_for(run.spec.workflow.name, trusted.policies))
        paths = sorted({p.spec.trust_root.trusted_root_file for p in covering if p.spec.trust_root.trusted_root_file})
        return RecipeTrust(policies=covering, trusted_roots={
            path: self._read(trusted.policy_commit or trusted.ref.commit, path).decode("utf-8") for path in paths})

    async def _live_of(self, run: Deployable) -> LiveWorkflow | None:
        return await self._live(run.metadata.namespace, run.metadata.name)

    async def _live(self, namespace: str, name: str) -> LiveWorkflow | None:
        live_of = getattr(self._driver, "live_of", None)  # a DriverSet: one record, not all of them
        if live_of is not None:
            found: LiveWorkflow | None = await live_of(namespace, name)
            return found
        return (await self._driver.live()).get(run_key(namespace, name))

    async def _model_promoted(self, namespace: str, model: str) -> None:
        """A WorkflowRun bound to a model is smoke-tested once that model serves (its first rollout
        may run beside this one): until then its LLM calls would get 503s. A model whose rollout
        ended without a promoted release fails this at once, naming why."""
        while (live := await self._live(namespace, model)) is None or live.stable is None:
            status = self._statuses.get(run_key(namespace, model)) if self._statuses is not None else None
            if status is not None and status.phase in (Phase.ROLLED_BACK, Phase.FAILED):
                raise ModelNotServing(
                    f"spec.model: ModelDeployment {namespace}/{model} has no promoted release (its rollout ended "
                    f"{status.phase.value}: {status.last_error or status.message}); fix it, then commit a change to "
                    "this WorkflowRun to try again")
            await asyncio.sleep(MODEL_WAIT_POLL_S)

    async def _release_of(self, run: Deployable, track: str) -> Release:
        """The driver's own record of this run's release on `track`, made for this very spec."""
        live = await self._live_of(run)
        release: Release | None = getattr(live, track) if live is not None else None
        if release is None or release.spec_fingerprint != run.fingerprint():
            raise UntrustedSagaInput(f"{run.key} has no {track} release of fingerprint {run.fingerprint()} "
                                     f"(version {run.version}): nothing this saga installed")
        return release

    @activity.defn(name="smoke_test")
    @_boundary
    async def smoke_test(self, request: SmokeInput) -> SmokeResult:
        _, run = await self._deploy(request.saga)
        canary = await self._release_of(run, "canary")
        wake = getattr(self._driver, "wake", None)  # a canary that parked (scale to zero) since its install
        if wake is not None and (woken := await wake(run.metadata.namespace, run.metadata.name,
                                                     canary.release_id)) is not None:
            canary = woken
        budget = run.spec.canary.smoke_test
        if isinstance(run, WorkflowRun) and run.spec.model is not None:
            await _with_heartbeats(self._model_promoted(run.metadata.namespace, run.spec.model))
        done: list[Sample] = []  # heartbeats carry the numbers so far: the reconciler shows them live
        if isinstance(run, ModelDeployment):
            canary_spec = run.spec.canary
            chats = [{"model": run.metadata.name, "max_tokens": canary_spec.max_tokens, "temperature": 0,
                      "messages": [{"role": "user", "content": prompt}]} for prompt in canary_spec.prompts]
            samples = await _with_heartbeats(measure(
                canary.endpoint, chats, invocations=budget.invocations, concurrency=budget.concurrency,
                timeout_s=self._smoke_timeout_s, samples=done, protocol="openai-chat",
            ), details=lambda: progress_of(done, budget.invocations))
            return judge(summarise(samples), budget)
        recipe_dir = self._verified_recipe(run, canary.recipe_digest)
        try:
            cases = await asyncio.to_thread(load_golden, recipe_dir)  # data: golden.yaml, bounded YAML
        except RecipeError as exc:
            raise InvalidRecipe(f"recipe {run.spec.workflow.ref}: {exc.problem}") from exc
        samples = await _with_heartbeats(measure(
            canary.endpoint, [case.input for case in cases],
            invocations=budget.invocations, concurrency=budget.concurrency, timeout_s=self._smoke_timeout_s,
            # Streamed when a TTFT or TPOT budget is set, so the tokens can be timed.
            stream=budget.ttft_budget_ms is not None or budget.tpot_budget_ms is not None, samples=done,
        ), details=lambda: progress_of(done, budget.invocations))
        return judge(summarise(samples), budget)

    @activity.defn(name="promote_release")
    @_boundary
    async def promote_release(self, request: ReleaseRef) -> Release:
        _, run = await self._deploy(request.saga)
        live = await self._live_of(run)
        # A retried promote finds its own work: the stable release is already the one this saga made.
        promoted = live is not None and live.canary is None and live.stable is not None \
            and live.stable.spec_fingerprint == run.fingerprint()
        if not promoted:
            await self._release_of(run, "canary")
        stable = await _with_heartbeats(self._driver.promote(run.metadata.namespace, run.metadata.name))
        if isinstance(run, ModelDeployment):
            await self._collect_weights()  # the previous stable's weights, if nothing else uses them
        return stable

    async def _collect_weights(self) -> None:
        """Removes from the store the weights no model release references (nor a pull not yet
        installed): after a promotion (the old stable's) or a removal (a rolled-back canary's)."""
        if self._weights is None or not await asyncio.to_thread(self._weights.holds_anything):
            return  # every removal of 1,000 WorkflowRuns would read the live state (Helm: helm list) for nothing
        now = time.monotonic()
        self._pulled = {digest: at for digest, at in self._pulled.items() if now - at < PULLED_KEPT_S}
        try:
            keep = {release.recipe_digest for live in (await self._driver.live()).values()
                    for release in (live.stable, live.canary) if release is not None and release.model is not None}
            keep |= set(self._pulled)
            async with self._weights_lock:
                removed = await asyncio.to_thread(self._weights.collect, keep)
        except (OSError, PlntError) as exc:  # the next promotion or removal collects again; the step succeeded
            log.warning("weights-collect-failed error=%s", exc)
            return
        if removed:
            log.info("weights-collected models=%s (no release references them)", ",".join(removed))

    @activity.defn(name="remove_release")
    @_boundary
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
                await _with_heartbeats(self._driver.remove_anywhere(  # type: ignore[attr-defined]
                    ref.namespace, ref.name, request.track, trusted.backends))
                return
        await _with_heartbeats(self._driver.remove(ref.namespace, ref.name, request.track))
